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
};

// One host copy: bytes plus what is needed to rebuild the tensor.
struct HostEntry {
  std::unique_ptr<char[]> data;
  size_t bytes = 0;
  int dtype = 0;                 // TensorFlow DataType enum value
  std::vector<int64_t> shape;
  int refs = 0;                  // swap-ins still to come (activations)
  int32_t stream = 0;            // job that put it
  std::string label;             // tensor / variable name, for messages
};

class HostStore {
 public:
  explicit HostStore(size_t capacity) : capacity_(capacity) {}

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
  HostStoreStats Stats();
  void ResetPeak();

 private:
  void FreeLocked(const HostEntry& e);

  std::mutex mu_;
  size_t capacity_;
  HostStoreStats stats_;
  std::unordered_map<int64_t, std::shared_ptr<HostEntry>> activations_;
  std::unordered_map<std::string, std::shared_ptr<HostEntry>> variables_;
};

// The process-wide store. Capacity: TENSILE_HOST_BYTES, else 16 GiB.
HostStore& GetHostStore();
constexpr size_t kDefaultHostStoreBytes = size_t{16} << 30;

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_HOST_STORE_H_
