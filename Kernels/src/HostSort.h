// Sorting on the CPU backend's threads: a stable LSD radix sort of (key, value) pairs, and a
// stable sort of indices by a comparator for keys wider than 64 bits.
#pragma once

#include "Parallel.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// Sorts (keys[i], values[i]) by the low `bits` bits of the keys, stably: one counting sort per
/// 8 bits of key, each split over `threads` slices (per-slice histograms, digit-major offsets).
inline void radixSortPairs(
  std::vector<std::uint64_t>& keys, std::vector<std::int32_t>& values, int bits, int threads)
{
  const std::int64_t n = static_cast<std::int64_t>(keys.size());
  if (n < 2 || bits <= 0)
  {
    return;
  }
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 65536)));
  std::vector<std::uint64_t> keysOut(keys.size());
  std::vector<std::int32_t> valuesOut(values.size());
  std::vector<std::array<std::int64_t, 256>> counts(slices);
  for (int shift = 0; shift < bits; shift += 8)
  {
    parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
      auto& c = counts[slice];
      c.fill(0);
      for (std::int64_t i = begin; i < end; ++i)
      {
        ++c[(keys[i] >> shift) & 0xff];
      }
    });
    std::int64_t running = 0;
    for (int digit = 0; digit < 256; ++digit)
    {
      for (int slice = 0; slice < slices; ++slice)
      {
        const std::int64_t c = counts[slice][digit];
        counts[slice][digit] = running;
        running += c;
      }
    }
    parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
      auto& next = counts[slice];
      for (std::int64_t i = begin; i < end; ++i)
      {
        const std::int64_t to = next[(keys[i] >> shift) & 0xff]++;
        keysOut[to] = keys[i];
        valuesOut[to] = values[i];
      }
    });
    keys.swap(keysOut);
    values.swap(valuesOut);
  }
}

/// Sorts `order` (indices) stably by `less`, on `threads` threads: slices sorted in parallel,
/// then merged pairwise.
template <class Less>
void parallelStableSort(std::vector<std::int32_t>& order, int threads, const Less& less)
{
  const std::int64_t n = static_cast<std::int64_t>(order.size());
  int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 65536)));
  const std::int64_t size = (n + slices - 1) / slices;
  parallelSlices(slices, n, [&](int, std::int64_t begin, std::int64_t end) {
    std::stable_sort(order.begin() + begin, order.begin() + end, less);
  });
  for (std::int64_t width = size; width < n; width *= 2)
  {
    const std::int64_t pairs = (n + 2 * width - 1) / (2 * width);
    parallelSlices(static_cast<int>(std::min<std::int64_t>(pairs, threads)), pairs,
      [&](int, std::int64_t first, std::int64_t last) {
        for (std::int64_t p = first; p < last; ++p)
        {
          const std::int64_t begin = p * 2 * width;
          const std::int64_t middle = std::min(n, begin + width);
          const std::int64_t end = std::min(n, begin + 2 * width);
          std::inplace_merge(order.begin() + begin, order.begin() + middle, order.begin() + end, less);
        }
      });
  }
}

} // namespace detail
} // namespace neighborgrid
