//===- WindowBytes.h - Which bytes of a window may not be zero -----------===//
//
// The fused GEMM kernels need their scratch zero when they start, and its
// place depends on the configuration (EPWindow.h): another configuration's
// data may have been written there. The runtime remembers which window bytes
// calls have written data to, and zeroes a scratch range before a launch
// only when it overlaps them: once per change of configuration, not per call.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_WINDOWBYTES_H
#define EPIC_RUNTIME_WINDOWBYTES_H

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace epic::runtime {

/// A set of byte ranges [begin, end) of a window, kept sorted and merged.
class WindowBytes {
public:
  /// Adds [begin, end); an empty range adds nothing.
  void add(int64_t begin, int64_t end) {
    if (begin >= end)
      return;
    // The common case on the hot path: already there (the same call again).
    for (const auto &[b, e] : ranges)
      if (b <= begin && end <= e)
        return;
    std::vector<std::pair<int64_t, int64_t>> merged;
    merged.reserve(ranges.size() + 1);
    for (const auto &[b, e] : ranges) {
      if (e < begin || b > end) {
        merged.push_back({b, e});
        continue;
      }
      begin = std::min(begin, b), end = std::max(end, e);
    }
    merged.push_back({begin, end});
    std::sort(merged.begin(), merged.end());
    ranges = std::move(merged);
  }
  /// Removes [begin, end) (what remains of an overlapping range stays).
  void remove(int64_t begin, int64_t end) {
    std::vector<std::pair<int64_t, int64_t>> kept;
    for (const auto &[b, e] : ranges) {
      if (e <= begin || b >= end) {
        kept.push_back({b, e});
        continue;
      }
      if (b < begin)
        kept.push_back({b, begin});
      if (e > end)
        kept.push_back({end, e});
    }
    ranges = std::move(kept);
  }
  bool overlaps(int64_t begin, int64_t end) const {
    return std::any_of(ranges.begin(), ranges.end(),
                       [&](const auto &r) { return r.first < end && begin < r.second; });
  }
  const std::vector<std::pair<int64_t, int64_t>> &list() const { return ranges; }

private:
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_WINDOWBYTES_H
