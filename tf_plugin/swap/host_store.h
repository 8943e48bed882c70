// HostStore: the host tier that holds swapped-out tensors (seed 000 §III-C).
// It lives OUTSIDE the device pool: a swap-out moves bytes out of the pool
// into here, a swap-in copies them back into a fresh pool allocation.
//
// Policy:
//  1. Accounted and bounded: `capacity` bytes at most are held at once. A put
//     that would exceed it fails with a message that says how much was asked,
//     how much is held and what to do; nothing is evicted.
//  2. An activation's entry is reference counted by its planned swap-ins:
//     "it will remain in the Host Memory until the last access of the tensor
//     is finished" (§III-C). The last swap-in frees it.
//  3. A variable's entry (parameters, optimizer slots swapped across
//     iterations) is keyed by the variable's resource name, one per variable;
//     a newer copy replaces the older.
//  4. Every entry records the pool stream (job) that put it, so a job that
//     fails between a swap-out and its swap-ins can drop its entries.
//  5. Buffers are reused, as a GPU runtime reuses its pinned host buffers: a
//     freed entry's buffer goes to a cache keyed by its size (rounded up to
//     a page), and the next reservation of that size takes it, already
//     touched. Activations repeat their sizes every step, so nearly every
//     swap-out after the first step hits. Cached bytes are not held bytes
//     (capacity bounds what entries hold); the cache keeps at most
//     `cache_limit` bytes (TENSILE_HOST_CACHE_BYTES, default 2 GiB) and frees
//     the rest. Measured without it (two planned Transformer jobs): a
//     swap-out of 1 MiB took 0.9 ms, the kernel faulting in and zeroing a
//     fresh buffer, against 0.1 ms for a swap-in into warm pool memory; a
//     burst of 20 swap-outs then held 15 MiB in the pool for 18 ms.
//
// Thread safe: one mutex. No TensorFlow in this file.
#ifndef TF_PLUGIN_SWAP_HOST_STORE_H_
#define TF_PLUGIN_SWAP_HOST_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tf_plugin/thread_annotations.h"

namespace tensile {

// Byte counters (the pool's vocabulary).
struct HostStoreStats {
  int64_t capacity = 0;
  int64_t current = 0;    // bytes held now
  int64_t peak = 0;
  int64_t allocated = 0;  // bytes put, cumulative
  int64_t freed = 0;
  int64_t num_puts = 0;
  int64_t num_frees = 0;
  int64_t num_rejected = 0;  // puts refused for lack of capacity
  int64_t num_entries = 0;
  int64_t cached = 0;         // bytes of free buffers kept for reuse (policy 5)
  int64_t cache_hits = 0;     // reservations served by a cached buffer
  int64_t cache_misses = 0;   // reservations that allocated a new one
};

class HostStore;

// Gives an entry's buffer back to its store's cache (policy 5).
struct HostBufferReturn {
  HostStore* store = nullptr;
  size_t capacity = 0;  // the buffer's size (a size class)
  void operator()(char* buffer) const;
};

// One host copy: bytes plus what is needed to rebuild the tensor.
struct HostEntry {
  std::unique_ptr<char[], HostBufferReturn> data;
  size_t bytes = 0;
  int dtype = 0;                 // TensorFlow DataType enum value
  std::vector<int64_t> shape;
  int refs = 0;                  // swap-ins still to come (activations)
  int32_t stream = 0;            // job that put it
  std::string label;             // tensor / variable name, for messages
};

class HostStore {
 public:
  explicit HostStore(size_t capacity, size_t cache_limit = kDefaultHostCacheBytes)
      : capacity_(capacity), cache_limit_(cache_limit) {}
  ~HostStore();
  static constexpr size_t kDefaultHostCacheBytes = size_t{2} << 30;

  // Reserves `bytes` for a new entry. Returns nullptr and sets *error when
  // the store cannot hold it.
  std::shared_ptr<HostEntry> Reserve(size_t bytes, const std::string& label,
                                     std::string* error);
  // Gives back an entry reserved with Reserve but never inserted.
  void Unreserve(const std::shared_ptr<HostEntry>& entry);

  // Activations: insert under a fresh handle / take one reference.
  void Insert(int64_t handle, std::shared_ptr<HostEntry> entry);
  // The entry for `handle`, dropping one reference (freed at zero).
  // nullptr if unknown.
  std::shared_ptr<HostEntry> Acquire(int64_t handle);

  // Variables: the current host copy of variable `key` (nullptr if none).
  void PutVariable(const std::string& key, std::shared_ptr<HostEntry> entry);
  std::shared_ptr<HostEntry> GetVariable(const std::string& key);
  void DropVariable(const std::string& key);
  bool HasVariable(const std::string& key);

  // Drops every entry `stream` put (after a failed step); returns bytes freed.
  int64_t ReleaseStream(int32_t stream);
  void SetCapacity(size_t capacity);
  // Frees every cached buffer beyond `cache_limit` bytes from now on.
  void SetCacheLimit(size_t cache_limit);
  HostStoreStats Stats();
  void ResetPeak();

 private:
  friend struct HostBufferReturn;
  void FreeLocked(const HostEntry& e) TENSILE_REQUIRES(mu_);
  // Policy 5: a buffer of `capacity` bytes, cached or new.
  char* TakeBuffer(size_t capacity) TENSILE_EXCLUDES(cache_mu_);
  void ReturnBuffer(char* buffer, size_t capacity) TENSILE_EXCLUDES(cache_mu_);
  void TrimCacheLocked() TENSILE_REQUIRES(cache_mu_);

  // cache_mu_ is never taken before mu_: an entry can die (and return its
  // buffer) while mu_ is held.
  Mutex cache_mu_;
  size_t cache_limit_ TENSILE_GUARDED_BY(cache_mu_);
  std::unordered_map<size_t, std::vector<char*>> cache_ TENSILE_GUARDED_BY(cache_mu_);
  int64_t cached_bytes_ TENSILE_GUARDED_BY(cache_mu_) = 0;
  int64_t cache_hits_ TENSILE_GUARDED_BY(cache_mu_) = 0;
  int64_t cache_misses_ TENSILE_GUARDED_BY(cache_mu_) = 0;

  Mutex mu_;
  size_t capacity_ TENSILE_GUARDED_BY(mu_);
  HostStoreStats stats_ TENSILE_GUARDED_BY(mu_);
  std::unordered_map<int64_t, std::shared_ptr<HostEntry>> activations_ TENSILE_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::shared_ptr<HostEntry>> variables_ TENSILE_GUARDED_BY(mu_);
};

// The process-wide store. Capacity: TENSILE_HOST_BYTES, else 16 GiB.
HostStore& GetHostStore();
constexpr size_t kDefaultHostStoreBytes = size_t{16} << 30;

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_HOST_STORE_H_
