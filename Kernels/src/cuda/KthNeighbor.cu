// Smoothing Length on the GPU (KthNeighbor.h, ../KthNeighbor.h).
#include "KthNeighbor.h"

#include "../KthNeighbor.h"
#include "GridSearch.cuh"

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cfloat>
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
constexpr int levelSlots = 128;        // counters_: queries per level, then the failure count

/// One level's grid: all points by cells of cellSize, in frame coordinates of their cells.
struct KthGrid
{
  CellTable table;
  const Particle* particles = nullptr;
  const std::int32_t* orderToInput = nullptr;
  InputPoints input;
  double cellSize = 1.0;
  double inverseCellSize = 1.0;
};

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

/// Calls visit(j, r2) for every other point j in the cells around query qi (cell c, frame f)
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
    const bool own = t == 0; // the table starts with the query's own cell
    const int end = g.table.start[m + 1];
    for (int j = g.table.start[m]; j < end; ++j)
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

/// The search of one level: thread i takes query baseOrder[atLevel[i]], the level's queries in
/// the base grid's order (neighbors in one warp). Its k
/// nearest float distances first (heap in shared memory), then the exact k-th: pairs clearly
/// nearer than the float k-th are counted, those within rounding of it ordered in double.
/// A query whose k-th may lie beyond the table's reach moves up a level.
__global__ void kthNeighborLevel(KthGrid g, const std::int32_t* __restrict__ baseOrder, unsigned char* levels,
  const int* __restrict__ atLevel, int count, unsigned char level, bool coarsest, int k, float* __restrict__ out,
  int* __restrict__ counters, unsigned long long* stats)
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
  float* h = heaps + threadIdx.x;
  const int stride = blockDim.x;

  int size = 0, candidates = 0, exactPasses = 0;
  float kth = FLT_MAX;
  visitNearCells(g, qi, c, q, [&] { return size == k ? kth : FLT_MAX; }, [&](int, float r2) {
    ++candidates;
    if (size < k)
    {
      heapPush(h, stride, size++, r2);
      kth = h[0];
    }
    else if (r2 < kth)
    {
      heapReplaceTop(h, stride, k, r2);
      kth = h[0];
    }
  });
  const float band = kthBand(kth);
  // At the coarsest level every point lies within one cell (even where distances overflow).
  if (size < k || (!coarsest && !kthBeyond(float(kthReach * kthReach), kth + band)))
  {
    levels[t] = level + 1;
    atomicAdd(counters + level + 1, 1);
    return;
  }

  // The exact k-th: `below` pairs lie clearly nearer than the float k-th; among those within the
  // band, the smallest exact distance above `previous` and its ties, until k are counted.
  const float nearer = kth - band, farther = kth + band;
  int below = 0;
  double previous = -1.0;
  for (;; ++exactPasses)
  {
    double best = HUGE_VAL; // +inf: squared distances beyond 1e154 overflow to it, and tie there
    int ties = 0;
    const bool first = previous < 0.0;
    visitNearCells(g, qi, c, q, [&] { return farther; }, [&](int j, float r2) {
      if (r2 < nearer)
      {
        below += first ? 1 : 0;
      }
      else if (r2 <= farther)
      {
        const double e = exactSquared(g, qi, g.orderToInput[j]);
        if (e > previous)
        {
          ties = e < best ? 1 : ties + (e == best ? 1 : 0);
          best = fmin(best, e);
        }
      }
    });
    if (ties == 0)
    {
      atomicAdd(counters + levelSlots, 1); // cannot happen: the float k-th's pair is in the band

      out[qi] = NAN;
      return;
    }
    below += ties;
    if (below >= k)
    {
      out[qi] = supportRadiusOf(best);
      if (stats)
      {
        atomicAdd(stats, static_cast<unsigned long long>(candidates));
        atomicAdd(stats + 1, static_cast<unsigned long long>(exactPasses + 1));
        atomicAdd(stats + 2, 1ull);
      }
      return;
    }
    previous = best;
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

} // namespace

CudaKthNeighbor::CudaKthNeighbor(DevicePool& pool)
  : cells_(pool), baseOrder_(pool), levels_(pool), counters_(pool), selected_(pool), scratch_(pool)
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
  return RadixCells::plannedBytes(n, layout, false) + 9 * n + 4 * (levelSlots + 2) + (std::int64_t(1) << 20);
}

std::int64_t CudaKthNeighbor::heldBytes() const
{
  return cells_.heldBytes() +
    std::int64_t(baseOrder_.bytes() + levels_.bytes() + counters_.bytes() + selected_.bytes() + scratch_.bytes());
}

int CudaKthNeighbor::run(CudaRun& run, std::int64_t queries, int k, float* out)
{
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
  int* counters = counters_.ensure(levelSlots + 2, "queries per level");
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
  NG_CUDA_CHECK(cudaFuncSetAttribute(kthNeighborLevel, cudaFuncAttributeMaxDynamicSharedMemorySize, heapBytes),
    "shared memory of the Smoothing Length search");

  auto buildLevel = [&](int level) {
    const double size = std::ldexp(base, level);
    cells_.build(run, makeKeyLayout(p.lo, p.hi, size), size, false);
    KthGrid g;
    g.table = cells_.table();
    g.particles = cells_.particleRegion();
    g.orderToInput = cells_.orderToInput();
    g.input = run.input;
    g.cellSize = size;
    g.inverseCellSize = 1.0 / size;
    particlesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(run.input, g.orderToInput, n, size, 1.0 / size,
      cells_.particleRegion());
    NG_CUDA_CHECK_LAUNCH("particlesInOrder");
    return g;
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
  int* finer = counters + levelSlots;
  for (int level = -1; level > finest - 1 && level >= lowest; --level)
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
  // NEIGHBORGRID_KTH_STATS: candidates and exact passes per level on stderr (diagnostics).
  unsigned long long* stats = nullptr;
  const bool printStats = std::getenv("NEIGHBORGRID_KTH_STATS") != nullptr;
  if (printStats)
  {
    NG_CUDA_CHECK(cudaMallocAsync(&stats, 3 * sizeof(unsigned long long), run.stream), "statistics");
    NG_CUDA_CHECK(cudaMemsetAsync(stats, 0, 3 * sizeof(unsigned long long), run.stream), "statistics");
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
    if (level != gridLevel)
    {
      grid = buildLevel(level);
      gridLevel = level;
    }
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
    kthNeighborLevel<<<blocksFor(waiting[slot], threads), threads, heapBytes, run.stream>>>(grid, baseOrder, levels,
      atLevel, waiting[slot], static_cast<unsigned char>(slot), level == highest, k, out, counters, stats);
    NG_CUDA_CHECK_LAUNCH("kthNeighborLevel");
    ++searched;
    NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, counters + slot + 1, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
      "reading the next level's count");
    NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "Smoothing Length search");
    waiting[slot + 1] = countersHost[0];
    if (printStats)
    {
      unsigned long long h[3];
      NG_CUDA_CHECK(cudaMemcpy(h, stats, sizeof h, cudaMemcpyDeviceToHost), "statistics");
      NG_CUDA_CHECK(cudaMemset(stats, 0, sizeof h), "statistics");
      std::fprintf(stderr, "level %d (cell %g): %d queries, %llu finished, %.1f candidates, %.2f exact passes each, %d up\n",
        level, std::ldexp(base, level), waiting[slot], h[2], double(h[0]) / double(h[2] ? h[2] : 1),
        double(h[1]) / double(h[2] ? h[2] : 1), waiting[slot + 1]);
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
  }
  NG_CUDA_CHECK(cudaMemcpyAsync(countersHost, counters + levelSlots, sizeof(int), cudaMemcpyDeviceToHost, run.stream),
    "reading the failure count");
  NG_CUDA_CHECK(cudaStreamSynchronize(run.stream), "Smoothing Length search");
  if (countersHost[0] != 0)
  {
    throw Error("NeighborGrid: Smoothing Length: " + std::to_string(countersHost[0]) +
      " points lost their k-th neighbor in the exact pass (an internal error; please report it)");
  }
  return searched;
}

} // namespace detail
} // namespace neighborgrid
