// Separate queries (Request::source): results at points that are not the particles, on any
// method's cells (QuerySource). One thread per query; queries in the caller's order, which for a
// grid, a line or a plane keeps the threads of a warp on the same cells. Grid queries are
// generated here from origin, spacing and dimensions, never stored.
#pragma once

#include "CellTable.h"

#include <cub/block/block_scan.cuh>

namespace neighborgrid
{
namespace detail
{

constexpr int queryThreads = 256;

/// The queries as the kernels see them: explicit coordinates on the device, or a grid.
struct DeviceQueries
{
  InputPoints points;
  bool isGrid = false;
  double origin[3] = { 0, 0, 0 };
  double spacing[3] = { 1, 1, 1 };
  std::int64_t dimensions[3] = { 1, 1, 1 };
  std::int64_t firstIndex[3] = { 0, 0, 0 };
  int count = 0;

  __device__ __forceinline__ void get(int q, double x[3]) const
  {
    if (isGrid)
    {
      const std::int64_t i = q % dimensions[0];
      const std::int64_t j = (q / dimensions[0]) % dimensions[1];
      const std::int64_t k = q / (dimensions[0] * dimensions[1]);
      x[0] = gridCoordinate(origin[0], firstIndex[0] + i, spacing[0]);
      x[1] = gridCoordinate(origin[1], firstIndex[1] + j, spacing[1]);
      x[2] = gridCoordinate(origin[2], firstIndex[2] + k, spacing[2]);
    }
    else
    {
      points.get(q, x[0], x[1], x[2]);
    }
  }
};

/// Distance, in cell units, from frame coordinate v of the query's own cell to the cell d cells
/// away along the axis: 0 for its own. NaN (a huge cell) stays NaN and culls nothing.
__device__ __forceinline__ float gapToCell(float v, int d)
{
  return d > 0 ? __fsub_rn(float(d), v) : (d < 0 ? __fsub_rn(v, float(d + 1)) : 0.0f);
}

/// The pair test between a query at x and source particle j (float frame, then double in the band).
__device__ __forceinline__ bool isQueryNeighbor(const PairTest& test, const double x[3],
  const QuerySource& source, int j, float& r2, unsigned& decidedHere)
{
  const int verdict = test.classify(r2);
  if (verdict >= 0)
  {
    return verdict > 0;
  }
  ++decidedHere;
  const std::int64_t input = source.orderToInput ? source.orderToInput[j] : j;
  return test.exactQuery(x, input, r2);
}

/// visit(j, pj, shiftedQuery, r2) for every particle j in the cells around the query at x:
/// (2 reach + 1)^3 cells, less those whose nearest point lies beyond R (cullLimit: (R / cell
/// size)^2 with a margin for the rounding of the gaps). shiftedQuery is the query in pj's frame,
/// r2 their float squared distance in frame units.
template <class Visit>
__device__ __forceinline__ void forEachCandidate(const double x[3], const QuerySource& source, float cullLimit, Visit visit)
{
  const CellTable& table = source.table;
  double c[3];
  float f[3];
  for (int a = 0; a < 3; ++a)
  {
    c[a] = cellCoordinate(x[a], table.cellSize, table.inverseCellSize);
    f[a] = frameCoordinate(x[a], c[a], table.cellSize, table.inverseCellSize);
  }
  const Particle query{ f[0], f[1], f[2], 0.0f };
  const int reach = source.reach;
  for (int dz = -reach; dz <= reach; ++dz)
  {
    const float gz = gapToCell(f[2], dz);
    for (int dy = -reach; dy <= reach; ++dy)
    {
      const float gy = gapToCell(f[1], dy);
      const float rest = cullLimit - (gy * gy + gz * gz);
      if (rest < 0.0f)
      {
        continue;
      }
      for (int dx = -reach; dx <= reach; ++dx)
      {
        const float gx = gapToCell(f[0], dx);
        if (gx * gx > rest)
        {
          continue;
        }
        double neighbor[3];
        if (!offsetCell(c, dx, dy, dz, neighbor))
        {
          continue;
        }
        const int cell = table.find(neighbor);
        if (cell < 0)
        {
          continue;
        }
        const Particle shiftedQuery = shifted(query, float(dx), float(dy), float(dz));
        for (int range = 0; range < (source.secondStart ? 2 : 1); ++range)
        {
          const std::int32_t* start = range == 0 ? table.start : source.secondStart;
          const int end = start[cell + 1];
          for (int j = start[cell]; j < end; ++j)
          {
            const Particle pj = source.particles[j];
            visit(j, pj, shiftedQuery, squaredDistance(shiftedQuery, pj));
          }
        }
      }
    }
  }
}

/// One query against the cells around its own (forEachCandidate).
template <class Op>
__device__ __forceinline__ void gatherQuery(int q, const double x[3], const QuerySource& source,
  const PairTest& test, float cullLimit, const Op& op, unsigned& decidedHere)
{
  RegisterSums<Op> acc;
  forEachCandidate(x, source, cullLimit, [&](int j, const Particle& pj, const Particle&, float r2) {
    if (isQueryNeighbor(test, x, source, j, r2, decidedHere))
    {
      acc.add(op, j, pj, r2);
    }
  });
  acc.finish(op, q, q);
}

/// A search of the radius layer (RadiusOperations.h): one thread per query, every pair decided
/// by its own radius; Brute Force (source.bruteForce) takes every particle, in input order.
template <class Op>
__global__ void __launch_bounds__(queryThreads) queryRadiusSums(DeviceQueries queries, QuerySource source,
  int sourceCount, float cullLimit, Op op, unsigned long long* decided)
{
  const int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= queries.count)
  {
    return;
  }
  double x[3];
  queries.get(q, x);
  const typename Op::Query state = op.query(q);
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
  auto take = [&](int j, const Particle& pj, float r2, const float d[3]) {
    if (op.rule.takes(state.radius, x, j, r2, decidedHere))
    {
      typename Op::Value t[Op::Terms];
      op.pair(t, state, j, pj, r2, d);
      acc.addTerms(t);
    }
  };
  // The candidate's distance and x - x_j from the input coordinates, in double.
  auto takeInDouble = [&](int j, const Particle& pj) {
    double b[3];
    op.rule.sources.get(op.rule.orderToInput ? op.rule.orderToInput[j] : j, b[0], b[1], b[2]);
    const double r2 = exactSquaredDistance(x[0], x[1], x[2], b[0], b[1], b[2]);
    const float d[3] = { float(x[0] - b[0]), float(x[1] - b[1]), float(x[2] - b[2]) };
    take(j, pj, static_cast<float>(r2 * op.rule.frameScale), d);
  };
  if (source.bruteForce)
  {
    for (int j = 0; j < sourceCount; ++j)
    {
      takeInDouble(j, source.particles[j]);
    }
  }
  else
  {
    const float size = op.rule.cellSize;
    const bool inDouble = op.rule.doubleDistances;
    forEachCandidate(x, source, cullLimit, [&](int j, const Particle& pj, const Particle& query, float r2) {
      if (inDouble)
      {
        takeInDouble(j, pj);
        return;
      }
      const float d[3] = { (query.x - pj.x) * size, (query.y - pj.y) * size, (query.z - pj.z) * size };
      take(j, pj, r2, d);
    });
  }
  acc.finish(op, q, q);
  addDecided(decided, decidedHere);
}

template <class Op>
__global__ void __launch_bounds__(queryThreads) queryGather(DeviceQueries queries, QuerySource source,
  PairTest test, float cullLimit, Op op, unsigned long long* decided)
{
  const int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= queries.count)
  {
    return;
  }
  double x[3];
  queries.get(q, x);
  unsigned decidedHere = 0;
  gatherQuery(q, x, source, test, cullLimit, op, decidedHere);
  addDecided(decided, decidedHere);
}

// Grid queries by bricks. The gather above tests every point of the 27 cells of R around a grid
// point: about 6 candidates per neighbor, read from global memory by warps whose 32 points span
// several cells. Here a block takes a brick of 8 x 8 x 4 grid points, stages the particles within
// R of the brick in shared memory once, in cell order, and each warp (4 x 4 x 2 points) keeps the
// staged particles within R of its own small box: about 2 candidates per neighbor, all read from
// shared memory. The order of the sums is fixed (cells, then each cell's points), so results do
// not depend on scheduling. A brick whose reach spans too many cells (a grid much coarser than R)
// falls back to the gather, point by point.
NG_HD constexpr int brickSide(int axis)
{
  return axis < 2 ? 8 : 4;
}
constexpr int brickThreads = 256;
constexpr int brickStage = 1024;       // particles staged at once; more are taken in rounds
constexpr int brickMaxSpan = 16;       // cells per axis within R of a brick
constexpr int brickMaxSegments = 1024; // cells (times 2 with a second range) within R of a brick
constexpr int brickSegmentsPerThread = brickMaxSegments / brickThreads;

struct BrickStage
{
  Particle particles[brickStage]; // in the brick's frame: cell units from its first cell
  std::int32_t index[brickStage]; // the source position of each
  unsigned short warpList[brickThreads / 32][brickStage];
  std::int32_t segmentOffset[brickMaxSegments + 1];
  std::int32_t segmentFirst[brickMaxSegments];
  std::int32_t warpTotals[brickThreads / 32];
  typename cub::BlockScan<std::int32_t, brickThreads>::TempStorage scan;
};

/// Squared gap, in frame units, between point p and the box [lo, hi].
__device__ __forceinline__ float squaredGapToBox(const Particle& p, const float lo[3], const float hi[3])
{
  const float v[3] = { p.x, p.y, p.z };
  float sum = 0.0f;
  for (int a = 0; a < 3; ++a)
  {
    const float g = fmaxf(fmaxf(lo[a] - v[a], v[a] - hi[a]), 0.0f);
    sum += g * g;
  }
  return sum;
}

template <class Op>
__global__ void __launch_bounds__(brickThreads) queryGridBricks(DeviceQueries queries, QuerySource source,
  PairTest brickTest, PairTest gatherTest, float cullLimit, double radius, Op op, unsigned long long* decided)
{
  __shared__ BrickStage stage;
  const CellTable& table = source.table;
  const std::int64_t* dims = queries.dimensions;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // The brick, the thread's grid point and its warp's box of points (grid indices).
  std::int64_t brick = blockIdx.x;
  std::int64_t first[3], last[3], point[3], warpFirst[3], warpLast[3];
  const int warpOffset[3] = { (warp & 1) * 4, ((warp >> 1) & 1) * 4, (warp >> 2) * 2 };
  const int laneOffset[3] = { lane & 3, (lane >> 2) & 3, lane >> 4 };
  bool active = true;
  bool warpActive = true;
  for (int a = 0; a < 3; ++a)
  {
    const std::int64_t bricks = (dims[a] + brickSide(a) - 1) / brickSide(a);
    first[a] = (brick % bricks) * brickSide(a);
    brick /= bricks;
    last[a] = min(first[a] + brickSide(a), dims[a]) - 1;
    warpFirst[a] = first[a] + warpOffset[a];
    warpLast[a] = min(warpFirst[a] + (a < 2 ? 3 : 1), last[a]);
    point[a] = warpFirst[a] + laneOffset[a];
    warpActive = warpActive && warpFirst[a] <= last[a];
    active = active && point[a] <= warpLast[a];
  }
  const int q = active ? static_cast<int>(point[0] + dims[0] * (point[1] + dims[1] * point[2])) : -1;
  double x[3];
  for (int a = 0; a < 3; ++a)
  {
    x[a] = gridCoordinate(queries.origin[a], queries.firstIndex[a] + min(point[a], last[a]), queries.spacing[a]);
  }
  unsigned decidedHere = 0;

  // The cells within R of the brick: from `base`, span[a] cells along each axis.
  double base[3], low[3], high[3];
  int span[3];
  bool fits = true;
  for (int a = 0; a < 3; ++a)
  {
    const double u = gridCoordinate(queries.origin[a], queries.firstIndex[a] + first[a], queries.spacing[a]);
    const double v = gridCoordinate(queries.origin[a], queries.firstIndex[a] + last[a], queries.spacing[a]);
    low[a] = fmin(u, v);
    high[a] = fmax(u, v);
    // A margin over R: cells are only a superset, the pair test decides.
    const double reach = radius * (1.0 + 1e-6) + 1e-9 * (fabs(low[a]) + fabs(high[a]));
    base[a] = cellCoordinate(low[a] - reach, table.cellSize);
    const double end = cellCoordinate(high[a] + reach, table.cellSize);
    fits = fits && !isHugeCell(base[a]) && !isHugeCell(end) && end - base[a] < brickMaxSpan;
    span[a] = fits ? static_cast<int>(end - base[a]) + 1 : 0;
  }
  const int ranges = source.secondStart ? 2 : 1;
  const int segments = span[0] * span[1] * span[2] * ranges;
  if (!fits || segments > brickMaxSegments)
  {
    if (active)
    {
      gatherQuery(q, x, source, gatherTest, cullLimit, op, decidedHere);
    }
    addDecided(decided, decidedHere);
    return;
  }

  // Frames: cell units from the base cell.
  auto frame = [&](double v, int a) { return frameCoordinate(v, base[a], table.cellSize, table.inverseCellSize); };
  const Particle query{ frame(x[0], 0), frame(x[1], 1), frame(x[2], 2), 0.0f };
  float brickLow[3], brickHigh[3], warpLow[3], warpHigh[3];
  for (int a = 0; a < 3; ++a)
  {
    brickLow[a] = frame(low[a], a);
    brickHigh[a] = frame(high[a], a);
    const float u = frame(gridCoordinate(queries.origin[a], queries.firstIndex[a] + warpFirst[a], queries.spacing[a]), a);
    const float v = frame(gridCoordinate(queries.origin[a], queries.firstIndex[a] + warpLast[a], queries.spacing[a]), a);
    warpLow[a] = fminf(u, v);
    warpHigh[a] = fmaxf(u, v);
  }

  // Each cell's range (and its second range), cells beyond R of the brick left empty; their
  // offsets in the brick's list of candidates.
  {
    std::int32_t counts[brickSegmentsPerThread];
    for (int k = 0; k < brickSegmentsPerThread; ++k)
    {
      const int s = threadIdx.x * brickSegmentsPerThread + k;
      counts[k] = 0;
      if (s >= segments)
      {
        continue;
      }
      const int c = s / ranges;
      const int o[3] = { c % span[0], (c / span[0]) % span[1], c / (span[0] * span[1]) };
      float gap = 0.0f;
      for (int a = 0; a < 3; ++a)
      {
        const float g = fmaxf(fmaxf(brickLow[a] - float(o[a] + 1), float(o[a]) - brickHigh[a]), 0.0f);
        gap += g * g;
      }
      if (gap > cullLimit)
      {
        continue;
      }
      const double cell[3] = { base[0] + o[0], base[1] + o[1], base[2] + o[2] };
      const int id = table.find(cell);
      if (id < 0)
      {
        continue;
      }
      const std::int32_t* start = s % ranges == 0 ? table.start : source.secondStart;
      stage.segmentFirst[s] = start[id];
      counts[k] = start[id + 1] - start[id];
    }
    std::int32_t total = 0;
    cub::BlockScan<std::int32_t, brickThreads>(stage.scan).ExclusiveSum(counts, counts, total);
    for (int k = 0; k < brickSegmentsPerThread; ++k)
    {
      const int s = threadIdx.x * brickSegmentsPerThread + k;
      if (s < segments)
      {
        stage.segmentOffset[s] = counts[k];
      }
    }
    if (threadIdx.x == 0)
    {
      stage.segmentOffset[segments] = total;
    }
    __syncthreads();
  }
  const std::int32_t candidates = stage.segmentOffset[segments];

  RegisterSums<Op> acc;
  int staged = 0;
  for (std::int32_t position = 0; position < candidates; position += brickThreads)
  {
    // Stage the next brickThreads candidates that lie within R of the brick, in order.
    const std::int32_t f = position + threadIdx.x;
    bool keep = false;
    Particle p{};
    std::int32_t j = 0;
    if (f < candidates)
    {
      int lo = 0, hi = segments - 1; // the last segment starting at or before f
      while (lo < hi)
      {
        const int mid = (lo + hi + 1) / 2;
        if (stage.segmentOffset[mid] <= f)
        {
          lo = mid;
        }
        else
        {
          hi = mid - 1;
        }
      }
      j = stage.segmentFirst[lo] + (f - stage.segmentOffset[lo]);
      const int c = lo / ranges;
      p = shifted(source.particles[j], -float(c % span[0]), -float((c / span[0]) % span[1]),
        -float(c / (span[0] * span[1])));
      keep = squaredGapToBox(p, brickLow, brickHigh) <= cullLimit;
    }
    const unsigned kept = __ballot_sync(0xffffffffu, keep);
    if (lane == 0)
    {
      stage.warpTotals[warp] = __popc(kept);
    }
    __syncthreads();
    int slot = staged + __popc(kept & ((1u << lane) - 1));
    for (int w = 0; w < brickThreads / 32; ++w)
    {
      slot += w < warp ? stage.warpTotals[w] : 0;
      staged += stage.warpTotals[w];
    }
    if (keep)
    {
      stage.particles[slot] = p;
      stage.index[slot] = j;
    }
    __syncthreads();
    if (staged <= brickStage - brickThreads && position + brickThreads < candidates)
    {
      continue;
    }

    // Each warp lists the staged particles within R of its box, then its points test them.
    if (warpActive)
    {
      int listed = 0;
      for (int k0 = 0; k0 < staged; k0 += 32)
      {
        const int k = k0 + lane;
        const bool near = k < staged && squaredGapToBox(stage.particles[k], warpLow, warpHigh) <= cullLimit;
        const unsigned nearMask = __ballot_sync(0xffffffffu, near);
        if (near)
        {
          stage.warpList[warp][listed + __popc(nearMask & ((1u << lane) - 1))] = static_cast<unsigned short>(k);
        }
        listed += __popc(nearMask);
      }
      __syncwarp();
      if (active)
      {
        for (int m = 0; m < listed; ++m)
        {
          const int k = stage.warpList[warp][m];
          const Particle pk = stage.particles[k];
          float r2 = squaredDistance(query, pk);
          const std::int32_t jk = stage.index[k];
          if (isQueryNeighbor(brickTest, x, source, jk, r2, decidedHere))
          {
            acc.add(op, jk, pk, r2);
          }
        }
      }
    }
    staged = 0;
    __syncthreads();
  }
  if (active)
  {
    acc.finish(op, q, q);
  }
  addDecided(decided, decidedHere);
}

/// Brute Force: every query against every particle, in double; particles staged in shared memory.
template <class Op>
__global__ void __launch_bounds__(queryThreads) queryBruteForce(DeviceQueries queries, InputPoints input,
  const Particle* __restrict__ particles, int n, double radiusSquared, double frameScale, Op op)
{
  __shared__ double tile[3 * queryThreads];
  __shared__ Particle tileParticles[queryThreads];
  const int q = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = q < queries.count;
  double x[3] = { 0, 0, 0 };
  if (active)
  {
    queries.get(q, x);
  }
  RegisterSums<Op> acc;
  for (int base = 0; base < n; base += queryThreads)
  {
    const int j = base + threadIdx.x;
    if (j < n)
    {
      input.get(j, tile[3 * threadIdx.x], tile[3 * threadIdx.x + 1], tile[3 * threadIdx.x + 2]);
      tileParticles[threadIdx.x] = particles[j];
    }
    __syncthreads();
    const int tileSize = min(queryThreads, n - base);
    if (active)
    {
      for (int k = 0; k < tileSize; ++k)
      {
        const double r2 = exactSquaredDistance(x[0], x[1], x[2], tile[3 * k], tile[3 * k + 1], tile[3 * k + 2]);
        if (r2 <= radiusSquared)
        {
          acc.add(op, base + k, tileParticles[k], static_cast<float>(r2 * frameScale));
        }
      }
    }
    __syncthreads();
  }
  if (active)
  {
    acc.finish(op, q, q);
  }
}

/// The query pass on the run's stream.
template <class Op>
void launchQueries(CudaRun& run, const DeviceQueries& queries, const QuerySource& source, const Op& op)
{
  if (queries.count == 0)
  {
    return;
  }
  const Problem& p = *run.problem;
  const int blocks = blocksFor(queries.count, queryThreads);
  if (source.bruteForce)
  {
    const double size = cellSizeFor(p.radius, 1);
    queryBruteForce<<<blocks, queryThreads, 0, run.stream>>>(queries, run.input, source.particles,
      static_cast<int>(run.count), p.radius * p.radius, 1.0 / (size * size), op);
    return;
  }
  const double cellSize = source.table.cellSize;
  const double rho = p.radius / cellSize;
  const PairTest test = makePairTest(p.radius, cellSize, 1.0 + source.reach, run.input);
  const float cullLimit = static_cast<float>(rho * rho * (1.0 + 1e-4) + 1e-4);
  if (queries.isGrid && queries.dimensions[2] >= 2 && !std::getenv("NEIGHBORGRID_BENCHMARK_GATHER_GRID"))
  {
    std::int64_t bricks = 1;
    for (int a = 0; a < 3; ++a)
    {
      bricks *= (queries.dimensions[a] + brickSide(a) - 1) / brickSide(a);
    }
    const PairTest brickTest = makePairTest(p.radius, cellSize, double(brickMaxSpan), run.input);
    queryGridBricks<<<static_cast<unsigned>(bricks), brickThreads, 0, run.stream>>>(
      queries, source, brickTest, test, cullLimit, p.radius, op, run.decided);
    return;
  }
  queryGather<<<blocks, queryThreads, 0, run.stream>>>(queries, source, test, cullLimit, op, run.decided);
}

/// A search of the radius layer on the run's stream: `op` complete but for its frame.
template <class Op>
void launchRadiusQueries(CudaRun& run, const DeviceQueries& queries, const QuerySource& source, Op op)
{
  if (queries.count == 0)
  {
    return;
  }
  const Problem& p = *run.problem;
  const double cellSize = source.bruteForce ? cellSizeFor(p.radius, 1) : source.table.cellSize;
  const PairTest test = makePairTest(p.radius, cellSize, 1.0 + source.reach, run.input);
  setRadiusFrame(op.rule, test, cellSize, run.input, source.orderToInput);
  const double rho = p.radius / cellSize;
  const float cullLimit = static_cast<float>(rho * rho * (1.0 + 1e-4) + 1e-4);
  queryRadiusSums<<<blocksFor(queries.count, queryThreads), queryThreads, 0, run.stream>>>(
    queries, source, static_cast<int>(run.count), cullLimit, op, run.decided);
}

} // namespace detail
} // namespace neighborgrid
