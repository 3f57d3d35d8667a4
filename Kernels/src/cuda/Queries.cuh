// Separate queries (Request::source): results at points that are not the particles, on any
// method's cells (QuerySource). One thread per query; queries in the caller's order, which for a
// grid, a line or a plane keeps the threads of a warp on the same cells. Grid queries are
// generated here from origin, spacing and dimensions, never stored.
#pragma once

#include "CellTable.h"

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
  int count = 0;

  __device__ __forceinline__ void get(int q, double x[3]) const
  {
    if (isGrid)
    {
      const std::int64_t i = q % dimensions[0];
      const std::int64_t j = (q / dimensions[0]) % dimensions[1];
      const std::int64_t k = q / (dimensions[0] * dimensions[1]);
      x[0] = gridCoordinate(origin[0], i, spacing[0]);
      x[1] = gridCoordinate(origin[1], j, spacing[1]);
      x[2] = gridCoordinate(origin[2], k, spacing[2]);
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

/// Every query against the cells around its own: (2 reach + 1)^3 cells, less those whose nearest
/// point lies beyond R (cullLimit: (R / cell size)^2 with a margin for the rounding of the gaps).
template <class Op>
__global__ void __launch_bounds__(queryThreads) queryGather(DeviceQueries queries, QuerySource source,
  PairTest test, float cullLimit, Op op, unsigned long long* decided)
{
  const int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= queries.count)
  {
    return;
  }
  const CellTable& table = source.table;
  double x[3], c[3];
  queries.get(q, x);
  float f[3];
  for (int a = 0; a < 3; ++a)
  {
    c[a] = cellCoordinate(x[a], table.cellSize);
    f[a] = frameCoordinate(x[a], c[a], table.cellSize, table.inverseCellSize);
  }
  const Particle query{ f[0], f[1], f[2], 0.0f };
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
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
            float r2 = squaredDistance(shiftedQuery, pj);
            const int verdict = test.classify(r2);
            if (verdict == 0)
            {
              continue;
            }
            if (verdict < 0)
            {
              ++decidedHere;
              const std::int64_t input = source.orderToInput ? source.orderToInput[j] : j;
              if (!test.exactQuery(x, input, r2))
              {
                continue;
              }
            }
            acc.add(op, j, pj, r2);
          }
        }
      }
    }
  }
  acc.finish(op, q, q);
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
  queryGather<<<blocks, queryThreads, 0, run.stream>>>(queries, source, test, cullLimit, op, run.decided);
}

} // namespace detail
} // namespace neighborgrid
