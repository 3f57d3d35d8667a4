// The CPU backend's pair loops: the points of one cell against the cell's neighborhood, the points
// of the 27 cells around it gathered once per cell into arrays x, y, z, w in the cell's own frame.
//
// The loops have no branch per pair, so the compiler vectorizes them (SSE2 on any x86-64; AVX2
// and AVX-512 clones where the processor has them, CpuPairLoops.cxx). The float test decides
// every pair clearly inside or outside R and flags a point when any of its pairs lies within
// rounding of R (or is NaN: a huge cell). The backend then decides those few pairs in double
// (PairTest.h), so every decision stays exact.
//
// A neighbor's frame coordinate is shifted into the cell's frame once, when it is gathered
// (x_j + offset, one rounding of a value within [-1, 2]): the rounding PairTest.h's band allows for.
#pragma once

#include "KernelFunctions.h"
#include "PairTest.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// The loops keep sums per lane (pairLanes of them), so float sums vectorize without reordering a
/// lane's own additions; a multiple of every SIMD width in use.
constexpr int pairLanes = 16;

/// Where padding points sit: far outside any radius in frame units, and finite when squared.
constexpr float farAway = 1e18f;

/// n points (x, y, z, w each) into separate arrays, shifted by (dx, dy, dz); weights only where
/// w is given.
void shiftInto(const float* from, std::int32_t n, float dx, float dy, float dz, float* x, float* y, float* z, float* w);

/// A cell's neighborhood in structure-of-arrays form, padded to a multiple of pairLanes: the
/// points of up to 27 cells, each cell a run of consecutive sorted points.
struct Neighborhood
{
  struct Run
  {
    std::int64_t at;     // position of the run's first point in the arrays
    std::int64_t sorted; // its position in the sorted order
  };
  std::vector<float> x, y, z, w; // w only when gathered with weights
  Run runs[28];                   // 27 cells at most, and an end marker
  int runCount = 0;
  bool weights = false;
  std::int64_t size = 0;   // points, without the padding
  std::int64_t padded = 0; // points with the padding

  void clear(bool withWeights)
  {
    size = padded = 0;
    runCount = 0;
    weights = withWeights;
  }

  /// Adds sorted points [begin, end), whose cell lies at offset (dx, dy, dz) from this one.
  void append(const Particle* particles, std::int64_t begin, std::int64_t end, float dx, float dy, float dz)
  {
    reserve(size + (end - begin) + pairLanes);
    runs[runCount++] = Run{ size, begin };
    shiftInto(&particles[begin].x, static_cast<std::int32_t>(end - begin), dx, dy, dz, x.data() + size,
      y.data() + size, z.data() + size, weights ? w.data() + size : nullptr);
    size += end - begin;
  }

  /// Pads to a multiple of pairLanes with weightless points far away.
  void pad()
  {
    runs[runCount] = Run{ size, 0 };
    padded = (size + pairLanes - 1) / pairLanes * pairLanes;
    for (std::int64_t j = size; j < padded; ++j)
    {
      x[j] = y[j] = z[j] = farAway;
      if (weights)
      {
        w[j] = 0.0f;
      }
    }
  }

  /// The position in the sorted order of the point at `at` in the arrays, for increasing `at`
  /// from one call to the next (run: where the last call left off, 0 at first).
  std::int64_t sortedAt(std::int64_t at, int& run) const
  {
    while (runs[run + 1].at <= at)
    {
      ++run;
    }
    return runs[run].sorted + (at - runs[run].at);
  }

  /// visit(position in the arrays, position in the sorted order) for every point.
  template <class Visit>
  void forEachPoint(Visit visit) const
  {
    for (int r = 0; r < runCount; ++r)
    {
      for (std::int64_t at = runs[r].at; at < runs[r + 1].at; ++at)
      {
        visit(at, runs[r].sorted + (at - runs[r].at));
      }
    }
  }

private:
  void reserve(std::int64_t n)
  {
    if (static_cast<std::size_t>(n) > x.size())
    {
      const std::size_t grown = std::max<std::size_t>(static_cast<std::size_t>(n), 2 * x.size());
      for (auto* v : { &x, &y, &z, &w })
      {
        v->resize(grown);
      }
    }
  }
};

/// A cell's points (sorted order, frame coordinates) against its neighborhood, by the float test.
struct CellPairs
{
  const Neighborhood* around = nullptr;
  const Particle* points = nullptr;
  std::int64_t count = 0;
  float accept = 0.0f, reject = 0.0f; // PairTest.h
  std::uint8_t* band = nullptr;       // out, per point: 1 when a pair needs the double decision
};

/// Per point, the neighbors clearly inside R (the point itself included).
void countClearlyInside(const CellPairs& cell, std::int32_t* inside);

/// Per point, sum_j w_j W(r_ij) over the pairs clearly inside R, compensated (Kahan): the sum and
/// its carry, as RegisterSums keeps them.
void densityClearlyInside(const CellPairs& cell, const KernelParams& kernel, float* sum, float* carry);

/// The positions in `around` of q's pairs within rounding of R (or NaN), in increasing order,
/// written to `positions` (room for around.padded); returns how many.
std::int32_t listUncertain(const Neighborhood& around, const Particle& q, float accept, float reject, std::int32_t* positions);

/// The float squared distance of PairTest.h, from the differences (no fused multiply-add).
inline float frameSquared(float dx, float dy, float dz)
{
  return (dx * dx + dy * dy) + dz * dz;
}

/// Squared distances from q to every point of the neighborhood (padding included).
inline void squaredDistances(const Neighborhood& around, const Particle& q, float* r2)
{
  const float* x = around.x.data();
  const float* y = around.y.data();
  const float* z = around.z.data();
  for (std::int64_t j = 0; j < around.padded; ++j)
  {
    r2[j] = frameSquared(q.x - x[j], q.y - y[j], q.z - z[j]);
  }
}

/// In the band of the float test: within rounding of R, or NaN.
inline bool uncertain(float r2, const PairTest& test)
{
  return !(r2 < test.accept) & !(r2 > test.reject);
}

} // namespace detail
} // namespace neighborgrid
