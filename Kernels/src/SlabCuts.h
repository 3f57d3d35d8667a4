// Where to cut a request into slabs along one axis, from a histogram of the points along it: the
// CUDA backend's resident slabs (ResidentSlabs.h) make the histogram on the device, where every
// point already is, and cut there. Host code, so that it is tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// Points per bin along one axis: bin b holds the points whose coordinate x has
/// floor((x - lo) / width) == b, clamped to [0, bins - 1]. The device computes that index in
/// double, so a point within rounding of a bin edge may sit in the bin beside it.
struct AxisHistogram
{
  double lo = 0.0;
  double width = 1.0; // (hi - lo) / bins, positive
  std::vector<std::uint64_t> counts;

  std::int64_t bins() const { return static_cast<std::int64_t>(counts.size()); }
  /// The coordinate of the edge between bins e - 1 and e.
  double edge(std::int64_t e) const { return lo + double(e) * width; }
};

/// Slabs along the axis: slab s owns the points with cuts[s - 1] <= x < cuts[s] (no lower
/// cut for the first slab, no upper one for the last) and runs with its halo, the points outside
/// it within `halo` of it. `most[s]` bounds the points of slab s and its halo from above (the
/// bins its range touches, one more each way for rounding).
struct SlabCuts
{
  std::vector<double> cuts; // slabs - 1 planes, increasing
  std::vector<std::uint64_t> most;
  int slabs() const { return static_cast<int>(cuts.size()) + 1; }
};

/// At least two slabs, as few as let every slab with its halo hold at most `capacity` points,
/// cut at bin edges where the points divide evenly. Empty (no cuts) where no cut at these
/// bins does it within `maxSlabs` slabs: a bin alone, with its halo, holds more than
/// `capacity` points (a dense cluster, or too coarse a histogram).
SlabCuts cutSlabs(const AxisHistogram& histogram, double halo, std::uint64_t capacity, int maxSlabs);

} // namespace detail
} // namespace neighborgrid
