// The StreamAwarePool behind a C ABI: one pool per process, shared by every
// stream of the process, one job per stream (Waterwave's one stream per
// job). Any runtime that takes its device allocator from a shared library
// can train through the pool; the one it is made for is PyTorch:
//
//   torch.cuda.memory.CUDAPluggableAllocator(
//       "libtensile_pool_c.so", "tensile_pool_alloc", "tensile_pool_free")
//
// whose alloc / free signatures these two are (cudaStream_t is a pointer).
// benchmarks/gpu/torch_training.py trains two models at once through it;
// tests/stream_order/test_pool_c_abi.py drives it through ctypes on the
// asynchronous host backend, where no GPU is.
//
// Policy:
//  1. The pool is made by tensile_pool_init, or on the first allocation
//     from the environment: TENSILE_POOL_BACKEND ("cuda" where built with
//     TENSILE_WITH_CUDA, else "async-host"), TENSILE_POOL_BYTES (plain
//     decimal; 1 GiB when unset), TENSILE_POOL_STITCH ("0": never stitch).
//     A second init while the pool holds live allocations fails.
//  2. Each distinct stream handle becomes a pool stream the first time an
//     allocation names it ("stream 0x..."): its frees go to that stream's
//     unsynced set, and another stream takes them only after the pool
//     waited for the freeing stream's ticket (Note [Stream order on an
//     asynchronous device] in tf_plugin/allocator/pool_backend.h). On the
//     CUDA backend the handle is the CUDA stream itself (AdoptStream: the
//     pool's events are recorded on the caller's stream); on the host
//     backends it is only a key.
//  3. Deallocate goes to the stream that allocated the pointer, whatever
//     stream the caller names (PyTorch names the allocation's own).
//  4. A failure returns nullptr (or -1) and leaves the reason, in the form
//     of STYLE.md rule 6, in tensile_pool_last_error() (per thread); an
//     allocation the pool cannot serve also prints it to stderr, since
//     PyTorch's message does not carry it.
//  5. The pool is never destroyed at process exit (as PyTorch's own
//     allocator): the runtime's teardown order against static destructors
//     is unspecified. tensile_pool_shutdown destroys it on request.
//
// No TensorFlow in this file, and no CUDA header.
#ifndef TF_PLUGIN_ALLOCATOR_POOL_C_ABI_H_
#define TF_PLUGIN_ALLOCATOR_POOL_C_ABI_H_

#include <stdint.h>
#include <sys/types.h>

#define TENSILE_POOL_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

// Flags of tensile_pool_init.
#define TENSILE_POOL_STITCH 1  // Note [Stitched allocations]

// Makes the pool: backend "cuda", "async-host" or "host", `capacity`
// bytes. 0 on success, -1 otherwise (policy 4).
TENSILE_POOL_API int tensile_pool_init(const char* backend, uint64_t capacity, int flags);
// Destroys the pool (policy 5); -1 while allocations are live. Not while
// another thread uses the pool.
TENSILE_POOL_API int tensile_pool_shutdown(void);

// PyTorch's CUDAPluggableAllocator signatures. `device`: the CUDA device
// the pool was made on (any on the host backends).
TENSILE_POOL_API void* tensile_pool_alloc(ssize_t size, int device, void* stream);
TENSILE_POOL_API void tensile_pool_free(void* ptr, ssize_t size, int device, void* stream);

// The pool's statistics as one JSON object (stats vocabulary of
// stream_aware_pool.h, per stream too) written into buf, NUL-terminated
// when it fits. Returns the length of the whole object (without the NUL);
// -1 without a pool.
TENSILE_POOL_API int64_t tensile_pool_stats_json(char* buf, uint64_t n);
// peak := current, for the pool and each stream.
TENSILE_POOL_API void tensile_pool_reset_peak(void);
// Waterwave's SyncAndCoalesce, on request (tests, between runs).
TENSILE_POOL_API void tensile_pool_sync(void);
TENSILE_POOL_API const char* tensile_pool_last_error(void);

// The backend's pattern kernels (stream_kernels.h) on a stream's queue, for
// tests of the stream rule through this ABI: a write of `pattern` at the
// start of every 256-byte granule of [ptr, ptr + bytes), and a check of
// those words. 0, or -1.
TENSILE_POOL_API int tensile_pool_enqueue_fill(void* stream, void* ptr, uint64_t bytes, uint64_t pattern);
TENSILE_POOL_API int tensile_pool_enqueue_verify(void* stream, void* ptr, uint64_t bytes, uint64_t pattern);
// Waits for every stream; the number of checks that failed so far (-1: no
// pool, or a backend without kernels).
TENSILE_POOL_API int64_t tensile_pool_drain_corruptions(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TF_PLUGIN_ALLOCATOR_POOL_C_ABI_H_
