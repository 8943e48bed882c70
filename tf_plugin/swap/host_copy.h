// CopyToHost: the swap-out's copy into its host buffer (the host tier of
// seed 000 §III-C). No TensorFlow in this file.
//
// Note [Swap-outs bypass the cache]
// A swap-out copies a tensor the step has just written (hot in the cache)
// into a host buffer nothing will read until its swap-in, a step's worth of
// work later. std::memcpy below glibc's non-temporal threshold (about 3/4 of
// the last-level cache) writes through the cache: it first reads every
// destination line (read for ownership) and then leaves the host buffer in
// the cache, evicting the step's own working set. Non-temporal stores do
// neither. Measured on the 2-core VM (3 MiB tensors, hot source, 40 host
// buffers in rotation): memcpy 6.7-8.9 GB/s, non-temporal 13.6-14.2 GB/s.
// The Transformer's 3x batch swaps 80 MiB out per step. Swap-ins keep
// std::memcpy: their destination is read by the op they serve, so it is
// better left in the cache (non-temporal there: 8.6 against 9.8 GB/s).
#ifndef TF_PLUGIN_SWAP_HOST_COPY_H_
#define TF_PLUGIN_SWAP_HOST_COPY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tensile {

inline void CopyToHost(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  constexpr size_t kLine = 64;
  size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (bytes < head + 4 * kLine) {  // too small to gain: the cache is not in the way
    std::memcpy(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + kLine <= bytes; i += kLine) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();  // the streamed lines are visible before the entry is published
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace tensile

#endif  // TF_PLUGIN_SWAP_HOST_COPY_H_
