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
// or both, by the mode). A cluster of sources it reaches is staged in shared memory and taken
//  - as a 32 x 32 tile where many lanes reach it (as GROMACS's cluster pairs): every lane tests
//    all 32 sources into a mask, then takes its own pairs;
//  - query by query where fewer than 16 lanes reach it: the warp tests one query against the 32
//    sources at once and sums across lanes. A query whose sphere holds a dense core (Gather at a
//    cluster's edge) then costs its pairs / 32, not its pairs.
// Exactness: every pair is decided in double from the caller's coordinates (PairTest.h's
// definition, no band); a box test rounds the same operations in the same order on distances
// that are never larger, so it never drops a neighbor. Included only by .cu files.
#pragma once

#include "CudaRun.h"

#include <cstdio>
#include <cstdlib>

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
  // NEIGHBORGRID_TREE_STATS: per search, the warps' totals (radiusTreeStatNames), else null.
  unsigned long long* stats = nullptr;
  int byQueryLanes = 16; // clusters fewer lanes reach go query by query (clusterByQuery)
};

constexpr int radiusTreeStats = 6;
constexpr const char* radiusTreeStatNames[radiusTreeStats] = { "warps", "nodes tested", "clusters as tiles",
  "clusters query by query", "query rounds", "most clusters in one warp" };

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
#pragma unroll 4
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

/// The warp's queries: the points of one cluster, one a lane.
template <class Op>
struct WarpQueries
{
  bool active = false; // a lane past the last point has none
  double x[3] = { 0, 0, 0 };
  std::int64_t q = 0; // input index
  typename Op::Query state{};
  double ownSquared = -1.0;

  __device__ WarpQueries(const RadiusTreeView& tree, const Op& op, int cluster, int lane)
  {
    const int s = cluster * radiusTreeCluster + lane;
    active = s < tree.count;
    if (active)
    {
      const TreePoint p = tree.positions[s];
      x[0] = p.x, x[1] = p.y, x[2] = p.z;
      q = tree.orderToInput[s];
      state = op.query(q);
      ownSquared = state.radius * state.radius;
    }
  }
};

/// Walks the tree once for the warp's queries: visit(cluster, reaching lanes) for every cluster
/// of sources some lane's sphere reaches (by the mode). Returns the nodes tested.
template <class Op, class Visit>
__device__ __forceinline__ unsigned forEachReachedCluster(const RadiusTreeView& tree, SmoothingLengthMode mode,
  const WarpQueries<Op>& w, Visit visit)
{
  // A stack of nodes to test, the same in every lane: level in the top 4 bits.
  constexpr int stackSize = 8 * 12;
  int stack[stackSize];
  int top = 0;
  unsigned tested = 0;
  stack[top++] = ((tree.levels - 1) << 27) | 0;
  while (top > 0)
  {
    const int entry = stack[--top];
    const int level = entry >> 27, node = entry & ((1 << 27) - 1);
    const float4 low = tree.low[tree.levelStart[level] + node];
    const float4 high = tree.high[tree.levelStart[level] + node];
    bool reaches = false;
    if (w.active)
    {
      const double largest = double(low.w) * double(low.w);
      const double reach = mode == SmoothingLengthMode::Gather ? w.ownSquared
        : mode == SmoothingLengthMode::Scatter                 ? largest
                                                               : fmax(w.ownSquared, largest);
      reaches = squaredDistanceToBox(w.x, low, high) <= reach;
    }
    const unsigned reaching = __ballot_sync(0xffffffffu, reaches);
    ++tested;
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
    visit(node, reaching);
  }
  return tested;
}

/// One warp per cluster of queries, in tree order (see the header comment). `op` is a
/// RadiusOperation whose rule has cellSize 1 (frame units are input units) and whose source
/// arrays are in tree order. Neighboring warps share most of their source clusters in cache:
/// ordering the warps by decreasing work instead (a walk without the pairs first) was measured
/// slower (4M clustered Gather density 62 -> 72 ms).
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
  const WarpQueries<Op> w(tree, op, cluster, lane);
  RegisterSums<Op> acc;
  unsigned long long tiles = 0, byQuery = 0, rounds = 0;
  const unsigned tested = forEachReachedCluster(tree, op.rule.mode, w, [&](int node, unsigned reaching) {
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
    if (__popc(reaching) < tree.byQueryLanes)
    {
      ++byQuery;
      rounds += __popc(reaching);
      clusterByQuery(op, reaching, w.x, w.state, w.ownSquared, mine, myWeight, begin + lane, lane < size, acc);
    }
    else
    {
      ++tiles;
      clusterByTile(op, staged[warp], stagedWeight[warp], begin, size, w.active, w.x, w.state, w.ownSquared, acc);
    }
  });
  if (w.active)
  {
    acc.finish(op, cluster * radiusTreeCluster + lane, static_cast<int>(w.q));
  }
  if (tree.stats && lane == 0)
  {
    atomicAdd(tree.stats, 1ull);
    atomicAdd(tree.stats + 1, static_cast<unsigned long long>(tested));
    atomicAdd(tree.stats + 2, tiles);
    atomicAdd(tree.stats + 3, byQuery);
    atomicAdd(tree.stats + 4, rounds);
    atomicMax(tree.stats + 5, tiles + byQuery);
  }
}

/// The search on the run's stream: `op` complete but for its frame and the tree's arrays.
template <class Op>
void launchRadiusTreeSearch(CudaRun& run, CudaRadiusTree& tree, Op op)
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
  RadiusTreeView withStats = view;
  if (const char* knob = std::getenv("NEIGHBORGRID_TREE_BY_QUERY_LANES"))
  {
    withStats.byQueryLanes = std::atoi(knob); // benchmarking knob
  }
  const bool printStats = std::getenv("NEIGHBORGRID_TREE_STATS") != nullptr;
  if (printStats)
  {
    NG_CUDA_CHECK(cudaMallocAsync(&withStats.stats, radiusTreeStats * sizeof(unsigned long long), run.stream),
      "statistics");
    NG_CUDA_CHECK(cudaMemsetAsync(withStats.stats, 0, radiusTreeStats * sizeof(unsigned long long), run.stream),
      "statistics");
  }
  radiusTreeSearch<<<blocks, 32 * radiusTreeWarps, 0, run.stream>>>(withStats, op);
  if (printStats)
  {
    unsigned long long host[radiusTreeStats];
    NG_CUDA_CHECK(cudaMemcpyAsync(host, withStats.stats, sizeof host, cudaMemcpyDeviceToHost, run.stream), "statistics");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "statistics");
    NG_CUDA_CHECK(cudaFreeAsync(withStats.stats, run.stream), "statistics");
    std::fprintf(stderr, "radius tree:");
    for (int k = 0; k < radiusTreeStats; ++k)
    {
      std::fprintf(stderr, " %s %llu;", radiusTreeStatNames[k], host[k]);
    }
    std::fprintf(stderr, "\n");
  }
}

#endif

} // namespace detail
} // namespace neighborgrid
