// The search of Counting Sort and Radix Sort (Hoetzlein 2013, Green 2008): one thread per point,
// in cell order; the point's cell from its input coordinates, the 27 cells around it through the
// lookup table, each neighbor cell's points tested in the frame of that cell.
#pragma once

#include "CellTable.h"

namespace neighborgrid
{
namespace detail
{

constexpr int gridSearchThreads = 256;

template <class Op>
__global__ void __launch_bounds__(gridSearchThreads) gridSearch(CellTable grid, const Particle* __restrict__ particles,
  const std::int32_t* __restrict__ orderToInput, int n, PairTest test, Op op, unsigned long long* decided)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n)
  {
    return;
  }
  const Particle pi = particles[s];
  const int i = orderToInput[s];
  double c[3];
  inputCell(test.points, i, grid.cellSize, c);
  RegisterSums<Op> acc;
  unsigned decidedHere = 0;
  for (int dz = -1; dz <= 1; ++dz)
  {
    for (int dy = -1; dy <= 1; ++dy)
    {
      for (int dx = -1; dx <= 1; ++dx)
      {
        double neighbor[3];
        if (!offsetCell(c, dx, dy, dz, neighbor))
        {
          continue;
        }
        const int cell = grid.find(neighbor);
        if (cell < 0)
        {
          continue;
        }
        const Particle q = shifted(pi, float(dx), float(dy), float(dz));
        const int end = grid.start[cell + 1];
        for (int j = grid.start[cell]; j < end; ++j)
        {
          const Particle pj = particles[j];
          float r2 = squaredDistance(q, pj);
          if (isNeighbor(test, r2, s, j, orderToInput, decidedHere))
          {
            acc.add(op, j, pj, r2);
          }
        }
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
/// particles[s] = input point orderToInput[s] in frame coordinates of its cell.
__global__ void particlesInOrder(InputPoints input, const std::int32_t* __restrict__ orderToInput, int n,
  double cellSize, double inverseCellSize, Particle* __restrict__ particles)
{
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < n)
  {
    particles[s] = inputParticle(input, orderToInput[s], cellSize, inverseCellSize);
  }
}
} // namespace

} // namespace detail
} // namespace neighborgrid
