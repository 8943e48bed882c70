// FreeChunkSet: the free chunks one StreamAwarePool set holds (one stream's
// unsynced chunks, or the synced chunks), kept so that the best fit for a
// request is found without a tree walk and inserting or erasing a chunk never
// calls malloc once the set has warmed up.
//
// Layout (Note [Size-binned free sets]):
//  1. A chunk of `size` bytes (a multiple of the pool's 256-byte unit, u =
//     size / unit units) lives in bin SizeBin(u): u itself below 4, else four
//     bins per power of two (the two bits below u's leading one pick the
//     bin). SizeBin is non-decreasing in u, so every chunk in bin b is
//     smaller than every chunk in a bin above b.
//  2. Each bin is a vector sorted by (size, offset); a bitmap marks the
//     non-empty bins.
//  3. BestFit(bytes): lower_bound in bytes' own bin; if nothing there fits,
//     the first entry of the next non-empty bin (the bitmap's next set bit).
//     That is the smallest chunk of at least `bytes`, lowest offset on equal
//     size: exactly the (size, offset) order of the std::set this replaces,
//     so placement is unchanged (tests/pool's state machine checks it
//     against a model of that order).
//
// Note [Size-binned free sets]
// The free sets were `std::set<ChunkHandle>` ordered by a comparator that
// read both chunks from the pool's chunk table. On the allocate/free pair
// benchmark (benchmarks/RESULTS.md, "Allocate/free pair cost") tree
// insertion (`_M_insert_unique`, 17% of the profile) plus one node malloc
// per insert and one free per erase kept the pool's core at 1.23x BFC's
// cost per pair. Sets are small in training (mean 25, max 53 free chunks
// over a ResNet50 replay) and most bins hold zero to three chunks, so a
// sorted vector per bin is searched and edited within a cache line or two,
// and keys are stored inline (no chunk table reads). Cost model: insert and
// erase move the entries after the position in one bin, O(n) in that bin's
// population, against O(log n) for the tree; four bins per power of two
// keep a bin to chunks within 25% of each other's size, so only thousands of
// nearly equal free chunks in one set would make that move matter.
//
// Not thread safe: the pool calls it under its own lock.
// No TensorFlow in this file.
#ifndef TF_PLUGIN_ALLOCATOR_FREE_CHUNK_SET_H_
#define TF_PLUGIN_ALLOCATOR_FREE_CHUNK_SET_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tensile {

class FreeChunkSet {
 public:
  using Handle = int32_t;
  static constexpr Handle kNone = -1;

  struct Entry {
    size_t size;
    size_t offset;
    Handle handle;
  };

  // `unit`: every size is a multiple of it (the pool's kMinChunkBytes, a
  // power of two: sizes become units by a shift, not a 64-bit division,
  // which was a quarter of Erase's time).
  explicit FreeChunkSet(size_t unit) : unit_shift_(__builtin_ctzll(unit)) {}

  // Bin of a chunk of `units` allocation units (>= 1): layout rule 1.
  static int SizeBin(size_t units) {
    if (units < 4) return static_cast<int>(units);
    const int lead = 63 - __builtin_clzll(units);  // >= 2
    return 4 * (lead - 1) + static_cast<int>((units >> (lead - 2)) & 3);
  }

  void Insert(size_t size, size_t offset, Handle h) {
    const int b = SizeBin(size >> unit_shift_);
    std::vector<Entry>& bin = bins_[b];
    auto it = std::upper_bound(bin.begin(), bin.end(), Entry{size, offset, h},
                               Before);
    bin.insert(it, Entry{size, offset, h});
    occupied_[b / 64] |= uint64_t{1} << (b % 64);
    bytes_ += static_cast<int64_t>(size);
    ++count_;
  }

  // Removes the chunk at (size, offset); false if the set does not hold it.
  bool Erase(size_t size, size_t offset) {
    const int b = SizeBin(size >> unit_shift_);
    const ptrdiff_t at = Locate(b, size, offset);
    if (at < 0) return false;
    bins_[b].erase(bins_[b].begin() + at);
    if (bins_[b].empty()) occupied_[b / 64] &= ~(uint64_t{1} << (b % 64));
    bytes_ -= static_cast<int64_t>(size);
    --count_;
    return true;
  }

  // Layout rule 3: the smallest chunk of at least `bytes` (lowest offset on
  // equal size), or kNone.
  Handle BestFit(size_t bytes) const {
    if (bytes_ < static_cast<int64_t>(bytes)) return kNone;
    const int b = SizeBin(bytes >> unit_shift_);
    const std::vector<Entry>& bin = bins_[b];
    auto it = std::lower_bound(
        bin.begin(), bin.end(), bytes,
        [](const Entry& e, size_t n) { return e.size < n; });
    if (it != bin.end()) return it->handle;
    const int next = NextOccupied(b + 1);
    return next < 0 ? kNone : bins_[next].front().handle;
  }

  // The handle stored for (size, offset), or kNone.
  Handle Find(size_t size, size_t offset) const {
    const int b = SizeBin(size >> unit_shift_);
    const ptrdiff_t at = Locate(b, size, offset);
    return at < 0 ? kNone : bins_[b][at].handle;
  }

  // Size of the largest chunk, 0 when empty.
  size_t LargestSize() const {
    for (int w = kWords - 1; w >= 0; --w) {
      if (occupied_[w] != 0) {
        const int b = w * 64 + 63 - __builtin_clzll(occupied_[w]);
        return bins_[b].back().size;
      }
    }
    return 0;
  }

  // Every handle, in (size, offset) order.
  std::vector<Handle> Handles() const {
    std::vector<Handle> out;
    out.reserve(count_);
    for (const std::vector<Entry>& bin : bins_) {
      for (const Entry& e : bin) out.push_back(e.handle);
    }
    return out;
  }

  // Empties the set; bins keep their capacity (no malloc when refilled).
  void Clear() {
    for (int w = 0; w < kWords; ++w) {
      for (uint64_t bits = occupied_[w]; bits != 0; bits &= bits - 1) {
        bins_[w * 64 + __builtin_ctzll(bits)].clear();
      }
      occupied_[w] = 0;
    }
    bytes_ = 0;
    count_ = 0;
  }

  int64_t bytes() const { return bytes_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

 private:
  // SizeBin of 2^64 - 1 units is 4 * 62 + 3 = 251.
  static constexpr int kBins = 256;
  static constexpr int kWords = kBins / 64;

  static bool Before(const Entry& a, const Entry& b) {
    return a.size != b.size ? a.size < b.size : a.offset < b.offset;
  }

  // Where (size, offset) sits in bin b, or -1.
  ptrdiff_t Locate(int b, size_t size, size_t offset) const {
    const std::vector<Entry>& bin = bins_[b];
    auto it = std::lower_bound(bin.begin(), bin.end(), Entry{size, offset, kNone}, Before);
    return it != bin.end() && it->size == size && it->offset == offset ? it - bin.begin() : -1;
  }

  // First non-empty bin at or above `from`, or -1.
  int NextOccupied(int from) const {
    for (int w = from / 64; w < kWords; ++w) {
      uint64_t bits = occupied_[w];
      if (w == from / 64) bits &= ~uint64_t{0} << (from % 64);
      if (bits != 0) return w * 64 + __builtin_ctzll(bits);
    }
    return -1;
  }

  int unit_shift_;  // log2 of the unit
  std::array<std::vector<Entry>, kBins> bins_;
  std::array<uint64_t, kWords> occupied_{};
  int64_t bytes_ = 0;
  size_t count_ = 0;
};

}  // namespace tensile

#endif  // TF_PLUGIN_ALLOCATOR_FREE_CHUNK_SET_H_
