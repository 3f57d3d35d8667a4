// Smoothing Length on the GPU (KthNeighbor.h, ../KthNeighbor.h).
#include "KthNeighbor.h"

#include "../KthNeighbor.h"
#include "GridSearch.cuh"
#include "Morton.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace neighborgrid
{
namespace detail
{
namespace
{

__constant__ KthCellOffset kthOffsets[kthOffsetCount];

constexpr unsigned char noLevel = 255; // not a query (a periodic image, a halo point)
constexpr int levelSlots = 128;        // counters_: queries per level, then three more counts

/// Every point in Morton order of the finest level's cells, counted from an origin aligned to the
/// coarsest level's cells: each cell of every level, and each cell between levels, is then one
/// contiguous run of keys. A query meeting a crowded cell (more than `crowded` points) descends
/// into its sub-cells nearest first and skips those beyond its k-th, instead of testing every
/// point: a background point beside a cluster core tests a few times k points, not the core.
struct KthMorton
{
  const std::uint64_t* keys = nullptr; // sorted
  const std::int32_t* order = nullptr; // Morton position -> input index
  int count = 0;
  double origin[3] = { 0, 0, 0 };      // finest-level cell coordinate of key coordinate 0
  int crowded = INT_MAX;               // cells with more points are descended (INT_MAX: none)
};

/// One level's grid: all points by cells of cellSize, in frame coordinates of their cells.
struct KthGrid
{
  CellTable table;
  const Particle* particles = nullptr;
  const std::int32_t* orderToInput = nullptr;
  InputPoints input;
  InputPoints inOrder; // the input coordinates (as given) in the level's order: a cell's run is contiguous
  double cellSize = 1.0;
  double inverseCellSize = 1.0;
  KthMorton morton;
  int levelsBelow = 0;      // levels finer than this one down to the Morton keys' cells
  bool mortonCells = false; // the grid was built from the Morton order: its positions are Morton positions
};

/// The first position in [begin, end) whose key is not below `key`.
__device__ int firstKeyAtLeast(const std::uint64_t* __restrict__ keys, int begin, int end, std::uint64_t key)
{
  while (begin < end)
  {
    const int middle = begin + (end - begin) / 2;
    if (keys[middle] < key)
    {
      begin = middle + 1;
    }
    else
    {
      end = middle;
    }
  }
  return begin;
}

/// The exact squared distance of input points i and j (PairTest.h's formula), in input units.
__device__ double exactSquared(const KthGrid& g, std::int64_t i, std::int64_t j)
{
  double a[3], b[3];
  g.input.get(i, a[0], a[1], a[2]);
  g.input.get(j, b[0], b[1], b[2]);
  return exactSquaredDistance(a[0], a[1], a[2], b[0], b[1], b[2]);
}

/// The same in squared cell units, rounded to float.
__device__ float exactFrameDistance(const KthGrid& g, std::int64_t i, std::int64_t j)
{
  return float(exactSquared(g, i, j) * g.inverseCellSize * g.inverseCellSize);
}

/// Max-heap of `size` floats at h[0], h[stride], ...: a thread's own column of shared memory.
__device__ __forceinline__ void heapPush(float* h, int stride, int size, float v)
{
  int i = size;
  while (i > 0)
  {
    const int parent = (i - 1) >> 1;
    const float p = h[parent * stride];
    if (p >= v)
    {
      break;
    }
    h[i * stride] = p;
    i = parent;
  }
  h[i * stride] = v;
}

__device__ __forceinline__ void heapReplaceTop(float* h, int stride, int size, float v)
{
  int i = 0;
  for (;;)
  {
    int child = 2 * i + 1;
    if (child >= size)
    {
      break;
    }
    float c = h[child * stride];
    if (child + 1 < size)
    {
      const float right = h[(child + 1) * stride];
      if (right > c)
      {
        ++child;
        c = right;
      }
    }
    if (c <= v)
    {
      break;
    }
    h[i * stride] = c;
    i = child;
  }
  h[i * stride] = v;
}

/// The exact squared distance (PairTest.h's formula, input units) from a query at q to a point as
/// a visit names it: its position in the level's order (>= 0), read from the level's copy of the
/// coordinates, or -1 - its position in the Morton order (a crowded cell's), read from the input.
__device__ __forceinline__ double exactSquaredTo(const KthGrid& g, const double q[3], std::int64_t point)
{
  double b[3];
  if (point >= 0)
  {
    g.inOrder.get(point, b[0], b[1], b[2]);
  }
  else
  {
    g.input.get(g.morton.order[-1 - point], b[0], b[1], b[2]);
  }
  return exactSquaredDistance(q[0], q[1], q[2], b[0], b[1], b[2]);
}

/// Calls visit(point, r2) for every point of the crowded cell `cell` (at its offset, query
/// qs in that cell's frame) whose sub-cell lies within limit2(): the sub-cells from the Morton
/// order, nearest first at each depth, runs of at most `crowded` points (or the finest cells)
/// tested point by point.
template <class Limit, class Visit>
__device__ void visitCrowdedCell(const KthGrid& g, std::int64_t qi, const double cell[3], const Particle& qs,
  int cellBegin, int cellEnd, const Limit& limit2, const Visit& visit)
{
  const KthMorton& mo = g.morton;
  const int below = g.levelsBelow;
  std::uint64_t prefix[3];
  for (int a = 0; a < 3; ++a)
  {
    prefix[a] = static_cast<std::uint64_t>(cell[a] - ldexp(mo.origin[a], -below)); // exact: origin is aligned
  }
  const std::uint64_t cellKey = mortonKey(prefix[0], prefix[1], prefix[2]) << (3 * below);
  struct Node
  {
    int begin, end;
    unsigned left; // children not visited yet, one bit each
  } stack[mortonAxisBits + 1];
  if (g.mortonCells)
  {
    stack[0].begin = cellBegin, stack[0].end = cellEnd; // the grid's cell is this run
  }
  else
  {
    stack[0].begin = firstKeyAtLeast(mo.keys, 0, mo.count, cellKey);
    stack[0].end = firstKeyAtLeast(mo.keys, stack[0].begin, mo.count, cellKey + (std::uint64_t(1) << (3 * below)));
  }
  stack[0].left = 0xffu;
  int depth = 0;
  unsigned node[3] = { 0, 0, 0 }; // the node's coordinates within the cell, in cells of 2^-depth
  for (;;)
  {
    Node& top = stack[depth];
    if (top.left == 0)
    {
      if (depth == 0)
      {
        return;
      }
      --depth;
      node[0] >>= 1, node[1] >>= 1, node[2] >>= 1;
      continue;
    }
    // The nearest child not visited yet; when it lies beyond the limit, so do the others.
    const float size = ldexpf(1.0f, -(depth + 1));
    const float q[3] = { qs.x, qs.y, qs.z };
    int best = 0;
    float bestGap2 = FLT_MAX;
    for (int child = 0; child < 8; ++child)
    {
      if (!(top.left >> child & 1u))
      {
        continue;
      }
      float gap2 = 0.0f;
      for (int a = 0; a < 3; ++a)
      {
        const float lo = float(2 * node[a] + (child >> a & 1)) * size, hi = lo + size;
        const float gap = q[a] < lo ? lo - q[a] : (q[a] > hi ? q[a] - hi : 0.0f);
        gap2 += gap * gap;
      }
      if (gap2 < bestGap2)
      {
        bestGap2 = gap2, best = child;
      }
    }
    top.left &= ~(1u << best);
    if (kthBeyond(bestGap2, limit2()))
    {
      top.left = 0;
      continue;
    }
    const unsigned childAt[3] = { 2 * node[0] + (best & 1), 2 * node[1] + (best >> 1 & 1), 2 * node[2] + (best >> 2 & 1) };
    const int shift = 3 * (below - depth - 1);
    const std::uint64_t childKey = cellKey | mortonKey(childAt[0], childAt[1], childAt[2]) << shift;
    const int begin = firstKeyAtLeast(mo.keys, top.begin, top.end, childKey);
    const int end = firstKeyAtLeast(mo.keys, begin, top.end, childKey + (std::uint64_t(1) << shift));
    if (begin == end)
    {
      continue;
    }
    if (end - begin > mo.crowded && depth + 1 < below)
    {
      ++depth;
      stack[depth].begin = begin, stack[depth].end = end, stack[depth].left = 0xffu;
      node[0] = childAt[0], node[1] = childAt[1], node[2] = childAt[2];
      continue;
    }
    if (g.mortonCells)
    {
      // The grid's own particles: every point of the run lies in `cell`, framed in it.
      for (int j = begin; j < end; ++j)
      {
        if (g.orderToInput[j] == qi)
        {
          continue;
        }
        float r2 = squaredDistance(qs, g.particles[j]);
        if (!(r2 == r2))
        {
          r2 = exactFrameDistance(g, qi, g.orderToInput[j]); // a huge cell (CellGrid.h)
        }
        visit(j, r2);
      }
      continue;
    }
    for (int j = begin; j < end; ++j)
    {
      const std::int32_t input = mo.order[j];
      if (input == qi)
      {
        continue;
      }
      // The point lies in `cell`: its frame as particlesInOrder writes it, without the division.
      double x[3];
      g.input.get(input, x[0], x[1], x[2]);
      const Particle p{ frameCoordinate(x[0], cell[0], g.cellSize, g.inverseCellSize),
        frameCoordinate(x[1], cell[1], g.cellSize, g.inverseCellSize),
        frameCoordinate(x[2], cell[2], g.cellSize, g.inverseCellSize), 1.0f };
      float r2 = squaredDistance(qs, p);
      if (!(r2 == r2))
      {
        r2 = exactFrameDistance(g, qi, input); // a huge cell (CellGrid.h)
      }
      visit(-1 - std::int64_t(j), r2);
    }
  }
}

/// Calls visit(point, r2) for every other point in the cells around query qi (cell c, frame f)
/// whose lower bound lies within limit2() (cell units; limit2 may shrink as the visit goes),
/// nearest cells first. Returns false when the table ran out before the bound passed limit2.
template <class Limit, class Visit>
__device__ bool visitNearCells(const KthGrid& g, std::int64_t qi, const double c[3], const Particle& q, const Limit& limit2,
  const Visit& visit)
{
  const float f[3] = { q.x, q.y, q.z };
  for (int t = 0; t < kthOffsetCount; ++t)
  {
    const KthCellOffset o = kthOffsets[t];
    if (kthBeyond(float(o.lowerBound2), limit2()))
    {
      return true;
    }
    if (kthBeyond(kthCellGap2(f, o.x, o.y, o.z), limit2()))
    {
      continue;
    }
    double cell[3];
    if (!offsetCell(c, o.x, o.y, o.z, cell))
    {
      continue;
    }
    const int m = g.table.find(cell);
    if (m < 0)
    {
      continue;
    }
    const Particle qs = shifted(q, float(o.x), float(o.y), float(o.z));
    const int begin = g.table.start[m], end = g.table.start[m + 1];
    if (end - begin > g.morton.crowded && g.levelsBelow > 0)
    {
      visitCrowdedCell(g, qi, cell, qs, begin, end, limit2, visit);
      continue;
    }
    const bool own = t == 0; // the table starts with the query's own cell
    for (int j = begin; j < end; ++j)
    {
      if (own && g.orderToInput[j] == qi)
      {
        continue;
      }
      float r2 = squaredDistance(qs, g.particles[j]);
      if (!(r2 == r2))
      {
        r2 = exactFrameDistance(g, qi, g.orderToInput[j]); // a huge cell (CellGrid.h)
      }
      visit(j, r2);
    }
  }
  return false;
}

/// The frame-unit limit beyond which a float pair distance r2 (squaredDistance in a cell's frame)
/// lies at or beyond the exact squared distance `squared` (input units): its frame value rounded
/// up, plus the float distance's error bound (kthBand).
__device__ float kthFrameLimit(double squared, double inverseCellSize)
{
  const float frame = __double2float_ru(squared * inverseCellSize * inverseCellSize);
  return frame + kthBand(frame);
}

/// The search of one level: thread i takes query baseOrder[atLevel[i]], the level's queries in
/// base order (neighbors in one warp). Its heap (shared memory) keeps the k smallest support
/// radii, supportRadiusOf(exact squared distance), of the pairs it visits: supportRadiusOf is
/// monotone, so the k-th smallest radius is the radius of the exact k-th distance, the answer,
/// with no second visit. The float distance in the cell's frame rejects a pair that lies clearly
/// beyond the heap's top; the others are measured in double. A query whose k-th may lie beyond
/// the table's reach moves up a level. Three blocks of 256 share a multiprocessor at k = 64 (the
/// heaps fill its shared memory): the bounds keep the registers to what three allow.
__global__ void __launch_bounds__(256, 3) kthNeighborLevel(KthGrid g, const std::int32_t* __restrict__ baseOrder,
  unsigned char* levels, const int* __restrict__ atLevel, int count, unsigned char level, bool coarsest, int k,
  float* __restrict__ out, int* __restrict__ counters, unsigned long long* stats)
{
  extern __shared__ float heaps[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count)
  {
    return;
  }
  const int t = atLevel[i];
  const std::int64_t qi = baseOrder[t];
  double c[3];
  inputCell(g.input, qi, g.cellSize, c);
  const Particle q = inputParticle(g.input, qi, g.cellSize, g.inverseCellSize);
  double at[3];
  g.input.get(qi, at[0], at[1], at[2]);
  float* h = heaps + threadIdx.x;
  const int stride = blockDim.x;

  int size = 0, candidates = 0, measured = 0;
  double kthSquared = HUGE_VAL; // the heap's top squared (exact in double) once it holds k
  float limit = INFINITY;       // kthFrameLimit(kthSquared): farther float pairs cannot enter
  visitNearCells(g, qi, c, q, [&] { return limit; }, [&](std::int64_t point, float r2) {
    ++candidates;
    if (r2 > limit)
    {
      return;
    }
    ++measured;
    const double exact = exactSquaredTo(g, at, point);
    if (size == k && !(exact < kthSquared))
    {
      return; // its radius could not be below the top's
    }
    const float radius = supportRadiusOf(exact);
    if (size < k)
    {
      heapPush(h, stride, size++, radius);
    }
    else if (radius < h[0])
    {
      heapReplaceTop(h, stride, k, radius);
    }
    else
    {
      return;
    }
    if (size == k)
    {
      kthSquared = double(h[0]) * double(h[0]);
      limit = kthFrameLimit(kthSquared, g.inverseCellSize);
    }
  });
  // At the coarsest level every point lies within one cell (even where distances overflow).
  if (size < k || (!coarsest && !kthBeyond(float(kthReach * kthReach), limit)))
  {
    levels[t] = level + 1;
    atomicAdd(counters + level + 1, 1);
    return;
  }
  out[qi] = h[0];
  if (stats)
  {
    atomicAdd(stats, static_cast<unsigned long long>(candidates));
    atomicAdd(stats + 1, static_cast<unsigned long long>(measured));
    atomicAdd(stats + 2, 1ull);
    atomicMax(stats + 3, static_cast<unsigned long long>(candidates));
  }
}

/// The input coordinates, as given (float or double), in the level's order.
template <class Scalar>
__global__ void coordinatesInOrder(const Scalar* __restrict__ input, const std::int32_t* __restrict__ orderToInput,
  int n, Scalar* __restrict__ ordered)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    const std::int64_t i = orderToInput[s];
    ordered[3 * std::int64_t(s)] = input[3 * i];
    ordered[3 * std::int64_t(s) + 1] = input[3 * i + 1];
    ordered[3 * std::int64_t(s) + 2] = input[3 * i + 2];
  }
}

/// Thread t of the base grid's order: its query and level (noLevel for points past `queries`),
/// and the count per level.
__global__ void assignLevels(KthGrid g, int n, std::int64_t queries, float expected, int lowest, int highest,
  std::int32_t* __restrict__ baseOrder, unsigned char* __restrict__ levels, int* __restrict__ counters)
{
  __shared__ int perLevel[levelSlots];
  for (int s = threadIdx.x; s < levelSlots; s += blockDim.x)
  {
    perLevel[s] = 0;
  }
  __syncthreads();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n)
  {
    const std::int32_t i = g.orderToInput[t];
    baseOrder[t] = i;
    unsigned char level = noLevel;
    if (i < queries)
    {
      double c[3];
      inputCell(g.input, i, g.cellSize, c);
      const int m = g.table.find(c);
      const int own = g.table.start[m + 1] - g.table.start[m];
      level = static_cast<unsigned char>(kthLevelFor(own, expected, lowest, highest) - lowest);
      atomicAdd(perLevel + level, 1);
    }
    levels[t] = level;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < levelSlots; s += blockDim.x)
  {
    if (perLevel[s])
    {
      atomicAdd(counters + s, perLevel[s]);
    }
  }
}

/// A finer look at the queries estimated finer than `level` (slot `slot`), from their cells at
/// that level: the estimate may stay finer or come back to `level`. Counts those still finer.
__global__ void refineLevels(KthGrid g, const std::int32_t* __restrict__ baseOrder, unsigned char* __restrict__ levels,
  int n, int level, int lowest, float expected, int* __restrict__ finer)
{
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n || levels[t] == noLevel || int(levels[t]) + lowest >= level)
  {
    return;
  }
  double c[3];
  inputCell(g.input, baseOrder[t], g.cellSize, c);
  const int m = g.table.find(c);
  const int own = g.table.start[m + 1] - g.table.start[m];
  const int refined = level + kthLevelFor(own, expected, lowest - level, 0);
  levels[t] = static_cast<unsigned char>(refined - lowest);
  if (refined < level)
  {
    atomicAdd(finer, 1);
  }
}

/// The key of input point i's cell of `size` (the finest level's) in the Morton order.
__device__ std::uint64_t mortonKeyOf(const InputPoints& input, std::int64_t i, double size, const double origin[3])
{
  double c[3];
  inputCell(input, i, size, c);
  return mortonKey(static_cast<std::uint64_t>(c[0] - origin[0]), static_cast<std::uint64_t>(c[1] - origin[1]),
    static_cast<std::uint64_t>(c[2] - origin[2]));
}

/// refineLevels for every level from -1 down to `finest` in one pass: a query's cell at level l is
/// the run of the sorted Morton keys that share its key's bits above 3 (l - lowest), each run
/// inside the one before.
__global__ void refineLevelsInMorton(KthMorton mo, InputPoints input, double finestCell,
  const std::int32_t* __restrict__ baseOrder, unsigned char* __restrict__ levels, int n, int finest, int lowest,
  float expected)
{
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n || levels[t] == noLevel || int(levels[t]) + lowest >= -1)
  {
    return;
  }
  int current = int(levels[t]) + lowest;
  const std::uint64_t key = mortonKeyOf(input, baseOrder[t], finestCell, mo.origin);
  int begin = 0, end = mo.count;
  for (int level = -1; level >= finest && current < level; --level)
  {
    const int shift = 3 * (level - lowest);
    const std::uint64_t first = key >> shift << shift;
    begin = firstKeyAtLeast(mo.keys, begin, end, first);
    end = firstKeyAtLeast(mo.keys, begin, end, first + (std::uint64_t(1) << shift));
    current = level + kthLevelFor(end - begin, expected, lowest - level, 0);
  }
  levels[t] = static_cast<unsigned char>(current - lowest);
}

/// Selects the positions t of the base order whose query is at one level.
struct AtLevel
{
  const unsigned char* levels;
  unsigned char slot;
  __device__ bool operator()(int t) const { return levels[t] == slot; }
};

/// counters[slot] = queries per level.
__global__ void countLevels(const unsigned char* __restrict__ levels, int n, int* __restrict__ counters)
{
  __shared__ int perLevel[levelSlots];
  for (int s = threadIdx.x; s < levelSlots; s += blockDim.x)
  {
    perLevel[s] = 0;
  }
  __syncthreads();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n && levels[t] != noLevel)
  {
    atomicAdd(perLevel + levels[t], 1);
  }
  __syncthreads();
  for (int s = threadIdx.x; s < levelSlots; s += blockDim.x)
  {
    if (perLevel[s])
    {
      atomicAdd(counters + s, perLevel[s]);
    }
  }
}

/// Morton key of every point's cell at the finest level (cells of `size`), from `origin`.
__global__ void mortonKeys(InputPoints input, int n, double size, double ox, double oy, double oz,
  std::uint64_t* __restrict__ keys, std::int32_t* __restrict__ order)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
  {
    return;
  }
  const double origin[3] = { ox, oy, oz };
  keys[i] = mortonKeyOf(input, i, size, origin);
  order[i] = i;
}

/// levelOfInput[i] = the level of input point i, from the levels in base order.
__global__ void levelsByInput(const std::int32_t* __restrict__ baseOrder, const unsigned char* __restrict__ levels, int n,
  unsigned char* __restrict__ levelOfInput)
{
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n)
  {
    levelOfInput[baseOrder[t]] = levels[t];
  }
}

/// The base order becomes `order` (the Morton order), the levels following their queries.
__global__ void takeBaseOrder(const std::int32_t* __restrict__ order, const unsigned char* __restrict__ levelOfInput,
  int n, std::int32_t* __restrict__ baseOrder, unsigned char* __restrict__ levels)
{
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n)
  {
    const std::int32_t i = order[t];
    baseOrder[t] = i;
    levels[t] = levelOfInput[i];
  }
}

/// *largest = the most points in one cell of the table.
__global__ void largestCell(const std::int32_t* __restrict__ start, int cells, int* largest)
{
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  const int count = m < cells ? start[m + 1] - start[m] : 0;
  const int most = __reduce_max_sync(0xffffffffu, count);
  if ((threadIdx.x & 31) == 0 && most > 0)
  {
    atomicMax(largest, most);
  }
}

/// Where the Morton keys start: the finest-level cell coordinates of the bounds' lowest corner,
/// rounded down to a multiple of 2^(highest - lowest), so that every level's cells are aligned
/// runs of keys. False when the bounds span too many finest cells for 21 bits an axis, or lie
/// where cell coordinates are no longer exact (CellGrid.h's huge cells): no descent then.
bool mortonOrigin(const double lo[3], const double hi[3], double finest, int levels, double origin[3])
{
  const double aligned = std::ldexp(1.0, levels);
  for (int a = 0; a < 3; ++a)
  {
    const double first = cellCoordinate(lo[a], finest), last = cellCoordinate(hi[a], finest);
    if (isHugeCell(first) || isHugeCell(last))
    {
      return false;
    }
    origin[a] = std::floor(first / aligned) * aligned;
    if (!(last - origin[a] < std::ldexp(1.0, mortonAxisBits)))
    {
      return false;
    }
  }
  return true;
}

} // namespace

CudaKthNeighbor::CudaKthNeighbor(DevicePool& pool)
  : cells_(pool), baseOrder_(pool), levels_(pool), counters_(pool), selected_(pool), scratch_(pool),
    mortonKeys_(pool), mortonOrder_(pool), inOrder_(pool)
{
  static_assert(sizeof(KthCellOffset) == 4, "offsets travel as 4 bytes");
}

std::int64_t CudaKthNeighbor::plannedBytes(const Problem& p)
{
  const std::int64_t n = p.count;
  const double base = kthBaseCellSize(n, p.neighborTarget, p.lo, p.hi);
  int lowest = 0, highest = 0;
  kthLevelRange(base, p.lo, p.hi, lowest, highest);
  // The finest level has the widest keys and the most cells.
  const KeyLayout layout = makeKeyLayout(p.lo, p.hi, std::ldexp(base, lowest));
  // The Morton order: keys and order, double-buffered for the sort, and CUB's scratch.
  const std::int64_t morton = 24 * n + n / 4;
  const std::int64_t inOrder = (p.input.type == ScalarType::Float64 ? 24 : 12) * n;
  return RadixCells::plannedBytes(n, layout, false) + 9 * n + morton + inOrder + 4 * (levelSlots + 3) +
    (std::int64_t(1) << 20);
}

std::int64_t CudaKthNeighbor::heldBytes() const
{
  return cells_.heldBytes() +
    std::int64_t(baseOrder_.bytes() + levels_.bytes() + counters_.bytes() + selected_.bytes() + scratch_.bytes() +
      mortonKeys_.bytes() + mortonOrder_.bytes() + inOrder_.bytes());
}

void CudaKthNeighbor::buildMortonOrder(CudaRun& run, double finest, const double origin[3])
{
  const int n = static_cast<int>(run.count);
  std::uint64_t* keys = mortonKeys_.ensure(2 * std::size_t(n), "Morton keys");
  std::int32_t* order = mortonOrder_.ensure(2 * std::size_t(n), "Morton order");
  mortonKeys<<<blocksFor(n), 256, 0, run.stream>>>(run.input, n, finest, origin[0], origin[1], origin[2], keys, order);
  NG_CUDA_CHECK_LAUNCH("mortonKeys");
  cub::DoubleBuffer<std::uint64_t> sortKeys(keys, keys + n);
  cub::DoubleBuffer<std::int32_t> sortOrder(order, order + n);
  std::size_t bytes = 0;
  const int bits = 3 * mortonAxisBits;
  NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, sortKeys, sortOrder, n, 0, bits, run.stream),
    "sizing the Morton sort");
  void* temp = scratch_.ensure(bytes, "Morton sort scratch");
  NG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, sortKeys, sortOrder, n, 0, bits, run.stream),
    "sorting by Morton keys");
  sortedKeys_ = sortKeys.Current();
  sortedOrder_ = sortOrder.Current();
}

int CudaKthNeighbor::run(CudaRun& run, std::int64_t queries, int k, float* out)
{
  const auto runStart = std::chrono::steady_clock::now();
  const Problem& p = *run.problem;
  const int n = static_cast<int>(run.count);
  const double base = kthBaseCellSize(n, k, p.lo, p.hi);
  int lowest = 0, highest = 0;
  kthLevelRange(base, p.lo, p.hi, lowest, highest);
  if (highest - lowest + 1 >= levelSlots)
  {
    throw Error("NeighborGrid: Smoothing Length: the points span more than 2^" + std::to_string(levelSlots) +
      " of their typical k-th neighbor distance");
  }
  const std::vector<KthCellOffset> table = kthOffsetTable();
  NG_CUDA_CHECK(cudaMemcpyToSymbolAsync(kthOffsets, table.data(), sizeof(KthCellOffset) * table.size(), 0,
                  cudaMemcpyHostToDevice, run.stream),
    "uploading the cell offsets");
  std::int32_t* baseOrder = baseOrder_.ensure(std::size_t(n), "queries in cell order");
  unsigned char* levels = levels_.ensure(std::size_t(n), "level of each query");
  // Queries per level, then the refinement count, the selection's count and the largest cell.
  int* counters = counters_.ensure(levelSlots + 3, "queries per level");
  int* countersHost = countersHost_.ensure(levelSlots + 1, "queries per level (pinned host memory)");
  NG_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof(int) * (levelSlots + 1), run.stream), "clearing the level counts");

  // Threads per block: each keeps k floats of shared memory.
  const int threads = std::min(256, run.device->sharedMemoryPerBlock / (4 * k) / 32 * 32);
  if (threads < 32)
  {
    throw Error("NeighborGrid: Smoothing Length with k = " + std::to_string(k) + " needs " +
      std::to_string(128 * k) + " bytes of shared memory per block; this GPU has " +
      std::to_string(run.device->sharedMemoryPerBlock));
  }
  const int heapBytes = 4 * k * threads;
  allowDynamicSharedMemory(kthNeighborLevel, run.device->id, std::size_t(heapBytes), "shared memory of the Smoothing Length search");

  // Once the Morton order exists, every level's cells are runs of it: the grids need no sort, and
  // share one order and one copy of the coordinates.
  KthMorton morton;
  morton.count = n;
  bool mortonBuilt = false, inOrderIsMorton = false;
  InputPoints mortonCoordinates;
  // The input coordinates in the grid's order (a cell's points share cache lines; the input's
  // order is the caller's, often random): the search measures pairs in double from them, and the
  // grouped builds read them as a stream.
  auto copyCoordinatesInOrder = [&](const std::int32_t* order) {
    InputPoints copy;
    copy.isDouble = run.input.isDouble;
    if (run.input.isDouble)
    {
      double* to = reinterpret_cast<double*>(inOrder_.ensure(24 * std::size_t(n), "coordinates in cell order"));
      coordinatesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(static_cast<const double*>(run.input.xyz), order, n, to);
      copy.xyz = to;
    }
    else
    {
      float* to = reinterpret_cast<float*>(inOrder_.ensure(12 * std::size_t(n), "coordinates in cell order"));
      coordinatesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(static_cast<const float*>(run.input.xyz), order, n, to);
      copy.xyz = to;
    }
    NG_CUDA_CHECK_LAUNCH("coordinatesInOrder");
    return copy;
  };
  auto buildLevel = [&](int level) {
    const double size = std::ldexp(base, level);
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, size);
    KthGrid g;
    if (mortonBuilt)
    {
      if (!inOrderIsMorton)
      {
        mortonCoordinates = copyCoordinatesInOrder(morton.order);
        inOrderIsMorton = true;
      }
      cells_.buildGrouped(run, layout, size, morton.order, mortonCoordinates);
      g.inOrder = mortonCoordinates;
    }
    else
    {
      cells_.build(run, layout, size, false);
      g.inOrder = copyCoordinatesInOrder(cells_.orderToInput());
    }
    g.mortonCells = mortonBuilt;
    g.table = cells_.table();
    g.particles = cells_.particleRegion();
    g.orderToInput = cells_.orderToInput();
    g.input = run.input;
    g.cellSize = size;
    g.inverseCellSize = 1.0 / size;
    // From the copy, already in the grid's order: read as a stream.
    particlesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(g.inOrder, nullptr, n, size, 1.0 / size,
      cells_.particleRegion());
    NG_CUDA_CHECK_LAUNCH("particlesInOrder");
    return g;
  };

  auto largestCellOf = [&](const CellTable& table) {
    int* largest = counters + levelSlots + 2;
    NG_CUDA_CHECK(cudaMemsetAsync(largest, 0, sizeof(int), run.stream), "clearing the largest cell");
    largestCell<<<blocksFor(table.cells), 256, 0, run.stream>>>(table.start, table.cells, largest);
    NG_CUDA_CHECK_LAUNCH("largestCell");
    NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, largest, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
      "reading the largest cell");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "finding the largest cell");
    return countersHost[0];
  };

  // Crowded cells: more points than a few times k (NEIGHBORGRID_KTH_CROWDED: tests descend more).
  const char* crowdedOverride = std::getenv("NEIGHBORGRID_KTH_CROWDED");
  const int crowded = crowdedOverride ? std::max(1, std::atoi(crowdedOverride)) : std::max(64, 2 * k);
  const double finestCell = std::ldexp(base, lowest);
  const bool descends = mortonOrigin(p.lo, p.hi, finestCell, highest - lowest, morton.origin);
  const bool printStats = std::getenv("NEIGHBORGRID_KTH_STATS") != nullptr;
  auto takeMortonOrder = [&](const char* when) {
    if (printStats)
    {
      std::fprintf(stderr, "%s: cells of more than %d points descended (Morton order)\n", when, crowded);
    }
    buildMortonOrder(run, finestCell, morton.origin);
    morton.keys = sortedKeys_;
    morton.order = sortedOrder_;
    morton.crowded = crowded;
    mortonBuilt = true;
  };

  KthGrid grid = buildLevel(0);
  assignLevels<<<blocksFor(n), 256, 0, run.stream>>>(grid, n, queries, kthExpectedPerBaseCell(k), lowest, highest,
    baseOrder, levels, counters);
  NG_CUDA_CHECK_LAUNCH("assignLevels");
  // Clusters are denser at their cores than a cell of c_0 shows: queries estimated finer than a
  // level look again at that level's cells, down to the finest.
  NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, counters, sizeof(int) * levelSlots, cudaMemcpyDeviceToHost, run.stream),
    "reading the level counts");
  NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "assigning levels");
  int finest = 0;
  for (int slot = 0; slot < levelSlots; ++slot)
  {
    if (countersHost[slot] > 0)
    {
      finest = std::min(finest, slot + lowest);
      break;
    }
  }
  int gridLevel = 0;
  if (descends && finest < 0)
  {
    takeMortonOrder("queries finer than level 0");
    refineLevelsInMorton<<<blocksFor(n), 256, 0, run.stream>>>(morton, run.input, finestCell, baseOrder, levels, n,
      std::max(finest, lowest), lowest, kthExpectedPerBaseCell(k));
    NG_CUDA_CHECK_LAUNCH("refineLevelsInMorton");
  }
  int* finer = counters + levelSlots;
  for (int level = -1; !mortonBuilt && level > finest - 1 && level >= lowest; --level)
  {
    NG_CUDA_CHECK(cudaMemsetAsync(finer, 0, sizeof(int), run.stream), "clearing the refinement count");
    grid = buildLevel(level);
    gridLevel = level;
    refineLevels<<<blocksFor(n), 256, 0, run.stream>>>(grid, baseOrder, levels, n, level, lowest,
      kthExpectedPerBaseCell(k), finer);
    NG_CUDA_CHECK_LAUNCH("refineLevels");
    NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, finer, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
      "reading the refinement count");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "refining levels");
    if (countersHost[0] == 0)
    {
      break;
    }
  }
  NG_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof(int) * (levelSlots + 1), run.stream), "clearing the level counts");
  countLevels<<<blocksFor(n), 256, 0, run.stream>>>(levels, n, counters);
  NG_CUDA_CHECK_LAUNCH("countLevels");
  NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, counters, sizeof(int) * levelSlots, cudaMemcpyDeviceToHost, run.stream),
    "reading the level counts");
  NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "assigning levels");
  std::vector<int> waiting(countersHost, countersHost + levelSlots);
  // Queries at several levels (a clustered cloud): each level's queries in Morton order, so that
  // the threads of a warp search one neighborhood at every level, not a cell of level 0 at random.
  if (descends && std::count_if(waiting.begin(), waiting.end(), [](int w) { return w > 0; }) > 1)
  {
    if (!mortonBuilt)
    {
      takeMortonOrder("queries at several levels, in Morton order");
    }
    unsigned char* levelOfInput = reinterpret_cast<unsigned char*>(selected_.ensure(std::size_t(n), "queries of one level"));
    levelsByInput<<<blocksFor(n), 256, 0, run.stream>>>(baseOrder, levels, n, levelOfInput);
    NG_CUDA_CHECK_LAUNCH("levelsByInput");
    takeBaseOrder<<<blocksFor(n), 256, 0, run.stream>>>(morton.order, levelOfInput, n, baseOrder, levels);
    NG_CUDA_CHECK_LAUNCH("takeBaseOrder");
  }
  // NEIGHBORGRID_KTH_STATS: candidates and pairs measured in double per level on stderr (diagnostics).
  unsigned long long* stats = nullptr;
  cudaEvent_t searchEvents[2] = { nullptr, nullptr };
  std::chrono::steady_clock::time_point levelStart;
  if (printStats)
  {
    std::fprintf(stderr, "levels assigned in %.2f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - runStart).count());
    NG_CUDA_CHECK(cudaMallocAsync(&stats, 4 * sizeof(unsigned long long), run.stream), "statistics");
    cudaEventCreate(&searchEvents[0]);
    cudaEventCreate(&searchEvents[1]);
    NG_CUDA_CHECK(cudaMemsetAsync(stats, 0, 4 * sizeof(unsigned long long), run.stream), "statistics");
  }
  int* atLevel = selected_.ensure(std::size_t(n), "queries of one level");
  int* selectedCount = counters + levelSlots + 1;
  int searched = 0;

  for (int level = lowest; level <= highest; ++level)
  {
    const int slot = level - lowest;
    if (waiting[slot] == 0)
    {
      continue;
    }
    if (printStats)
    {
      NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "statistics");
      levelStart = std::chrono::steady_clock::now();
    }
    if (level != gridLevel)
    {
      grid = buildLevel(level);
      gridLevel = level;
    }
    if (descends && !mortonBuilt && level > lowest && largestCellOf(grid.table) > crowded)
    {
      takeMortonOrder("a crowded cell at this level");
    }
    grid.morton = morton;
    grid.levelsBelow = level - lowest;
    // The level's queries, in base order: its warps then hold neighbors of one level only.
    const AtLevel atThisLevel{ levels, static_cast<unsigned char>(slot) };
    std::size_t selectBytes = 0;
    NG_CUDA_CHECK(cub::DeviceSelect::If(nullptr, selectBytes, thrust::counting_iterator<int>(0), atLevel, selectedCount,
                    n, atThisLevel, run.stream),
      "sizing the level's selection");
    void* selectTemp = scratch_.ensure(selectBytes, "selection scratch");
    NG_CUDA_CHECK(cub::DeviceSelect::If(selectTemp, selectBytes, thrust::counting_iterator<int>(0), atLevel,
                    selectedCount, n, atThisLevel, run.stream),
      "selecting the level's queries");
    if (printStats)
    {
      cudaEventRecord(searchEvents[0], run.stream);
    }
    kthNeighborLevel<<<blocksFor(waiting[slot], threads), threads, heapBytes, run.stream>>>(grid, baseOrder, levels,
      atLevel, waiting[slot], static_cast<unsigned char>(slot), level == highest, k, out, counters, stats);
    NG_CUDA_CHECK_LAUNCH("kthNeighborLevel");
    if (printStats)
    {
      cudaEventRecord(searchEvents[1], run.stream);
    }
    ++searched;
    NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, counters + slot + 1, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
      "reading the next level's count");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "Smoothing Length search");
    waiting[slot + 1] = countersHost[0];
    if (printStats)
    {
      unsigned long long h[4];
      NG_CUDA_CHECK(cudaMemcpy(h, stats, sizeof h, cudaMemcpyDeviceToHost), "statistics");
      NG_CUDA_CHECK(cudaMemset(stats, 0, sizeof h), "statistics");
      float searchMs = 0.0f;
      cudaEventElapsedTime(&searchMs, searchEvents[0], searchEvents[1]);
      const double levelMs =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - levelStart).count();
      std::fprintf(stderr,
        "level %d (cell %g): %d queries, %llu finished, %.1f candidates (most %llu), %.1f measured in double each, %d up; "
        "search %.2f ms of %.2f\n",
        level, std::ldexp(base, level), waiting[slot], h[2], double(h[0]) / double(h[2] ? h[2] : 1), h[3],
        double(h[1]) / double(h[2] ? h[2] : 1), waiting[slot + 1], searchMs, levelMs);
    }
    if (level == highest && waiting[slot + 1] > 0)
    {
      throw Error("NeighborGrid: Smoothing Length: " + std::to_string(waiting[slot + 1]) +
        " points found fewer than k neighbors at the coarsest level (an internal error; please report it)");
    }
  }
  if (stats)
  {
    cudaFreeAsync(stats, run.stream);
    cudaEventDestroy(searchEvents[0]);
    cudaEventDestroy(searchEvents[1]);
  }
  return searched;
}

} // namespace detail
} // namespace neighborgrid
