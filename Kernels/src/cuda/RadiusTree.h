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
//    all 32 sources in float into a mask, then decides its kept pairs in double and takes them;
//  - query by query where fewer than 8 lanes reach it: the warp tests one query against the 32
//    sources at once and sums across lanes. A query whose sphere holds a dense core (Gather at a
//    cluster's edge) then costs its pairs / 32, not its pairs.
// A lane whose sphere (its own radius: Gather, Symmetric) holds a whole node of 2048 or 16384
// sources (levels 2 and 3), and every lane of a warp that has visited 512 clusters, does not walk
// such a node: it queues it as a range (DeferredRanges), and a second kernel spreads the ranges
// over all warps. A warp of queries around a dense core (Gather's 630,000 sources for one lane at
// a cluster's edge) would otherwise run long after the rest (4M clustered Gather 63 -> 17 ms).
// Count and density walk Symmetric and Scatter from one side (TreePairs), Gather's walk by the
// lane's own sphere, and push a pair's terms to the particle at the far side:
//  - Symmetric takes each pair once, by the side of the larger radius (r <= max(R_i, R_j) is then
//    r <= its own radius), skipping nodes whose radii are all larger than the lane's; the terms go
//    to both sides (4M clustered 29.1 -> 17.8 ms);
//  - Scatter walks from each source's own sphere (r <= R_j) and pushes w_j W(r, R_j) to the
//    particles it reaches, instead of a walk by each box's largest radius.
// The walker's side sums in registers; the far side's sums across the warp, then once per visited
// cluster into the tree's `pushed` sums in double, added to the results at the end (PushedTerms).
// Exactness: every pair taken is decided in double from the caller's coordinates (PairTest.h's
// definition, no band). The float tests before it only cull: a box test bounds the distance from
// below with every rounding directed down (squaredDistanceToBoxBelow), and the tile's test keeps
// every pair within a slack larger than its rounding (radiusTreeFloatSlack), so neither drops a
// neighbor. Included only by .cu files.
#pragma once

#include "CudaRun.h"

#include <cfloat>
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

/// Nodes a query's walk leaves to radiusTreeDeferredRanges (the header comment says which).
/// A query that queues takes a slot: the sums of its ranges gather there in double and are added
/// to its own at the end. Where either queue is full the walk takes the node itself.
struct DeferredRanges
{
  int fromLevel = 2;                        // nodes of this level and the next are queued; 0: never
  int warpBudget = 512;                     // clusters a warp visits before it queues every such node
  int2* __restrict__ items = nullptr;       // (slot, level << 27 | node)
  int itemCapacity = 0;
  std::int32_t* __restrict__ slotQuery = nullptr; // slot -> query (tree order)
  int slotCapacity = 0;
  double* __restrict__ sums = nullptr;      // slotCapacity x Terms
  int* __restrict__ counters = nullptr;     // items queued, slots taken (may pass the capacities)
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
  const float4* __restrict__ low = nullptr;  // per node: lower corner (rounded down), largest radius (up)
  const float4* __restrict__ high = nullptr; // per node: upper corner (rounded up), smallest radius (down)
  // A search that walks from one side (TreePairs::Once, Reversed; PushedTerms): what each
  // particle receives from the walkers, Terms a particle in tree order, in double; else null.
  double* __restrict__ pushed = nullptr;
  // NEIGHBORGRID_TREE_STATS: per search, the warps' totals (radiusTreeStatNames), else null.
  unsigned long long* stats = nullptr;
  // Clusters fewer lanes reach go query by query (clusterByQuery). 4M clustered, Gather / Scatter /
  // Symmetric density, ms: 4 lanes 16.5 / 25.6 / 29.8, 8 16.2 / 25.2 / 29.1, 16 16.9 / 25.8 / 29.2.
  int byQueryLanes = 8;
  DeferredRanges deferred;
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
  /// Empty queues of deferred ranges for a search of `terms` sums a query (DeferredRanges).
  void prepareDeferred(CudaRun& run, int terms);
  /// Cleared sums for what particles receive in a search that walks from one side (PushedTerms).
  void preparePushed(CudaRun& run, int terms);
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
  DeviceBuffer<int2> deferredItems_;
  DeviceBuffer<std::int32_t> slotQuery_;
  DeviceBuffer<double> deferredSums_;
  DeviceBuffer<int> deferredCounters_;
  DeviceBuffer<double> pushed_;
  RadiusTreeView view_;
  bool hasRadii_ = false;
};

#if defined(__CUDACC__)

/// Whose side a search walks from, and where a pair's terms go.
enum class TreePairs
{
  Direct,  // every pair from the query's side by the mode's whole rule; terms to the query
  Once,    // Symmetric count and density: each pair once, from the side of the larger radius (its own
           // sphere decides); terms to both sides
  Reversed // Scatter count and density: from the source's side, by its own sphere (Gather's walk);
           // terms pushed to the query
};

// Warps a block. 4 rather than 8, one call, each twice: 4M clustered Scatter density 24.9 against
// 25.2-25.3 ms, the fixed-R gradient 370-371 against 379; Gather and Symmetric the same.
constexpr int radiusTreeWarps = 4;

/// A lower bound of the squared distance from a point to the box, in float: per axis the gap from
/// the point's float bracket [below, above] to the box, every operation rounded down. Against a
/// threshold rounded up it never culls a box that holds a neighbor: the double distance to any
/// point inside is at least the exact one within a few units of 2^-53, less than a float's spacing.
__device__ __forceinline__ float squaredDistanceToBoxBelow(const float4& below, const float4& above,
  const float4& low, const float4& high)
{
  // NaN (inf - inf, points beyond float's range) becomes 0: fmaxf takes the other operand.
  const float ex = fmaxf(fmaxf(__fsub_rd(low.x, above.x), __fsub_rd(below.x, high.x)), 0.0f);
  const float ey = fmaxf(fmaxf(__fsub_rd(low.y, above.y), __fsub_rd(below.y, high.y)), 0.0f);
  const float ez = fmaxf(fmaxf(__fsub_rd(low.z, above.z), __fsub_rd(below.z, high.z)), 0.0f);
  return __fadd_rd(__fadd_rd(__fmul_rd(ex, ex), __fmul_rd(ey, ey)), __fmul_rd(ez, ez));
}

/// The squared distance from a point to the box's farthest corner, in float (a heuristic: which
/// nodes to defer; every deferred pair is still decided in double).
__device__ __forceinline__ float squaredDistanceToFarCorner(const float4& x, const float4& low, const float4& high)
{
  const float fx = fmaxf(x.x - low.x, high.x - x.x);
  const float fy = fmaxf(x.y - low.y, high.y - x.y);
  const float fz = fmaxf(x.z - low.z, high.z - x.z);
  return fx * fx + fy * fy + fz * fz;
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

/// The terms of every lane summed across the warp and added to lane `from`'s sums.
template <class Op>
__device__ __forceinline__ void addAcrossWarpTo(int from, typename Op::Value (&t)[Op::Terms], RegisterSums<Op>& acc)
{
  for (int k = 0; k < Op::Terms; ++k)
  {
    for (int offset = 16; offset > 0; offset >>= 1)
    {
      t[k] += __shfl_xor_sync(0xffffffffu, t[k], offset);
    }
  }
  if ((threadIdx.x & 31) == from)
  {
    acc.addTerms(t);
  }
}

/// One cluster of sources against the warp's queries, where few lanes reach it: lane by lane,
/// the warp tests that query against the 32 sources at once (one a lane) and sums the terms
/// across the warp. A query whose sphere holds a dense core then costs its pairs / 32.
template <class Op>
__device__ __forceinline__ void clusterByQuery(const Op& op, unsigned reaching, const double x[3],
  const typename Op::Query& state, double ownSquared, const TreePoint& mine, float myWeight, int mySource,
  bool haveSource, RegisterSums<Op>& acc)
{
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
    addAcrossWarpTo(from, t, acc);
  }
}

/// The tile's float pre-test keeps a pair where its float distance from the cluster's corner is
/// within rho^2 (1 + c) + c K, K = sum over axes of (|query offset| + box extent)^2. Every float
/// rounding on the way (the offsets, their difference, the sum of squares, rho^2 itself) moves
/// r^2 by less than 7.1 eps K + eps rho^2, eps = 2^-24, and c = 16 eps covers that with room, so
/// no neighbor is dropped; the pairs kept are then decided in double. NaN (offsets past float's
/// range) keeps the pair too.
constexpr float radiusTreeFloatSlack = 16.0f / 16777216.0f;

/// A query in the frame of a tile's cluster, for its float pre-test: its offset from the cluster's
/// lower corner, and the slack c K of radiusTreeFloatSlack.
struct TileQuery
{
  float q[3];
  float slackK;

  __device__ TileQuery(const double x[3], const float4& corner, const float4& farCorner)
  {
    q[0] = float(__dsub_rn(x[0], double(corner.x)));
    q[1] = float(__dsub_rn(x[1], double(corner.y)));
    q[2] = float(__dsub_rn(x[2], double(corner.z)));
    const float ax = fabsf(q[0]) + (farCorner.x - corner.x), ay = fabsf(q[1]) + (farCorner.y - corner.y),
                az = fabsf(q[2]) + (farCorner.z - corner.z);
    slackK = radiusTreeFloatSlack * fmaf(az, az, fmaf(ay, ay, ax * ax)) + FLT_MIN;
  }
  /// Whether a source at `b` (offset from the corner) may lie within rho^2: false only where it
  /// surely does not.
  __device__ bool mayReach(const float4& b, float rho2) const
  {
    const float dx = q[0] - b.x, dy = q[1] - b.y, dz = q[2] - b.z;
    return !(fmaf(dz, dz, fmaf(dy, dy, dx * dx)) > fmaf(rho2, 1.0f + radiusTreeFloatSlack, slackK));
  }
};

/// One cluster of sources against the warp's queries, where many lanes reach it: every lane
/// tests the 32 staged sources into a mask, in float against a slack that never drops a
/// neighbor, then takes its own pairs, each decided in double, so the lanes that take a pair
/// work together instead of one at a time.
template <class Op>
__device__ __forceinline__ void clusterByTile(const Op& op, const TreePoint* staged, const float4* local,
  const float* weights, int begin, int size, bool active, const float4& corner, const float4& farCorner,
  const double x[3], const typename Op::Query& state, double ownSquared, RegisterSums<Op>& acc)
{
  const SmoothingLengthMode mode = op.rule.mode;
  unsigned kept = 0;
  if (active)
  {
    const TileQuery tile(x, corner, farCorner);
    const float own = float(ownSquared);
#pragma unroll 8
    for (int k = 0; k < size; ++k)
    {
      const float4 b = local[k];
      const float rho2 = mode == SmoothingLengthMode::Gather ? own
        : mode == SmoothingLengthMode::Scatter               ? b.w
                                                             : fmaxf(own, b.w);
      kept |= tile.mayReach(b, rho2) ? 1u << k : 0u;
    }
  }
  while (kept)
  {
    const int k = __ffs(kept) - 1;
    kept &= kept - 1;
    const TreePoint b = staged[k];
    const double r2 = exactSquaredDistance(x[0], x[1], x[2], b.x, b.y, b.z);
    if (takesPair(mode, r2, ownSquared, b.radius))
    {
      typename Op::Value t[Op::Terms];
      pairTerms(op, state, x, b, weights[k], begin + k, r2, t);
      acc.addTerms(t);
    }
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
  float weight = 0.0f; // w_i, what the query adds to a source in a search that takes each pair once

  __device__ WarpQueries(const RadiusTreeView& tree, const Op& op, int s)
  {
    active = s < tree.count;
    if (active)
    {
      const TreePoint p = tree.positions[s];
      x[0] = p.x, x[1] = p.y, x[2] = p.z;
      q = tree.orderToInput[s];
      state = op.query(q);
      ownSquared = state.radius * state.radius;
      weight = tree.weights[s];
    }
  }
};

/// A query as the float box tests see it: its coordinates rounded down (below) and up (above),
/// its own radius squared rounded up (below.w) and its own radius rounded up (above.w).
struct QueryBox
{
  float4 below, above;
};

template <class Op>
__device__ __forceinline__ QueryBox queryBoxOf(const WarpQueries<Op>& w)
{
  return QueryBox{ make_float4(__double2float_rd(w.x[0]), __double2float_rd(w.x[1]), __double2float_rd(w.x[2]),
                     __double2float_ru(w.ownSquared)),
    make_float4(__double2float_ru(w.x[0]), __double2float_ru(w.x[1]), __double2float_ru(w.x[2]),
      __double2float_ru(w.state.radius)) };
}

/// A lane's queued ranges (DeferredRanges): its slot, and the end of the clusters of the node it
/// queued last. The walk is depth first in cluster order, so every node it tests later starts at
/// or after that node: the lane skips those that start before the end.
struct LaneDeferral
{
  int slot = -1; // -1: none yet, -2: no slot left
  int skipEnd = 0;

  __device__ bool skips(int firstCluster) const { return firstCluster < skipEnd; }

  /// Queues the node for query s, if a slot and an item are left.
  __device__ bool queue(const DeferredRanges& d, int s, int level, int node)
  {
    if (slot == -1)
    {
      const int taken = atomicAdd(d.counters + 1, 1);
      slot = taken < d.slotCapacity ? taken : -2;
      if (slot >= 0)
      {
        d.slotQuery[slot] = s;
      }
    }
    if (slot < 0)
    {
      return false;
    }
    const int item = atomicAdd(d.counters, 1);
    if (item >= d.itemCapacity)
    {
      return false;
    }
    d.items[item] = make_int2(slot, (level << 27) | node);
    skipEnd = (node + 1) << (3 * level);
    return true;
  }
};

/// Whether the lane's sphere reaches the box by the mode (its own radius, the box's largest, or
/// either), in float rounded so that no neighbor's box is culled (squaredDistanceToBoxBelow).
/// Walking from one side (TreePairs::Once, Reversed): its own sphere; Once only where the box
/// holds a radius no larger than its own.
template <TreePairs Pairs>
__device__ __forceinline__ bool laneReaches(SmoothingLengthMode mode, const QueryBox& query, const float4& low,
  const float4& high)
{
  if (Pairs != TreePairs::Direct)
  {
    return (Pairs == TreePairs::Reversed || high.w <= query.above.w) &&
      squaredDistanceToBoxBelow(query.below, query.above, low, high) <= query.below.w;
  }
  const float largest = __fmul_ru(low.w, low.w);
  const float reach = mode == SmoothingLengthMode::Gather ? query.below.w
    : mode == SmoothingLengthMode::Scatter                 ? largest
                                                           : fmaxf(query.below.w, largest);
  return squaredDistanceToBoxBelow(query.below, query.above, low, high) <= reach;
}

/// Which side of a Symmetric pair takes it, in a search that takes each pair once: the side of the
/// larger radius, whose own sphere then decides the pair (r <= max(R_i, R_j) = its own); of equal
/// radii the lower tree index. Both sides hold the same radii as the same doubles.
__device__ __forceinline__ bool largerRadiusTakes(double radius, int index, double otherRadius, int otherIndex)
{
  return radius > otherRadius || (radius == otherRadius && index <= otherIndex);
}

/// In a search that walks from one side (TreePairs::Once, Reversed), whether the walker (its
/// state, own radius squared, weight w and tree index s) takes its pair with particle b (tree
/// index j, weight wb) at squared distance r2, and the terms: t the walker's own (Once; t must be
/// zero on entry and stays zero where not taken), u what b receives. Returns whether b receives u.
template <TreePairs Pairs, class Op>
__device__ __forceinline__ bool walkerTakes(const Op& op, const typename Op::Query& state, double ownSquared, float w,
  int s, const TreePoint& b, float wb, int j, double r2, typename Op::Value (&t)[Op::Terms],
  typename Op::Value (&u)[Op::Terms])
{
  static_assert(Pairs != TreePairs::Direct, "a search from one side");
  if (!(r2 <= ownSquared))
  {
    return false;
  }
  if constexpr (Pairs == TreePairs::Once)
  {
    if (!largerRadiusTakes(state.radius, s, b.radius, j))
    {
      return false;
    }
    op.pairBothWays(t, u, state, w, j, Particle{ float(b.x), float(b.y), float(b.z), wb }, static_cast<float>(r2));
    return s != j; // the self pair adds to the walker alone
  }
  else
  {
    op.pairScattered(u, state, w, static_cast<float>(r2));
    return true; // the self pair too: the walker receives its own term
  }
}

/// In a search that walks from one side: what a lane's particle (one of the cluster in hand)
/// receives from the walkers that take a pair with it. The terms but the last in float, the last
/// (the neighbors) as a count; added to the tree's `pushed` sums, in double, once the cluster is
/// done.
template <class Op>
struct PushedTerms
{
  using Value = typename Op::Value;
  static constexpr int Sums = Op::Terms - 1;
  float sum[Sums > 0 ? Sums : 1] = {};
  int count = 0;

  __device__ void add(const Value (&u)[Op::Terms])
  {
    for (int k = 0; k < Sums; ++k)
    {
      sum[k] += float(u[k]);
    }
    ++count;
  }

  /// The terms of the lanes in `pushing` (those that took a pair with source k) summed across the
  /// warp; lane k keeps them.
  __device__ void addAcrossWarp(const Value (&u)[Op::Terms], bool took, unsigned pushing, int k)
  {
    const bool one = (pushing & (pushing - 1)) == 0;
    for (int t = 0; t < Sums; ++t)
    {
      float v = took ? float(u[t]) : 0.0f;
      if (one)
      {
        v = __shfl_sync(0xffffffffu, v, __ffs(pushing) - 1);
      }
      else
      {
        for (int offset = 16; offset > 0; offset >>= 1)
        {
          v += __shfl_xor_sync(0xffffffffu, v, offset);
        }
      }
      sum[t] += (threadIdx.x & 31) == k ? v : 0.0f;
    }
    count += (threadIdx.x & 31) == k ? __popc(pushing) : 0;
  }

  __device__ void flush(double* pushed, int source)
  {
    if (count == 0)
    {
      return;
    }
    double* to = pushed + std::int64_t(source) * Op::Terms;
    for (int k = 0; k < Sums; ++k)
    {
      atomicAdd(to + k, double(sum[k]));
      sum[k] = 0.0f;
    }
    atomicAdd(to + Sums, double(count));
    count = 0;
  }
};

/// clusterByQuery for a search that walks from one side (TreePairs::Once, Reversed): lane k's
/// particle receives its side of every pair the walker takes with it.
template <TreePairs Pairs, class Op>
__device__ __forceinline__ void clusterByQueryPushing(const Op& op, unsigned reaching, const WarpQueries<Op>& w, int s,
  const TreePoint& mine, float myWeight, int mySource, bool haveSource, RegisterSums<Op>& acc, PushedTerms<Op>& pushed)
{
  const int firstQuery = s - (threadIdx.x & 31);
  while (reaching)
  {
    const int from = __ffs(reaching) - 1;
    reaching &= reaching - 1;
    const double q[3] = { fromLane(w.x[0], from), fromLane(w.x[1], from), fromLane(w.x[2], from) };
    const typename Op::Query theirs = fromLane(w.state, from);
    const double theirSquared = fromLane(w.ownSquared, from);
    const float theirWeight = fromLane(w.weight, from);
    typename Op::Value t[Op::Terms], u[Op::Terms];
    for (int k = 0; k < Op::Terms; ++k)
    {
      t[k] = 0;
    }
    if (haveSource)
    {
      const double r2 = exactSquaredDistance(q[0], q[1], q[2], mine.x, mine.y, mine.z);
      if (walkerTakes<Pairs>(op, theirs, theirSquared, theirWeight, firstQuery + from, mine, myWeight, mySource, r2, t, u))
      {
        pushed.add(u);
      }
    }
    if (Pairs == TreePairs::Once)
    {
      addAcrossWarpTo(from, t, acc);
    }
  }
}

/// clusterByTile for a search that walks from one side (TreePairs::Once, Reversed): a lane keeps
/// the particles its own sphere reaches (Once: of a radius no larger than its own); the warp then
/// goes particle by particle through those any lane kept (every lane's pair with it decided in
/// double at once) and sums what the particle receives across the warp.
template <TreePairs Pairs, class Op>
__device__ __forceinline__ void clusterByTilePushing(const Op& op, const TreePoint* staged, const float4* local,
  const float* weights, int begin, int size, bool active, const float4& corner, const float4& farCorner,
  const WarpQueries<Op>& w, int s, RegisterSums<Op>& acc, PushedTerms<Op>& pushed)
{
  unsigned kept = 0;
  if (active)
  {
    const TileQuery tile(w.x, corner, farCorner);
    const float own = float(w.ownSquared);
#pragma unroll 8
    for (int k = 0; k < size; ++k)
    {
      const float4 b = local[k];
      // b.w and own are the radii squared rounded to nearest: a radius no larger stays no larger.
      kept |= tile.mayReach(b, own) && !(Pairs == TreePairs::Once && b.w > own) ? 1u << k : 0u;
    }
  }
  unsigned pending = __reduce_or_sync(0xffffffffu, kept);
  while (pending)
  {
    const int k = __ffs(pending) - 1;
    pending &= pending - 1;
    typename Op::Value t[Op::Terms], u[Op::Terms];
    for (int m = 0; m < Op::Terms; ++m)
    {
      t[m] = 0;
    }
    bool took = false;
    if ((kept >> k) & 1u)
    {
      const TreePoint b = staged[k];
      const double r2 = exactSquaredDistance(w.x[0], w.x[1], w.x[2], b.x, b.y, b.z);
      took = walkerTakes<Pairs>(op, w.state, w.ownSquared, w.weight, s, b, weights[k], begin + k, r2, t, u);
    }
    if (Pairs == TreePairs::Once)
    {
      acc.addTerms(t);
    }
    const unsigned pushing = __ballot_sync(0xffffffffu, took);
    if (pushing)
    {
      pushed.addAcrossWarp(u, took, pushing, k);
    }
  }
}

/// Nodes the walk's stack holds at most: 7 siblings a level and the node in hand.
constexpr int radiusTreeStack = 8 * 12;

/// Walks the tree once for the warp's queries: visit(cluster, reaching lanes) for every cluster
/// of sources some lane's sphere reaches (by the mode), but for the nodes a lane queued instead
/// (DeferredRanges). Returns the nodes tested. (A stack in shared memory, a node's children
/// pushed in one store, was measured slower: 4M Scatter density 28.6 ms against 27.2.)
template <TreePairs Pairs, class Op, class Visit>
__device__ __forceinline__ unsigned forEachReachedCluster(const RadiusTreeView& tree, SmoothingLengthMode mode,
  const WarpQueries<Op>& w, const QueryBox& query, int s, Visit visit)
{
  // Nodes to test, the same in every lane: the level in the top 4 bits, then the node.
  int stack[radiusTreeStack];
  int top = 0;
  unsigned tested = 0;
  LaneDeferral deferral;
  const int deferFrom = tree.deferred.fromLevel;
  int visited = 0; // clusters
  stack[top++] = ((tree.levels - 1) << 27) | 0;
  while (top > 0)
  {
    const int entry = stack[--top];
    const int level = entry >> 27, node = entry & ((1 << 27) - 1);
    const float4 low = tree.low[tree.levelStart[level] + node];
    const float4 high = tree.high[tree.levelStart[level] + node];
    bool reaches = w.active && !deferral.skips(node << (3 * level)) && laneReaches<Pairs>(mode, query, low, high);
    if (reaches && deferFrom > 0 && (level == deferFrom || level == deferFrom + 1))
    {
      // Inside the lane's own sphere (Gather, Symmetric, any walk from one side: every pair of it
      // taken), or any node once the warp has visited its budget of clusters.
      const bool ownSphere = Pairs != TreePairs::Direct || mode != SmoothingLengthMode::Scatter;
      const bool heavy = visited >= tree.deferred.warpBudget ||
        (ownSphere && squaredDistanceToFarCorner(query.above, low, high) <= query.below.w);
      reaches = !(heavy && deferral.queue(tree.deferred, s, level, node));
    }
    const unsigned reaching = __ballot_sync(0xffffffffu, reaches);
    ++tested;
    if (!reaching)
    {
      continue;
    }
    if (level > 0)
    {
      // The first child on top, so that the walk goes in cluster order (LaneDeferral).
      const int first = node * radiusTreeFanOut;
      const int last = min(first + radiusTreeFanOut, tree.levelCount[level - 1]);
      for (int child = last - 1; child >= first; --child)
      {
        stack[top++] = ((level - 1) << 27) | child;
      }
      continue;
    }
    ++visited;
    visit(node, reaching);
  }
  return tested;
}

/// One warp per cluster of queries, in tree order (see the header comment). `op` is a
/// RadiusOperation whose rule has cellSize 1 (frame units are input units) and whose source
/// arrays are in tree order. Neighboring warps share most of their source clusters in cache:
/// ordering the warps by decreasing work instead (a walk without the pairs first) was measured
/// slower (4M clustered Gather density 62 -> 72 ms).
/// Sums of more than 4 terms (Shepard of 3-4 components, gradients of 2-4) are held to 24 warps an
/// SM (at most 85 registers): left free, the 3-component gradient took 90 and ran 16 (4M fixed-R
/// gradient 385 ms held, 415 free, blocks of 8 warps).
/// Pairs: whose side the warp's walk is and where the terms go (TreePairs).
template <class Op, TreePairs Pairs>
__global__ void __launch_bounds__(32 * radiusTreeWarps, Op::Terms > 4 ? 24 / radiusTreeWarps : 0)
  radiusTreeSearch(RadiusTreeView tree, Op op)
{
  __shared__ TreePoint staged[radiusTreeWarps][radiusTreeCluster];
  __shared__ float stagedWeight[radiusTreeWarps][radiusTreeCluster];
  // The tile's sources for its float pre-test: offsets from the cluster's lower corner and the
  // radius squared.
  __shared__ float4 stagedLocal[radiusTreeWarps][radiusTreeCluster];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cluster = blockIdx.x * radiusTreeWarps + warp;
  if (cluster >= tree.levelCount[0])
  {
    return; // the whole warp
  }
  const int s = cluster * radiusTreeCluster + lane;
  const WarpQueries<Op> w(tree, op, s);
  const QueryBox query = queryBoxOf(w);
  RegisterSums<Op> acc;
  PushedTerms<Op> pushed;
  unsigned long long tiles = 0, byQuery = 0, rounds = 0;
  const unsigned tested =
    forEachReachedCluster<Pairs>(tree, op.rule.mode, w, query, s, [&](int node, unsigned reaching) {
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
      if constexpr (Pairs != TreePairs::Direct)
      {
        clusterByQueryPushing<Pairs>(op, reaching, w, s, mine, myWeight, begin + lane, lane < size, acc, pushed);
      }
      else
      {
        clusterByQuery(op, reaching, w.x, w.state, w.ownSquared, mine, myWeight, begin + lane, lane < size, acc);
      }
    }
    else
    {
      ++tiles;
      const float4 corner = tree.low[node], farCorner = tree.high[node];
      if (lane < size)
      {
        stagedLocal[warp][lane] = make_float4(float(__dsub_rn(mine.x, double(corner.x))),
          float(__dsub_rn(mine.y, double(corner.y))), float(__dsub_rn(mine.z, double(corner.z))),
          float(mine.radius * mine.radius));
      }
      __syncwarp();
      // Only the lanes that reach it: a lane that queued the node holding it takes its pairs there.
      if constexpr (Pairs != TreePairs::Direct)
      {
        clusterByTilePushing<Pairs>(op, staged[warp], stagedLocal[warp], stagedWeight[warp], begin, size,
          (reaching >> lane) & 1u, corner, farCorner, w, s, acc, pushed);
      }
      else
      {
        clusterByTile(op, staged[warp], stagedLocal[warp], stagedWeight[warp], begin, size, (reaching >> lane) & 1u,
          corner, farCorner, w.x, w.state, w.ownSquared, acc);
      }
    }
    if (Pairs != TreePairs::Direct && lane < size)
    {
      pushed.flush(tree.pushed, begin + lane);
    }
  });
  if (w.active)
  {
    acc.finish(op, s, static_cast<int>(w.q));
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

/// A deferred range's pair of query s (w) and source j, decided as the walk decides it. Walking
/// from one side, what j receives goes straight to the tree's `pushed` sums.
template <TreePairs Pairs, class Op>
__device__ __forceinline__ void takeDeferredPair(const RadiusTreeView& tree, const Op& op, const WarpQueries<Op>& w,
  int s, int j, RegisterSums<Op>& acc)
{
  const TreePoint b = tree.positions[j];
  const double r2 = exactSquaredDistance(w.x[0], w.x[1], w.x[2], b.x, b.y, b.z);
  typename Op::Value t[Op::Terms];
  if constexpr (Pairs != TreePairs::Direct)
  {
    typename Op::Value u[Op::Terms];
    for (int k = 0; k < Op::Terms; ++k)
    {
      t[k] = 0;
    }
    if (walkerTakes<Pairs>(op, w.state, w.ownSquared, w.weight, s, b, tree.weights[j], j, r2, t, u))
    {
      double* to = tree.pushed + std::int64_t(j) * Op::Terms;
      for (int k = 0; k + 1 < Op::Terms; ++k)
      {
        atomicAdd(to + k, double(u[k]));
      }
      atomicAdd(to + Op::Terms - 1, 1.0);
    }
    if (Pairs == TreePairs::Once)
    {
      acc.addTerms(t);
    }
  }
  else if (takesPair(op.rule.mode, r2, w.ownSquared, b.radius))
  {
    pairTerms(op, w.state, w.x, b, tree.weights[j], j, r2, t);
    acc.addTerms(t);
  }
}

/// The queued ranges (DeferredRanges), one warp a range in turn: the node's clusters against the
/// range's query, 32 boxes tested at once, each pair of a reached cluster decided in double as the
/// walk decides it; the warp's sums go to the query's slot in double.
template <class Op, TreePairs Pairs>
__global__ void __launch_bounds__(32 * radiusTreeWarps) radiusTreeDeferredRanges(RadiusTreeView tree, Op op)
{
  const DeferredRanges& d = tree.deferred;
  const int lane = threadIdx.x & 31;
  const int items = min(d.counters[0], d.itemCapacity);
  const int warps = gridDim.x * radiusTreeWarps;
  for (int item = blockIdx.x * radiusTreeWarps + (threadIdx.x >> 5); item < items; item += warps)
  {
    const int2 work = d.items[item];
    const int level = work.y >> 27, node = work.y & ((1 << 27) - 1);
    const int s = d.slotQuery[work.x];
    const WarpQueries<Op> w(tree, op, s);
    const QueryBox query = queryBoxOf(w);
    const int firstCluster = node << (3 * level);
    const int lastCluster = min(tree.levelCount[0], firstCluster + (1 << (3 * level)));
    RegisterSums<Op> acc;
    for (int chunk = firstCluster; chunk < lastCluster; chunk += 32)
    {
      // A cluster a lane: which of the next 32 the query's sphere reaches; then each reached
      // cluster's 32 sources, one a lane.
      const int mine = chunk + lane;
      unsigned reached = __ballot_sync(0xffffffffu,
        mine < lastCluster && laneReaches<Pairs>(op.rule.mode, query, tree.low[mine], tree.high[mine]));
      while (reached)
      {
        const int j = (chunk + __ffs(reached) - 1) * radiusTreeCluster + lane;
        reached &= reached - 1;
        if (j < tree.count)
        {
          takeDeferredPair<Pairs>(tree, op, w, s, j, acc);
        }
      }
    }
    for (int k = 0; k < Op::Terms; ++k)
    {
      double sum = double(acc.sum[k]);
      if constexpr (RegisterSums<Op>::compensated)
      {
        sum -= double(acc.carry[k]);
      }
      for (int offset = 16; offset > 0; offset >>= 1)
      {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      if (lane == 0)
      {
        atomicAdd(d.sums + std::int64_t(work.x) * Op::Terms + k, sum);
      }
    }
  }
}

/// Each slot's sums added to its query's own (the walk wrote those).
template <class Op>
__global__ void addDeferredSums(RadiusTreeView tree, Op op)
{
  const DeferredRanges& d = tree.deferred;
  const int slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= min(d.counters[1], d.slotCapacity))
  {
    return;
  }
  const std::int64_t q = tree.orderToInput[d.slotQuery[slot]];
  for (int k = 0; k < Op::Terms; ++k)
  {
    typename Op::Value& out = op.output[q * Op::Terms + k];
    out = static_cast<typename Op::Value>(double(out) + d.sums[std::int64_t(slot) * Op::Terms + k]);
  }
}

/// What the sources received in a search that takes each pair once, added to their results.
template <class Op>
__global__ void addPushedSums(RadiusTreeView tree, Op op)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= tree.count)
  {
    return;
  }
  const std::int64_t q = tree.orderToInput[s];
  for (int k = 0; k < Op::Terms; ++k)
  {
    typename Op::Value& out = op.output[q * Op::Terms + k];
    out = static_cast<typename Op::Value>(double(out) + tree.pushed[std::int64_t(s) * Op::Terms + k]);
  }
}

/// The search's kernels in turn: the walk, the deferred ranges, their sums, and (walking from one
/// side) what the particles received.
template <TreePairs Pairs, class Op>
void launchRadiusTreeKernels(CudaRun& run, const RadiusTreeView& view, const Op& op)
{
  const int blocks = (view.levelCount[0] + radiusTreeWarps - 1) / radiusTreeWarps;
  radiusTreeSearch<Op, Pairs><<<blocks, 32 * radiusTreeWarps, 0, run.stream>>>(view, op);
  NG_CUDA_CHECK_LAUNCH("radius tree search");
  // As many warps as stay resident; each takes ranges in turn until none is left.
  const int rangeBlocks = std::min(blocks, 8 * (run.device ? run.device->multiprocessors : 1));
  radiusTreeDeferredRanges<Op, Pairs><<<rangeBlocks, 32 * radiusTreeWarps, 0, run.stream>>>(view, op);
  NG_CUDA_CHECK_LAUNCH("radius tree deferred ranges");
  addDeferredSums<<<blocksFor(view.deferred.slotCapacity), 256, 0, run.stream>>>(view, op);
  NG_CUDA_CHECK_LAUNCH("radius tree deferred sums");
  if (Pairs != TreePairs::Direct)
  {
    addPushedSums<<<blocksFor(view.count), 256, 0, run.stream>>>(view, op);
    NG_CUDA_CHECK_LAUNCH("radius tree pushed sums");
  }
}

/// The search on the run's stream: `op` complete but for its frame and the tree's arrays.
template <class Op>
void launchRadiusTreeSearch(CudaRun& run, CudaRadiusTree& tree, Op op)
{
  if (tree.view().count == 0)
  {
    return;
  }
  tree.prepareDeferred(run, Op::Terms);
  // Symmetric and Scatter count and density walk from one side (TreePairs). NEIGHBORGRID_TREE_PUSH=0
  // (a benchmarking knob) walks every pair from the query's side instead.
  const char* pushKnob = std::getenv("NEIGHBORGRID_TREE_PUSH");
  TreePairs pairs = TreePairs::Direct;
  if (Op::pushesTerms && !(pushKnob && std::atoi(pushKnob) == 0))
  {
    pairs = op.rule.mode == SmoothingLengthMode::Symmetric ? TreePairs::Once
      : op.rule.mode == SmoothingLengthMode::Scatter       ? TreePairs::Reversed
                                                           : TreePairs::Direct;
  }
  if (pairs != TreePairs::Direct)
  {
    tree.preparePushed(run, Op::Terms);
  }
  const RadiusTreeView& view = tree.view();
  op.rule.cellSize = 1.0f;
  op.rule.inverseCellSize = 1.0f;
  op.rule.frameScale = 1.0;
  op.rule.band = 0.0f;
  op.rule.sources = run.input;
  op.rule.orderToInput = view.orderToInput;
  op.rule.sourceRadii = tree.radiiInTreeOrder();
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
  if constexpr (Op::pushesTerms)
  {
    if (pairs == TreePairs::Once)
    {
      launchRadiusTreeKernels<TreePairs::Once>(run, withStats, op);
    }
    else if (pairs == TreePairs::Reversed)
    {
      launchRadiusTreeKernels<TreePairs::Reversed>(run, withStats, op);
    }
    else
    {
      launchRadiusTreeKernels<TreePairs::Direct>(run, withStats, op);
    }
  }
  else
  {
    launchRadiusTreeKernels<TreePairs::Direct>(run, withStats, op);
  }
  if (printStats)
  {
    unsigned long long host[radiusTreeStats];
    int queued[2];
    NG_CUDA_CHECK(cudaMemcpyAsync(host, withStats.stats, sizeof host, cudaMemcpyDeviceToHost, run.stream), "statistics");
    NG_CUDA_CHECK(cudaMemcpyAsync(queued, view.deferred.counters, sizeof queued, cudaMemcpyDeviceToHost, run.stream),
      "statistics");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "statistics");
    NG_CUDA_CHECK(cudaFreeAsync(withStats.stats, run.stream), "statistics");
    std::fprintf(stderr, "radius tree:");
    for (int k = 0; k < radiusTreeStats; ++k)
    {
      std::fprintf(stderr, " %s %llu;", radiusTreeStatNames[k], host[k]);
    }
    std::fprintf(stderr,
      " ranges deferred %d of %d asked (room for %d); queries deferring %d of %d asked (room for %d); pairs %s\n",
      std::min(queued[0], view.deferred.itemCapacity), queued[0], view.deferred.itemCapacity,
      std::min(queued[1], view.deferred.slotCapacity), queued[1], view.deferred.slotCapacity,
      pairs == TreePairs::Once ? "each once" : pairs == TreePairs::Reversed ? "from the sources" : "from the queries");
  }
}

#endif

} // namespace detail
} // namespace neighborgrid
