// Per-particle radii on the GPU in one search (Radii.h, RadiusPass::wholeRule): every pair decided
// by the mode's whole rule (Gather r <= R_i, Scatter r <= R_j, Symmetric either), however far the
// radii range, with no levels.
//
// Build: the particles sorted along a Morton curve of their bounds (CUB radix sort), cut into
// clusters of 32 consecutive points, and a tree of boxes over the clusters: a node holds 8
// consecutive nodes of the level below, so the tree is implicit (no pointers), and each box
// carries the largest radius inside it (what Scatter needs to reach a query).
// Search: one warp takes one cluster as its 32 queries and walks the tree once for all of them;
// it enters a node where any lane's sphere reaches the box (its own radius, the node's largest,
// or both, by the mode). A cluster it enters is staged in shared memory, and every lane tests all
// 32 sources: a 32 x 32 tile, as GROMACS's cluster pairs. A cluster of queries is small next to
// its radii (32 points, about half of the 64 a radius holds), so the candidates stay within a
// small factor of the neighbors wherever the radii follow the density, and dense cores are
// entered only by the clusters whose spheres reach them.
// Exactness: every pair is decided in double from the caller's coordinates (PairTest.h's
// definition, no band); a box test rounds the same operations in the same order on distances
// that are never larger, so it never drops a neighbor. Included only by .cu files.
#pragma once

#include "CudaRun.h"

namespace neighborgrid
{
namespace detail
{

/// A particle in tree order: its input coordinates and radius, in double.
struct alignas(32) TreePoint
{
  double x, y, z, radius;
};

/// The tree as the search kernel sees it.
struct RadiusTreeView
{
  int count = 0;                         // particles
  int levels = 0;                        // levels of nodes; level 0 holds the clusters
  int levelStart[12] = {};               // first node of each level in `low` / `high`
  int levelCount[12] = {};
  const TreePoint* __restrict__ positions = nullptr; // tree order
  const float* __restrict__ weights = nullptr;     // tree order: w_j
  const std::int32_t* __restrict__ orderToInput = nullptr;
  const float4* __restrict__ low = nullptr;  // per node: lower corner (rounded down), largest radius
  const float4* __restrict__ high = nullptr; // per node: upper corner (rounded up)
};

constexpr int radiusTreeCluster = 32;
constexpr int radiusTreeFanOut = 8;

class CudaRadiusTree
{
public:
  explicit CudaRadiusTree(DevicePool& pool);
  /// Device bytes build() and a search hold for n particles with `components` values each.
  static std::int64_t plannedBytes(std::int64_t n, int components);
  /// Sorts the run's particles and builds the tree. radii: device, input order, or null for
  /// constantRadius; weights: device, input order, or null for constantWeight.
  void build(CudaRun& run, const float* radii, double constantRadius, const float* weights, float constantWeight);
  /// `components` values a particle (device, input order) in tree order.
  const float* valuesInTreeOrder(CudaRun& run, const float* values, int components);
  /// Radii in tree order (null with a constant radius).
  const float* radiiInTreeOrder() const { return hasRadii_ ? radii_.get() : nullptr; }
  const RadiusTreeView& view() const { return view_; }
  std::int64_t heldBytes() const;

private:
  DeviceBuffer<unsigned long long> keys_;
  DeviceBuffer<std::int32_t> order_;
  DeviceBuffer<unsigned char> scratch_;
  DeviceBuffer<TreePoint> positions_;
  DeviceBuffer<float> radii_;
  DeviceBuffer<float> weights_;
  DeviceBuffer<float> values_;
  DeviceBuffer<float4> low_;
  DeviceBuffer<float4> high_;
  RadiusTreeView view_;
  bool hasRadii_ = false;
};

#if defined(__CUDACC__)

constexpr int radiusTreeWarps = 8; // warps a block

/// (dx * dx + dy * dy) + dz * dz from the point to the box, each operation rounded on its own as
/// exactSquaredDistance rounds it: per axis the distance is never above the one to a point
/// inside, and rounding is monotonic, so a neighbor's box is never culled.
__device__ __forceinline__ double squaredDistanceToBox(const double x[3], const float4& low, const float4& high)
{
  const double lo[3] = { low.x, low.y, low.z }, hi[3] = { high.x, high.y, high.z };
  double e[3];
  for (int a = 0; a < 3; ++a)
  {
    e[a] = x[a] < lo[a] ? __dsub_rn(lo[a], x[a]) : (x[a] > hi[a] ? __dsub_rn(x[a], hi[a]) : 0.0);
  }
  return __dadd_rn(__dadd_rn(__dmul_rn(e[0], e[0]), __dmul_rn(e[1], e[1])), __dmul_rn(e[2], e[2]));
}

/// A value of a 4-byte-multiple type from lane `from` of the warp.
template <class T>
__device__ __forceinline__ T fromLane(const T& value, int from)
{
  static_assert(sizeof(T) % 4 == 0, "whole words");
  T out;
  const int* in = reinterpret_cast<const int*>(&value);
  int* to = reinterpret_cast<int*>(&out);
  for (int w = 0; w < int(sizeof(T) / 4); ++w)
  {
    to[w] = __shfl_sync(0xffffffffu, in[w], from);
  }
  return out;
}

/// The mode's whole rule for a pair at squared distance r2: the query's own radius (squared),
/// the source's radius.
__device__ __forceinline__ bool takesPair(SmoothingLengthMode mode, double r2, double ownSquared, double sourceRadius)
{
  const bool own = r2 <= ownSquared;
  const bool theirs = r2 <= sourceRadius * sourceRadius;
  return mode == SmoothingLengthMode::Gather ? own : mode == SmoothingLengthMode::Scatter ? theirs : (own || theirs);
}

/// The terms of a taken pair (query at x with `state`, source k of the staged cluster).
template <class Op>
__device__ __forceinline__ void pairTerms(const Op& op, const typename Op::Query& state, const double x[3],
  const TreePoint& b, float weight, int source, double r2, typename Op::Value (&t)[Op::Terms])
{
  const float d[3] = { float(x[0] - b.x), float(x[1] - b.y), float(x[2] - b.z) };
  const Particle pj{ float(b.x), float(b.y), float(b.z), weight };
  op.pair(t, state, source, pj, static_cast<float>(r2), d);
}

/// One cluster of sources against the warp's queries, where few lanes reach it: lane by lane,
/// the warp tests that query against the 32 sources at once (one a lane) and sums the terms
/// across the warp. A query whose sphere holds a dense core then costs its pairs / 32.
template <class Op>
__device__ __forceinline__ void clusterByQuery(const Op& op, unsigned reaching, const double x[3],
  const typename Op::Query& state, double ownSquared, const TreePoint& mine, float myWeight, int mySource,
  bool haveSource, RegisterSums<Op>& acc)
{
  const int lane = threadIdx.x & 31;
  while (reaching)
  {
    const int from = __ffs(reaching) - 1;
    reaching &= reaching - 1;
    const double q[3] = { fromLane(x[0], from), fromLane(x[1], from), fromLane(x[2], from) };
    const typename Op::Query theirs = fromLane(state, from);
    const double theirSquared = fromLane(ownSquared, from);
    typename Op::Value t[Op::Terms];
    for (int k = 0; k < Op::Terms; ++k)
    {
      t[k] = 0;
    }
    if (haveSource)
    {
      const double r2 = exactSquaredDistance(q[0], q[1], q[2], mine.x, mine.y, mine.z);
      if (takesPair(op.rule.mode, r2, theirSquared, mine.radius))
      {
        pairTerms(op, theirs, q, mine, myWeight, mySource, r2, t);
      }
    }
    for (int k = 0; k < Op::Terms; ++k)
    {
      for (int offset = 16; offset > 0; offset >>= 1)
      {
        t[k] += __shfl_xor_sync(0xffffffffu, t[k], offset);
      }
    }
    if (lane == from)
    {
      acc.addTerms(t);
    }
  }
}

/// One cluster of sources against the warp's queries, where many lanes reach it: every lane
/// tests the 32 staged sources into a mask, then takes its own pairs, so the lanes that take a
/// pair work together instead of one at a time.
template <class Op>
__device__ __forceinline__ void clusterByTile(const Op& op, const TreePoint* staged, const float* weights, int begin,
  int size, bool active, const double x[3], const typename Op::Query& state, double ownSquared, RegisterSums<Op>& acc)
{
  unsigned taken = 0;
  if (active)
  {
    for (int k = 0; k < size; ++k)
    {
      const TreePoint b = staged[k];
      const double r2 = exactSquaredDistance(x[0], x[1], x[2], b.x, b.y, b.z);
      taken |= takesPair(op.rule.mode, r2, ownSquared, b.radius) ? 1u << k : 0u;
    }
  }
  while (taken)
  {
    const int k = __ffs(taken) - 1;
    taken &= taken - 1;
    const TreePoint b = staged[k];
    const double r2 = exactSquaredDistance(x[0], x[1], x[2], b.x, b.y, b.z);
    typename Op::Value t[Op::Terms];
    pairTerms(op, state, x, b, weights[k], begin + k, r2, t);
    acc.addTerms(t);
  }
}

/// Clusters that fewer lanes than this reach go query by query (clusterByQuery).
constexpr int radiusTreeByQueryLanes = 8;

/// One warp per cluster of queries; see the header comment. `op` is a RadiusOperation whose rule
/// has cellSize 1 (frame units are input units) and whose source arrays are in tree order.
template <class Op>
__global__ void __launch_bounds__(32 * radiusTreeWarps) radiusTreeSearch(RadiusTreeView tree, Op op)
{
  __shared__ TreePoint staged[radiusTreeWarps][radiusTreeCluster];
  __shared__ float stagedWeight[radiusTreeWarps][radiusTreeCluster];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cluster = blockIdx.x * radiusTreeWarps + warp;
  if (cluster >= tree.levelCount[0])
  {
    return; // the whole warp
  }
  const int s = cluster * radiusTreeCluster + lane;
  const bool active = s < tree.count;
  double x[3] = { 0, 0, 0 };
  std::int64_t q = 0;
  if (active)
  {
    const TreePoint p = tree.positions[s];
    x[0] = p.x, x[1] = p.y, x[2] = p.z;
    q = tree.orderToInput[s];
  }
  const typename Op::Query state = active ? op.query(q) : typename Op::Query{};
  const double ownSquared = active ? state.radius * state.radius : -1.0;
  const SmoothingLengthMode mode = op.rule.mode;
  RegisterSums<Op> acc;

  // A stack of nodes to test, the same in every lane: level in the top 4 bits.
  constexpr int stackSize = 8 * 12;
  int stack[stackSize];
  int top = 0;
  stack[top++] = ((tree.levels - 1) << 27) | 0;
  while (top > 0)
  {
    const int entry = stack[--top];
    const int level = entry >> 27, node = entry & ((1 << 27) - 1);
    const float4 low = tree.low[tree.levelStart[level] + node];
    const float4 high = tree.high[tree.levelStart[level] + node];
    bool reaches = false;
    if (active)
    {
      const double largest = double(low.w) * double(low.w);
      const double reach = mode == SmoothingLengthMode::Gather ? ownSquared
        : mode == SmoothingLengthMode::Scatter                 ? largest
                                                               : fmax(ownSquared, largest);
      reaches = squaredDistanceToBox(x, low, high) <= reach;
    }
    const unsigned reaching = __ballot_sync(0xffffffffu, reaches);
    if (!reaching)
    {
      continue;
    }
    if (level > 0)
    {
      const int first = node * radiusTreeFanOut;
      const int last = min(first + radiusTreeFanOut, tree.levelCount[level - 1]);
      for (int child = last - 1; child >= first; --child)
      {
        stack[top++] = ((level - 1) << 27) | child;
      }
      continue;
    }
    const int begin = node * radiusTreeCluster;
    const int size = min(radiusTreeCluster, tree.count - begin);
    __syncwarp();
    TreePoint mine{ 0, 0, 0, 0 };
    float myWeight = 0.0f;
    if (lane < size)
    {
      mine = tree.positions[begin + lane];
      myWeight = tree.weights[begin + lane];
      staged[warp][lane] = mine;
      stagedWeight[warp][lane] = myWeight;
    }
    __syncwarp();
    if (__popc(reaching) < radiusTreeByQueryLanes)
    {
      clusterByQuery(op, reaching, x, state, ownSquared, mine, myWeight, begin + lane, lane < size, acc);
    }
    else
    {
      clusterByTile(op, staged[warp], stagedWeight[warp], begin, size, active, x, state, ownSquared, acc);
    }
  }
  if (active)
  {
    acc.finish(op, s, static_cast<int>(q));
  }
}

/// The search on the run's stream: `op` complete but for its frame and the tree's arrays.
template <class Op>
void launchRadiusTreeSearch(CudaRun& run, const CudaRadiusTree& tree, Op op)
{
  const RadiusTreeView& view = tree.view();
  if (view.count == 0)
  {
    return;
  }
  op.rule.cellSize = 1.0f;
  op.rule.inverseCellSize = 1.0f;
  op.rule.frameScale = 1.0;
  op.rule.band = 0.0f;
  op.rule.sources = run.input;
  op.rule.orderToInput = view.orderToInput;
  op.rule.sourceRadii = tree.radiiInTreeOrder();
  const int blocks = (view.levelCount[0] + radiusTreeWarps - 1) / radiusTreeWarps;
  radiusTreeSearch<<<blocks, 32 * radiusTreeWarps, 0, run.stream>>>(view, op);
}

#endif

} // namespace detail
} // namespace neighborgrid
