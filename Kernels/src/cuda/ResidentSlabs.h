// Resident slabs: a request of more points than one run indexes (2^31 - 2) whose points and
// results all fit on the device at once. Its points go up once; the device makes a histogram
// along their longest axis (cut on the host: SlabCuts.h), gathers each slab's own points and
// then its halo (the points within R of it) into a run's input, in input order, and after the
// run scatters the own points' results into one array of every point's results, which goes down
// once. The host slab layer (Slabs.h) instead reads the caller's points once a slab and gathers
// them on the host: 6.3x the device's time at 2.2e9 points (RESULTS.md, issue 21).
#pragma once

#include "../SlabCuts.h"
#include "CudaSupport.h"

#include <cstdint>

namespace neighborgrid
{
namespace detail
{

/// A slab along `axis`: it owns lower <= x < upper (-inf and +inf where it has no cut), and its
/// halo is the other points with haloLower <= x <= haloUpper.
struct SlabRange
{
  int axis = 0;
  double lower = 0.0, upper = 0.0;
  double haloLower = 0.0, haloUpper = 0.0;
};

struct SlabCounts
{
  std::int64_t own = 0;
  std::int64_t halo = 0;
  std::int64_t total() const { return own + halo; }
};

/// The device's part of resident slabs. Its scratch (a few MB) comes from `pool`.
class DeviceSlabGather
{
public:
  explicit DeviceSlabGather(DevicePool& pool);

  /// `bins` bins of the points' coordinate `axis` over [lo, hi] (AxisHistogram). Waits for it.
  AxisHistogram histogram(const void* xyz, bool isDouble, std::int64_t n, int axis, double lo, double hi, int bins,
    int multiprocessors, cudaStream_t stream);
  /// Counts the slab's own and halo points. Waits for the counts.
  SlabCounts count(const void* xyz, bool isDouble, std::int64_t n, const SlabRange& slab, cudaStream_t stream);
  /// After count() of the same slab: its own points, then its halo, each in input order, into
  /// `slabXyz` (coordinates as given) and their input indices into `indices`.
  void write(const void* xyz, bool isDouble, std::int64_t n, const SlabRange& slab, void* slabXyz,
    std::int64_t* indices, cudaStream_t stream);

private:
  DeviceBuffer<unsigned long long> histogram_;
  DeviceBuffer<unsigned long long> tileCounts_; // own counts, then halo counts, a tile each (+1)
  DeviceBuffer<unsigned long long> tileOffsets_;
  DeviceBuffer<char> scanScratch_;
  PinnedBuffer<unsigned long long> totals_;
  std::int64_t tiles_ = 0;
  std::int64_t ownTotal_ = 0;
};

/// whole[indices[k] * words + w] = slab[k * words + w] for the first `count` entries of a slab:
/// its own points' results (`words` 4-byte values a point) into the array of every point's.
void scatterSlabWords(const std::uint32_t* slab, int words, std::int64_t count, const std::int64_t* indices,
  std::uint32_t* whole, cudaStream_t stream);
/// slab[k * words + w] = whole[indices[k] * words + w] for a slab's `count` points: its masses or
/// values from every point's.
void gatherSlabWords(const std::uint32_t* whole, int words, std::int64_t count, const std::int64_t* indices,
  std::uint32_t* slab, cudaStream_t stream);

} // namespace detail
} // namespace neighborgrid
