// The search of Counting Sort and Radix Sort (Hoetzlein 2013, Green 2008): one thread per point,
// in cell order; the point's cell from its input coordinates, the 27 cells around it through the
// lookup table, each neighbor cell's points tested in the frame of that cell.
// The lookups are made per cell, not per point: a block's points are consecutive in cell order,
// so they fall in few cells (256 points at about 19 a cell of R: 14 cells at 80 neighbors). The
// block finds its distinct cells, looks up their 27 neighbors' ranges once into shared memory, and
// every point reads them there. Blocks that span more cells (sparse data) look them up per point.
#pragma once

#include "CellTable.h"

#include <cub/block/block_scan.cuh>

namespace neighborgrid
{
namespace detail
{

constexpr int gridSearchThreads = 256;
constexpr int maxBlockCells = 64; // distinct cells a block looks up once, in shared memory

/// The points of neighbor cell k (0..26: dx + 1 + 3 (dy + 1) + 9 (dz + 1)) of cell c; empty when
/// the cell is not occupied or lies across a huge cell's axis (CellGrid.h).
__device__ __forceinline__ int2 neighborRange(const CellTable& grid, const double c[3], int k)
{
  double cell[3];
  if (!offsetCell(c, k % 3 - 1, (k / 3) % 3 - 1, k / 9 - 1, cell))
  {
    return make_int2(0, 0);
  }
  const int m = grid.find(cell);
  return m < 0 ? make_int2(0, 0) : make_int2(grid.start[m], grid.start[m + 1]);
}

template <class Op>
__global__ void __launch_bounds__(gridSearchThreads) gridSearch(CellTable grid, const Particle* __restrict__ particles,
  const std::int32_t* __restrict__ orderToInput, int n, PairTest test, Op op, unsigned long long* decided)
{
  using BlockScan = cub::BlockScan<int, gridSearchThreads>;
  __shared__ typename BlockScan::TempStorage scanStorage;
  __shared__ double pointCell[gridSearchThreads][3];
  __shared__ double blockCell[maxBlockCells][3];
  __shared__ int2 blockRanges[maxBlockCells][27];

  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = s < n;
  int i = 0;
  double c[3] = { 0.0, 0.0, 0.0 };
  if (active)
  {
    i = orderToInput[s];
    inputCell(test.points, i, grid.cellSize, grid.inverseCellSize, c);
    for (int a = 0; a < 3; ++a)
    {
      pointCell[threadIdx.x][a] = c[a];
    }
  }
  __syncthreads();
  // A point leads a run of its cell in the block when the point before it lies in another cell
  // (a NaN coordinate leads its own run).
  bool leads = active && threadIdx.x == 0;
  if (active && threadIdx.x > 0)
  {
    const double* before = pointCell[threadIdx.x - 1];
    leads = !(before[0] == c[0] && before[1] == c[1] && before[2] == c[2]);
  }
  int run = 0, runs = 0;
  BlockScan(scanStorage).InclusiveSum(leads ? 1 : 0, run, runs);
  --run; // this point's run
  const bool perCell = runs <= maxBlockCells;
  if (perCell)
  {
    if (leads)
    {
      for (int a = 0; a < 3; ++a)
      {
        blockCell[run][a] = c[a];
      }
    }
    __syncthreads();
    for (int w = threadIdx.x; w < 27 * runs; w += gridSearchThreads)
    {
      blockRanges[w / 27][w % 27] = neighborRange(grid, blockCell[w / 27], w % 27);
    }
    __syncthreads();
  }
  if (!active)
  {
    return;
  }

  const Particle pi = particles[s];
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
  for (int k = 0; k < 27; ++k)
  {
    const int2 range = perCell ? blockRanges[run][k] : neighborRange(grid, c, k);
    if (range.x == range.y)
    {
      continue;
    }
    const Particle q = shifted(pi, float(k % 3 - 1), float((k / 3) % 3 - 1), float(k / 9 - 1));
    for (int j = range.x; j < range.y; ++j)
    {
      const Particle pj = particles[j];
      float r2 = squaredDistance(q, pj);
      if (isNeighbor(test, r2, s, j, orderToInput, decidedHere))
      {
        acc.add(op, j, pj, r2);
      }
    }
  }
  acc.finish(op, s, i);
  addDecided(decided, decidedHere);
}

/// The search over `grid` for every point of `particles` (the method's order), on the run's stream.
template <class Op>
void launchGridSearch(CudaRun& run, const CellTable& grid, const Particle* particles,
  const std::int32_t* orderToInput, const PairTest& test, const Op& op)
{
  const int n = static_cast<int>(run.count);
  gridSearch<<<blocksFor(n, gridSearchThreads), gridSearchThreads, 0, run.stream>>>(
    grid, particles, orderToInput, n, test, op, run.decided);
}

namespace
{
/// particles[s] = input point orderToInput[s] in frame coordinates of its cell (point s where
/// orderToInput is null: the input is already in order).
__global__ void particlesInOrder(InputPoints input, const std::int32_t* __restrict__ orderToInput, int n,
  double cellSize, double inverseCellSize, Particle* __restrict__ particles)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    particles[s] = inputParticle(input, orderToInput ? orderToInput[s] : s, cellSize, inverseCellSize);
  }
}
} // namespace

} // namespace detail
} // namespace neighborgrid
