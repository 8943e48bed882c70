#include "tf_plugin/swap/host_store.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "tf_plugin/allocator/stream_aware_pool.h"  // HumanBytes
#include "tf_plugin/plugin_settings.h"

namespace tensile {

namespace {
constexpr size_t kHostPageBytes = 4096;
size_t SizeClass(size_t bytes) {
  return std::max<size_t>(1, (bytes + kHostPageBytes - 1) / kHostPageBytes) * kHostPageBytes;
}
}  // namespace

void HostBufferReturn::operator()(char* buffer) const {
  if (buffer == nullptr) return;
  if (store == nullptr) {
    delete[] buffer;
    return;
  }
  store->ReturnBuffer(buffer, capacity);
}

HostStore::~HostStore() {
  MutexLock lock(cache_mu_);
  for (auto& [size, buffers] : cache_) {
    for (char* b : buffers) delete[] b;
  }
  cache_.clear();
}

char* HostStore::TakeBuffer(size_t capacity) {
  {
    MutexLock lock(cache_mu_);
    auto it = cache_.find(capacity);
    if (it != cache_.end() && !it->second.empty()) {
      char* b = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= static_cast<int64_t>(capacity);
      cache_hits_ += 1;
      return b;
    }
    cache_misses_ += 1;
  }
  return new char[capacity];
}

void HostStore::ReturnBuffer(char* buffer, size_t capacity) {
  {
    MutexLock lock(cache_mu_);
    if (cached_bytes_ + static_cast<int64_t>(capacity) <= static_cast<int64_t>(cache_limit_)) {
      cache_[capacity].push_back(buffer);
      cached_bytes_ += static_cast<int64_t>(capacity);
      return;
    }
  }
  delete[] buffer;
}

void HostStore::TrimCacheLocked() {
  for (auto it = cache_.begin(); it != cache_.end() && cached_bytes_ > static_cast<int64_t>(cache_limit_);) {
    auto& buffers = it->second;
    while (!buffers.empty() && cached_bytes_ > static_cast<int64_t>(cache_limit_)) {
      delete[] buffers.back();
      buffers.pop_back();
      cached_bytes_ -= static_cast<int64_t>(it->first);
    }
    it = buffers.empty() ? cache_.erase(it) : std::next(it);
  }
}

void HostStore::SetCacheLimit(size_t cache_limit) {
  MutexLock lock(cache_mu_);
  cache_limit_ = cache_limit;
  TrimCacheLocked();
}

std::shared_ptr<HostEntry> HostStore::Reserve(size_t bytes,
                                              const std::string& label,
                                              std::string* error) {
  {
    MutexLock lock(mu_);
    const int64_t free_bytes = static_cast<int64_t>(capacity_) - stats_.current;
    if (static_cast<int64_t>(bytes) > free_bytes) {
      stats_.num_rejected += 1;
      *error = "host store out of memory: swap-out of '" + label + "' needs " +
               HumanBytes(bytes) + " but the host store holds " +
               HumanBytes(stats_.current) + " of its " + HumanBytes(capacity_) +
               " in " + std::to_string(stats_.num_entries) +
               " entries; raise it (TENSILE_HOST_BYTES or "
               "tf_plugin.swap.configure_host_store) or plan with less swapping";
      return nullptr;
    }
    stats_.current += static_cast<int64_t>(bytes);
    stats_.peak = std::max(stats_.peak, stats_.current);
    stats_.allocated += static_cast<int64_t>(bytes);
    stats_.num_puts += 1;
    stats_.num_entries += 1;
  }
  auto e = std::make_shared<HostEntry>();
  const size_t size_class = SizeClass(bytes);
  e->data = std::unique_ptr<char[], HostBufferReturn>(TakeBuffer(size_class),
                                                      HostBufferReturn{this, size_class});
  e->bytes = bytes;
  e->label = label;
  return e;
}

void HostStore::FreeLocked(const HostEntry& e) {
  stats_.current -= static_cast<int64_t>(e.bytes);
  stats_.freed += static_cast<int64_t>(e.bytes);
  stats_.num_frees += 1;
  stats_.num_entries -= 1;
}

void HostStore::Unreserve(const std::shared_ptr<HostEntry>& entry) {
  MutexLock lock(mu_);
  FreeLocked(*entry);
}

void HostStore::Insert(int64_t handle, std::shared_ptr<HostEntry> entry) {
  MutexLock lock(mu_);
  activations_[handle] = std::move(entry);
}

std::shared_ptr<HostEntry> HostStore::Acquire(int64_t handle) {
  MutexLock lock(mu_);
  auto it = activations_.find(handle);
  if (it == activations_.end()) return nullptr;
  std::shared_ptr<HostEntry> e = it->second;
  if (--e->refs <= 0) {
    // The caller's shared_ptr keeps the bytes alive while it copies; the
    // accounting drops now, as the copy is the entry's last use.
    FreeLocked(*e);
    activations_.erase(it);
  }
  return e;
}

void HostStore::PutVariable(const std::string& key,
                            std::shared_ptr<HostEntry> entry) {
  MutexLock lock(mu_);
  auto it = variables_.find(key);
  if (it != variables_.end()) {
    FreeLocked(*it->second);
    it->second = std::move(entry);
  } else {
    variables_.emplace(key, std::move(entry));
  }
}

std::shared_ptr<HostEntry> HostStore::GetVariable(const std::string& key) {
  MutexLock lock(mu_);
  auto it = variables_.find(key);
  return it == variables_.end() ? nullptr : it->second;
}

bool HostStore::HasVariable(const std::string& key) {
  MutexLock lock(mu_);
  return variables_.count(key) != 0;
}

void HostStore::DropVariable(const std::string& key) {
  MutexLock lock(mu_);
  auto it = variables_.find(key);
  if (it == variables_.end()) return;
  FreeLocked(*it->second);
  variables_.erase(it);
}

int64_t HostStore::ReleaseStream(int32_t stream) {
  MutexLock lock(mu_);
  int64_t freed = 0;
  for (auto it = activations_.begin(); it != activations_.end();) {
    if (it->second->stream == stream) {
      freed += static_cast<int64_t>(it->second->bytes);
      FreeLocked(*it->second);
      it = activations_.erase(it);
    } else {
      ++it;
    }
  }
  return freed;
}

void HostStore::SetCapacity(size_t capacity) {
  MutexLock lock(mu_);
  capacity_ = capacity;
}

HostStoreStats HostStore::Stats() {
  MutexLock lock(mu_);
  HostStoreStats s = stats_;
  s.capacity = static_cast<int64_t>(capacity_);
  MutexLock cache_lock(cache_mu_);
  s.cached = cached_bytes_;
  s.cache_hits = cache_hits_;
  s.cache_misses = cache_misses_;
  return s;
}

void HostStore::ResetPeak() {
  MutexLock lock(mu_);
  stats_.peak = stats_.current;
}

HostStore& GetHostStore() {
  static HostStore* store = [] {
    const PluginSettings settings = CurrentPluginSettings();   // host_cache_bytes 0: no cache
    return new HostStore(settings.host_bytes > 0 ? settings.host_bytes : kDefaultHostStoreBytes,
                         settings.host_cache_bytes);  // never destroyed (TF frees at exit)
  }();
  return *store;
}

}  // namespace tensile
