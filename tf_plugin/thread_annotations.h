// Locks the compiler checks: clang's thread-safety analysis (issue 57, item 5).
//
// Note [Locks a compiler checks]
// The pool (allocator/stream_aware_pool.h), the CounterBarrier
// (nodegroup/counter_barrier.h), the swap channel (swap/swap_channel.h) and
// the host store (swap/host_store.h) each guard their state with one mutex.
// Which fields a mutex guards, and which methods expect it held, used to be
// comments ("All private methods require mu_ held"). They are now
// attributes, as TensorFlow's BFCAllocator and Abseil annotate theirs:
//   * a guarded field is TENSILE_GUARDED_BY(mu_): reading or writing it
//     without mu_ held is a compile error under clang -Wthread-safety;
//   * a method that expects mu_ held is TENSILE_REQUIRES(mu_), and one that
//     takes it TENSILE_EXCLUDES(mu_);
//   * tensile::Mutex is the capability and tensile::MutexLock its scoped
//     holder (std::mutex and std::lock_guard carry no attributes in
//     libstdc++); a condition variable waits on MutexLock::native(), and a
//     wait's predicate lambda says TENSILE_REQUIRES(mu_).
// Fields set before the object is shared and never written after (names,
// capacities, the backend, the arena's address) are not guarded. GCC, which
// builds the plugin, ignores the attributes; tests/stream_order/
// test_thread_safety.py compiles the four components with clang (the
// ziglang wheel's, in the test extra) and -Werror=thread-safety, and proves
// the check is on by compiling an unlocked write that must fail.
#ifndef TF_PLUGIN_THREAD_ANNOTATIONS_H_
#define TF_PLUGIN_THREAD_ANNOTATIONS_H_

#include <mutex>

#if defined(__clang__)
#define TENSILE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TENSILE_THREAD_ANNOTATION(x)
#endif

#define TENSILE_CAPABILITY(x) TENSILE_THREAD_ANNOTATION(capability(x))
#define TENSILE_SCOPED_CAPABILITY TENSILE_THREAD_ANNOTATION(scoped_lockable)
#define TENSILE_GUARDED_BY(x) TENSILE_THREAD_ANNOTATION(guarded_by(x))
#define TENSILE_PT_GUARDED_BY(x) TENSILE_THREAD_ANNOTATION(pt_guarded_by(x))
#define TENSILE_REQUIRES(...) \
  TENSILE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TENSILE_ACQUIRE(...) \
  TENSILE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TENSILE_RELEASE(...) \
  TENSILE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TENSILE_EXCLUDES(...) \
  TENSILE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TENSILE_NO_THREAD_SAFETY_ANALYSIS \
  TENSILE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace tensile {

// A std::mutex the analysis knows as a capability.
class TENSILE_CAPABILITY("mutex") Mutex {
 public:
  void lock() TENSILE_ACQUIRE() { mu_.lock(); }
  void unlock() TENSILE_RELEASE() { mu_.unlock(); }
  // For MutexLock only (condition variables wait on a std::unique_lock).
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope (std::lock_guard's part), and lends the
// std::unique_lock a std::condition_variable waits with.
class TENSILE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TENSILE_ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() TENSILE_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  // Released early, and taken again (a scope that calls out without it).
  void Unlock() TENSILE_RELEASE() { lock_.unlock(); }
  void Lock() TENSILE_ACQUIRE() { lock_.lock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace tensile

#endif  // TF_PLUGIN_THREAD_ANNOTATIONS_H_
