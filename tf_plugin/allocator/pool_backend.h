// PoolBackend: where the StreamAwarePool's arena comes from and what "sync"
// means. The pool core talks only to this interface, so the same algorithm can
// run on host memory (this project's emulated device, see DESIGN.md) or on a
// CUDA arena whose Synchronize() waits on real streams and events.
//
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_
#define TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_

#include <cstddef>
#include <memory>
#include <string>

namespace tensile {

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  // Reserves `bytes` of arena memory, aligned to at least 4096 bytes.
  // Returns nullptr if the memory cannot be reserved.
  virtual void* Reserve(size_t bytes) = 0;
  // Gives back what Reserve returned.
  virtual void Release(void* base, size_t bytes) = 0;
  // Waits until every stream's outstanding work has finished, so that chunks
  // freed by any stream may be handed to any other (Waterwave Listing 1,
  // SyncAndCoalesce).
  virtual void SynchronizeAllStreams() = 0;
  virtual std::string Name() const = 0;
};

// Host memory: the arena is one mmap'ed region (pages are touched lazily, so
// a large pool costs nothing until used). CPU kernels have finished with a
// buffer when TensorFlow frees it, so synchronizing streams is a no-op; the
// pool still keeps the synced / unsynced bookkeeping so the algorithm is the
// one a GPU backend would run.
class HostBackend : public PoolBackend {
 public:
  void* Reserve(size_t bytes) override;
  void Release(void* base, size_t bytes) override;
  void SynchronizeAllStreams() override {}
  std::string Name() const override { return "host"; }
};

std::unique_ptr<PoolBackend> MakeBackend(const std::string& name);

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_POOL_BACKEND_H_
