// Smoothing Length (Operation::SmoothingLength): per query, the distance to its k-th nearest other
// point, exact (the k-th smallest of the double squared distances, PairTest.h's formula), on the
// CPU (CpuKthNeighbor.cxx) and the GPU (cuda/KthNeighbor.cu). What both share lives here.
//
// The search grows per query. Queries are binned into levels: level l searches a grid of all the
// points with cells of c_l = c_0 2^l, where c_0 would hold k neighbors within one cell of a
// point if the points filled their bounds evenly. A query's level comes from how many points share
// its cell of c_0: a point in a cluster 1000x denser than the mean takes cells 10x finer, so
// every query tests a few times k candidates however clustered the cloud. Within its level, a
// query visits the cells around its own in order of their distance from it (offsetTable), keeps
// its k nearest so far, and stops when the next cell lies farther than its k-th. A query whose
// k-th nearest lies beyond the table's reach goes up a level, with cells twice as large.
//
// A cell of a coarse level can hold a whole cluster core, and a background point beside it would
// test every point of the core. On the GPU a cell of more than max(64, 2k) points is descended
// instead: the points sorted once by the Morton keys of their finest cells make every cell of
// every level a run of that order, and the query walks the cell's sub-cells nearest first,
// skipping those beyond its k-th so far (cuda/KthNeighbor.cu, KthMorton). Where queries sit at
// several levels, each level's queries also go in that order, so a warp searches one
// neighbourhood.
#pragma once

#include "KernelFunctions.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// The support radius of a k-th squared distance s: its square root rounded up to float, the
/// smallest float R with R * R >= s. The square of a float is exact in double, so withinRadius
/// (d2 <= R * R) then takes the k-th neighbor, and a Gather search with these radii gives every
/// point at least k neighbors. Overflow to +inf stays +inf.
NG_HD float supportRadiusOf(double squared)
{
  float radius = float(sqrt(squared));
  if (double(radius) * double(radius) < squared)
  {
    radius = nextafterf(radius, INFINITY); // the nearest float lay below: one step up suffices
  }
  return radius;
}

/// Cells visited each way around a query's own cell within one level.
constexpr int kthReach = 3;
constexpr int kthOffsetCount = (2 * kthReach + 1) * (2 * kthReach + 1) * (2 * kthReach + 1);

/// A neighbor cell: its offset, and a lower bound, in squared cell units, of the distance from
/// any point of the query's cell to any point of it: sum over axes of max(|offset| - 1, 0)^2.
struct KthCellOffset
{
  signed char x, y, z, lowerBound2;
};

/// The cells within kthReach of a query's own, nearest first (by lower bound, then by offset
/// length), so a query can stop at the first cell whose bound exceeds its k-th distance.
inline std::vector<KthCellOffset> kthOffsetTable()
{
  std::vector<KthCellOffset> table;
  for (int z = -kthReach; z <= kthReach; ++z)
  {
    for (int y = -kthReach; y <= kthReach; ++y)
    {
      for (int x = -kthReach; x <= kthReach; ++x)
      {
        auto gap = [](int o) { return std::max(std::abs(o) - 1, 0); };
        const int bound = gap(x) * gap(x) + gap(y) * gap(y) + gap(z) * gap(z);
        table.push_back(KthCellOffset{ static_cast<signed char>(x), static_cast<signed char>(y),
          static_cast<signed char>(z), static_cast<signed char>(bound) });
      }
    }
  }
  std::stable_sort(table.begin(), table.end(), [](const KthCellOffset& a, const KthCellOffset& b) {
    const int la = a.x * a.x + a.y * a.y + a.z * a.z, lb = b.x * b.x + b.y * b.y + b.z * b.z;
    return a.lowerBound2 != b.lowerBound2 ? a.lowerBound2 < b.lowerBound2 : la < lb;
  });
  return table;
}

/// Squared distance from a point at frame coordinates f (in [0, 1)^3 of its cell) to the cell at
/// offset o, in cell units.
NG_HD float kthCellGap2(const float f[3], int ox, int oy, int oz)
{
  auto gap = [](float fa, int oa) {
    return oa > 0 ? float(oa) - fa : (oa < 0 ? fa - float(oa + 1) : 0.0f);
  };
  const float gx = gap(f[0], ox), gy = gap(f[1], oy), gz = gap(f[2], oz);
  return gx * gx + gy * gy + gz * gz;
}

/// A lower bound (squared, cell units) may prune a cell when it exceeds the k-th distance found
/// so far: slack for the float rounding of both (PairTest.h's error bound is far below it).
NG_HD bool kthBeyond(float bound2, float kth2)
{
  return bound2 > kth2 * (1.0f + 1.0e-5f) + 1.0e-5f;
}

/// The error of a float squared distance near kth2 (cell units, frames shifted by up to kthReach
/// cells), with room: a pair whose float distance exceeds kth2 + kthBand(kth2) lies beyond kth2 in
/// double too (PairTest.h's bound, 4x, plus 16 ulp).
NG_HD float kthBand(float kth2)
{
  const float u = 1.0f / 16777216.0f;
  const float rho = sqrtf(fmaxf(kth2, 0.0f));
  const float perAxis = u * (3.0f + kthReach + rho);
  const float bound = 3.4641016f * rho * perAxis + 3.0f * perAxis * perAxis + 5.0f * u * rho * rho;
  return (4.0f * bound + 16.0f * u * rho * rho) * 1.0001f + 1e-30f;
}

/// The levels' base cell size c_0 for n points in [lo, hi] and k neighbors: k points within c_0 if
/// they filled the bounds evenly (flat axes count as a thousandth of the widest).
inline double kthBaseCellSize(std::int64_t n, int k, const double lo[3], const double hi[3])
{
  double widest = 0.0;
  for (int a = 0; a < 3; ++a)
  {
    widest = std::max(widest, std::min(hi[a] - lo[a], 1e307)); // finite
  }
  if (!(widest > 0.0))
  {
    return 1.0; // every point at one position: any cell holds them all
  }
  // Per axis, so that extents near the largest double do not overflow.
  double size = std::cbrt(3.0 * k / (4.0 * 3.14159265358979 * double(n)));
  for (int a = 0; a < 3; ++a)
  {
    size *= std::cbrt(std::max(std::min(hi[a] - lo[a], 1e307), widest * 1e-3));
  }
  return size;
}

/// Points of an even cloud in one cell of c_0.
inline float kthExpectedPerBaseCell(int k)
{
  return 0.2387f * float(k); // k / (4 pi / 3)
}

/// A query's level from the points in its cell of c_0 (itself included): cells 2^l c_0 with
/// 8^-l of the count, clamped to [lowest, highest]. Denser than even (l < 0): the nearest level
/// (truncated toward 0, cells held up to 8x the points the search needs; the 4M clustered cloud's
/// finer levels tested 540 candidates a query, now about 380). Sparser: toward 0, so that a
/// query's k-th seldom lies beyond its level's reach (moving up a level repeats its search).
NG_HD int kthLevelFor(std::int32_t pointsInBaseCell, float expectedPerBaseCell, int lowest, int highest)
{
  const float ratio = expectedPerBaseCell / float(pointsInBaseCell > 0 ? pointsInBaseCell : 1);
  const float x = log2f(ratio) / 3.0f;
  const int level = static_cast<int>(x < 0.0f ? x - 0.5f : x); // truncation toward 0
  return level < lowest ? lowest : (level > highest ? highest : level);
}

/// The levels a run may use: cells from c_0 2^lowest (no finer than 2^-20 of the widest extent,
/// so that keys stay narrow) to c_0 2^highest, the first at least the widest extent (every point
/// within one cell of every other: no query goes beyond it).
inline void kthLevelRange(double baseCellSize, const double lo[3], const double hi[3], int& lowest, int& highest)
{
  double widest = 0.0;
  for (int a = 0; a < 3; ++a)
  {
    widest = std::max(widest, std::min(hi[a] - lo[a], 1e307)); // cells stay finite
  }
  highest = 0;
  while (baseCellSize * std::ldexp(1.0, highest) < widest && highest < 60)
  {
    ++highest;
  }
  lowest = 0;
  while (lowest > -60 && baseCellSize * std::ldexp(1.0, lowest - 1) > widest * std::ldexp(1.0, -20))
  {
    --lowest;
  }
}

} // namespace detail
} // namespace neighborgrid
