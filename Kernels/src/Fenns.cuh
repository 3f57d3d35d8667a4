// FENNS (Groß, Köster, Krüger 2019): a coarse uniform grid in global memory, a two-part sort that
// splits every coarse cell into a border section (particles within R of a face, filled from the
// left) and an inner section (filled from the right), and a search with one thread block per
// coarse cell that builds a fine grid of each chunk of the cell's particles in shared memory.
// Included by CudaBackend.cu only.
#pragma once

#include "Backend.h"
#include "Operations.h"

#include <cub/block/block_scan.cuh>

namespace neighborgrid
{
namespace detail
{

/// Threads per FENNS search block. 16 warps: the 26 neighbor cells' border sections are shared
/// out among them (two rounds) in the second stage.
constexpr int fennsBlockSize = 512;

/// Geometry of both grids, chosen on the host at run time (see planFenns in CudaBackend.cu).
struct FennsGrid
{
  Grid coarse;             // cells >= R wide, at most as many as shared memory holds counters for
  float coarseCellSize = 1; // the same size as coarse.inverseCellSize, for cell origins
  float border = 0;        // a particle is in the border section when within this of a face (R + margin)
  float fineOffset = 0;    // the fine grid starts this far before the coarse cell's origin
  float inverseFineCellSize = 1;
  int fineDim = 1;         // fine cells per axis
  int fineCells = 1;       // fineDim^3

  NG_HD float cellOrigin(int c) const { return static_cast<float>(c) * coarseCellSize; }
  NG_HD int fineAxis(float local) const
  {
    // local is relative to the coarse cell origin: computed from nearby floats, so it is exact or
    // nearly so whatever the distance from the global origin.
    return static_cast<int>(floorf((local + fineOffset) * inverseFineCellSize));
  }
};

__device__ __forceinline__ bool inBorder(const FennsGrid& g, float lx, float ly, float lz)
{
  const float far = g.coarseCellSize - g.border;
  return lx < g.border || ly < g.border || lz < g.border || lx > far || ly > far || lz > far;
}

/// Sort part 1 (the paper's Algorithm 1): count particles per coarse cell in shared memory, then
/// add each block's nonzero counters to global memory. Grid-stride loop.
__global__ void fennsCount(const float* __restrict__ xyz, int n, FennsGrid g, int* __restrict__ counts)
{
  extern __shared__ int sharedCounts[];
  const int cells = static_cast<int>(g.coarse.cellCount());
  for (int c = threadIdx.x; c < cells; c += blockDim.x)
  {
    sharedCounts[c] = 0;
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    const Particle p{ xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2], 1.0f };
    atomicAdd(sharedCounts + g.coarse.cellOf(p), 1);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cells; c += blockDim.x)
  {
    if (sharedCounts[c])
    {
      atomicAdd(counts + c, sharedCounts[c]);
    }
  }
}

/// Sort part 2 (Algorithm 2). On entry cellEnd holds the inclusive and borderEnd the exclusive
/// prefix sums of the counts. Border particles take slots from the left (borderEnd counts up),
/// inner particles from the right (cellEnd counts down); on exit both hold the start of each
/// cell's inner section. Each block also counts its border particles per cell in shared memory
/// and adds them to borderCount. The paper subtracts them from cellEnd in the same kernel; blocks
/// do not wait for each other, so a block that finished early would move cellEnd under one still
/// taking inner slots. fennsCellStarts does that subtraction once every block is done.
__global__ void fennsReorder(const float* __restrict__ xyz, int n, FennsGrid g, int* __restrict__ cellEnd,
  int* __restrict__ borderEnd, int* __restrict__ borderCount, Particle* __restrict__ ordered,
  int* __restrict__ orderToInput)
{
  extern __shared__ int sharedBorder[];
  const int cells = static_cast<int>(g.coarse.cellCount());
  for (int c = threadIdx.x; c < cells; c += blockDim.x)
  {
    sharedBorder[c] = 0;
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    const Particle p{ xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2], 1.0f };
    const int cx = g.coarse.cellX(p), cy = g.coarse.cellY(p), cz = g.coarse.cellZ(p);
    const int cell = g.coarse.cellIndex(cx, cy, cz);
    const bool border = inBorder(g, p.x - g.cellOrigin(cx), p.y - g.cellOrigin(cy), p.z - g.cellOrigin(cz));
    int slot;
    if (border)
    {
      atomicAdd(sharedBorder + cell, 1);
      slot = atomicAdd(borderEnd + cell, 1);
    }
    else
    {
      slot = atomicSub(cellEnd + cell, 1) - 1;
    }
    ordered[slot] = p;
    orderToInput[slot] = i;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cells; c += blockDim.x)
  {
    if (sharedBorder[c])
    {
      atomicAdd(borderCount + c, sharedBorder[c]);
    }
  }
}

/// Cell starts: the inner start less the border count.
__global__ void fennsCellStarts(int cells, const int* __restrict__ borderCount, int* __restrict__ cellStart)
{
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < cells)
  {
    cellStart[c] -= borderCount[c];
  }
}

/// Shared-memory layout of one search block (dynamic shared memory).
template <class Op>
struct FennsShared
{
  static constexpr std::size_t bytes(int fineCells)
  {
    return fennsBlockSize * (sizeof(Particle) + sizeof(int) + Op::Terms * sizeof(typename Op::Value)) +
      (fineCells + 1) * sizeof(int);
  }
};

/// The search (Algorithms 3 and 4): one block per coarse cell. cellStart has cells + 1 entries
/// (the last is n); innerStart marks the end of each cell's border section.
template <class Op>
__global__ void __launch_bounds__(fennsBlockSize) fennsSearch(FennsGrid g, const Particle* __restrict__ ordered,
  const int* __restrict__ cellStart, const int* __restrict__ innerStart, const int* __restrict__ orderToInput,
  float r2max, Op op)
{
  using Value = typename Op::Value;
  using BlockScan = cub::BlockScan<int, fennsBlockSize>;
  __shared__ typename BlockScan::TempStorage scanStorage;
  extern __shared__ __align__(16) unsigned char sharedBytes[];
  Particle* chunk = reinterpret_cast<Particle*>(sharedBytes);
  int* chunkOrder = reinterpret_cast<int*>(chunk + fennsBlockSize);
  Value* sums = reinterpret_cast<Value*>(chunkOrder + fennsBlockSize);
  int* fineStart = reinterpret_cast<int*>(sums + fennsBlockSize * Op::Terms);

  const int cell = blockIdx.x;
  const int cellBegin = cellStart[cell];
  const int cellEnd = cellStart[cell + 1];
  if (cellBegin == cellEnd)
  {
    return; // uniform across the block
  }
  const int dimX = g.coarse.dimX, dimY = g.coarse.dimY, dimZ = g.coarse.dimZ;
  const int cx = cell % dimX, cy = (cell / dimX) % dimY, cz = cell / (dimX * dimY);
  const float ox = g.cellOrigin(cx), oy = g.cellOrigin(cy), oz = g.cellOrigin(cz);
  const int f = g.fineDim;
  const int fineEntries = g.fineCells + 1;

  // Looks up the fine cells around a streamed particle pj and adds it to every chunk particle
  // within R (Algorithm 4). Shared-memory atomics: many threads may reach one chunk particle.
  auto visit = [&](int j, const Particle& pj) {
    const int fx = g.fineAxis(pj.x - ox), fy = g.fineAxis(pj.y - oy), fz = g.fineAxis(pj.z - oz);
    const int x0 = max(fx - 1, 0), x1 = min(fx + 1, f - 1);
    const int y0 = max(fy - 1, 0), y1 = min(fy + 1, f - 1);
    const int z0 = max(fz - 1, 0), z1 = min(fz + 1, f - 1);
    for (int z = z0; z <= z1; ++z)
    {
      for (int y = y0; y <= y1; ++y)
      {
        for (int x = x0; x <= x1; ++x)
        {
          const int fine = (z * f + y) * f + x;
          const int end = fineStart[fine + 1];
          for (int k = fineStart[fine]; k < end; ++k)
          {
            const float r2 = squaredDistance(chunk[k], pj);
            if (r2 <= r2max)
            {
              Value t[Op::Terms];
              op.pair(t, j, pj, r2);
              for (int q = 0; q < Op::Terms; ++q)
              {
                atomicAdd(sums + k * Op::Terms + q, t[q]);
              }
            }
          }
        }
      }
    }
  };

  // Chunks of the block size; every thread runs every iteration so barriers stay uniform.
  for (int base = cellBegin; base < cellEnd; base += fennsBlockSize)
  {
    const int i = base + static_cast<int>(threadIdx.x);
    const bool valid = i < cellEnd;
    const Particle p = valid ? ordered[i] : Particle{ 0, 0, 0, 0 };
    int fine = 0;
    if (valid)
    {
      const int fx = min(max(g.fineAxis(p.x - ox), 0), f - 1);
      const int fy = min(max(g.fineAxis(p.y - oy), 0), f - 1);
      const int fz = min(max(g.fineAxis(p.z - oz), 0), f - 1);
      fine = (fz * f + fy) * f + fx;
    }
    for (int k = threadIdx.x; k < fineEntries; k += fennsBlockSize)
    {
      fineStart[k] = 0;
    }
    __syncthreads();
    const int offset = valid ? atomicAdd(fineStart + fine, 1) : 0;
    __syncthreads();
    // Block-wide exclusive scan of the fine-cell counts: each thread owns a contiguous run.
    {
      const int perThread = (fineEntries + fennsBlockSize - 1) / fennsBlockSize;
      const int first = threadIdx.x * perThread;
      int runTotal = 0;
      for (int k = first; k < min(first + perThread, fineEntries); ++k)
      {
        runTotal += fineStart[k];
      }
      int runStart = 0;
      BlockScan(scanStorage).ExclusiveSum(runTotal, runStart);
      __syncthreads();
      for (int k = first; k < min(first + perThread, fineEntries); ++k)
      {
        const int count = fineStart[k];
        fineStart[k] = runStart;
        runStart += count;
      }
    }
    __syncthreads();
    if (valid)
    {
      const int slot = fineStart[fine] + offset;
      chunk[slot] = p;
      chunkOrder[slot] = i;
      for (int q = 0; q < Op::Terms; ++q)
      {
        sums[slot * Op::Terms + q] = Value(0);
      }
    }
    __syncthreads();

    // Stage 1: every particle of this coarse cell against the chunk, through the fine grid.
    for (int j = cellBegin + static_cast<int>(threadIdx.x); j < cellEnd; j += fennsBlockSize)
    {
      visit(j, ordered[j]);
    }
    // Stage 2: the border sections of the 26 neighboring coarse cells, one warp per cell.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int w = warp; w < 27; w += fennsBlockSize / 32)
    {
      if (w == 13)
      {
        continue; // the cell itself
      }
      const int nx = cx + w % 3 - 1, ny = cy + (w / 3) % 3 - 1, nz = cz + w / 9 - 1;
      if (nx < 0 || ny < 0 || nz < 0 || nx >= dimX || ny >= dimY || nz >= dimZ)
      {
        continue;
      }
      const int neighbor = (nz * dimY + ny) * dimX + nx;
      const int borderEnd = innerStart[neighbor];
      for (int k = cellStart[neighbor] + lane; k < borderEnd; k += 32)
      {
        visit(k, ordered[k]);
      }
    }
    __syncthreads();
    // Finish once per particle of the chunk.
    const int chunkSize = min(fennsBlockSize, cellEnd - base);
    if (static_cast<int>(threadIdx.x) < chunkSize)
    {
      const int slot = threadIdx.x;
      Value sum[Op::Terms];
      for (int q = 0; q < Op::Terms; ++q)
      {
        sum[q] = sums[slot * Op::Terms + q];
      }
      const int s = chunkOrder[slot];
      op.finish(sum, s, orderToInput[s]);
    }
    __syncthreads();
  }
}

} // namespace detail
} // namespace neighborgrid
