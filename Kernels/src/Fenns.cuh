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

/// Threads per block of the paper-direction (scatter) search variant.
constexpr int fennsScatterBlockSize = 512;

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

/// Shared-memory bytes of one block of the scatter variant.
template <class Op>
constexpr std::size_t fennsScatterSharedBytes(int fineCells)
{
  return fennsScatterBlockSize * (sizeof(Particle) + sizeof(int) + Op::Terms * sizeof(typename Op::Value)) +
    (fineCells + 1) * sizeof(int);
}

/// The search exactly as the paper's Algorithms 3 and 4 direct it: one block per coarse cell;
/// every streamed particle (the whole cell, then the 26 neighbors' border sections, one warp per
/// cell) looks up the chunk's fine grid and adds itself to the chunk particles within R through
/// shared-memory atomics. Kept as a variant for the benchmark (NEIGHBORGRID_FENNS_VARIANT=scatter):
/// on the H100 its lanes diverge (ncu: 5.7 of 32 threads active), see fennsSearch below.
/// cellStart has cells + 1 entries (the last is n); innerStart ends each cell's border section.
template <class Op>
__global__ void __launch_bounds__(fennsScatterBlockSize) fennsSearchScatter(FennsGrid g, const Particle* __restrict__ ordered,
  const int* __restrict__ cellStart, const int* __restrict__ innerStart, const int* __restrict__ orderToInput,
  float r2max, Op op)
{
  using Value = typename Op::Value;
  using BlockScan = cub::BlockScan<int, fennsScatterBlockSize>;
  __shared__ typename BlockScan::TempStorage scanStorage;
  extern __shared__ __align__(16) unsigned char sharedBytes[];
  Particle* chunk = reinterpret_cast<Particle*>(sharedBytes);
  int* chunkOrder = reinterpret_cast<int*>(chunk + fennsScatterBlockSize);
  Value* sums = reinterpret_cast<Value*>(chunkOrder + fennsScatterBlockSize);
  int* fineStart = reinterpret_cast<int*>(sums + fennsScatterBlockSize * Op::Terms);

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
  for (int base = cellBegin; base < cellEnd; base += fennsScatterBlockSize)
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
    for (int k = threadIdx.x; k < fineEntries; k += fennsScatterBlockSize)
    {
      fineStart[k] = 0;
    }
    __syncthreads();
    const int offset = valid ? atomicAdd(fineStart + fine, 1) : 0;
    __syncthreads();
    // Block-wide exclusive scan of the fine-cell counts: each thread owns a contiguous run.
    {
      const int perThread = (fineEntries + fennsScatterBlockSize - 1) / fennsScatterBlockSize;
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
    for (int j = cellBegin + static_cast<int>(threadIdx.x); j < cellEnd; j += fennsScatterBlockSize)
    {
      visit(j, ordered[j]);
    }
    // Stage 2: the border sections of the 26 neighboring coarse cells, one warp per cell.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int w = warp; w < 27; w += fennsScatterBlockSize / 32)
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
    const int chunkSize = min(fennsScatterBlockSize, cellEnd - base);
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

// --- The search, H100 form ---------------------------------------------------------------------
// Same structure as the paper: one block per coarse cell; chunks of the cell's particles are loaded
// and binned into a fine grid (atomic counts, a block prefix sum, a local reorder) in shared
// memory; in-cell neighbors are found through that fine grid; the 26 neighbors' border sections
// are scanned one warp per cell; barriers stay uniform; finish() runs once per particle.
// One thing is turned around to suit a GPU with 227 KB of shared memory per block: the particles
// that the paper streams past the chunk (the rest of the cell, the in-range border particles) are
// binned into a second fine grid in shared memory, and every chunk particle looks up its 27 fine
// cells there. Lanes then own consecutive particles of one fine cell, walk the same cells and stay
// converged, and sums stay in registers.
//
// The same kernel runs CLAWS (Groß et al. 2020) with SearchFlags:
//  - symmetric: pairs inside the loaded chunk are evaluated once, by the particle that comes first
//    in fine-grid order, and applied to both (the other one through shared-memory atomics);
//  - clawsLayout: cells are sorted inner sections first (all cells), then border sections (all
//    cells), so the border sections of neighboring cells lie next to each other;
//  - merged: lookups read runs of three consecutive cells as one range: 27 fine-cell lookups
//    become 9 and, with clawsLayout, the 26 neighbor border sections become 10 runs;
//  - balancedWarps: the neighbors' border particles are dealt out to all warps in runs of 32,
//    instead of one warp per neighbor cell (see fennsSearch).

struct SearchFlags
{
  bool symmetric = false;
  bool clawsLayout = false;
  bool merged = false;
  bool balancedWarps = false;
};

/// Where a cell's particles are. FENNS layout: cell c is [start[c], start[c + 1]), its border
/// section [start[c], innerStart[c]). CLAWS layout: start has 2 * cells + 1 entries: inner section
/// of c [start[c], start[c + 1]), border section [start[cells + c], start[cells + c + 1]).
struct CellLayout
{
  const int* start = nullptr;
  const int* innerStart = nullptr;
  int cells = 0;
  bool claws = false;

  __device__ void ownRanges(int c, int& a0, int& aLength, int& b0, int& bLength) const
  {
    a0 = start[c];
    aLength = start[c + 1] - a0;
    b0 = claws ? start[cells + c] : 0;
    bLength = claws ? start[cells + c + 1] - b0 : 0;
  }
  __device__ void borderRange(int c, int& begin, int& end) const
  {
    begin = claws ? start[cells + c] : start[c];
    end = claws ? start[cells + c + 1] : innerStart[c];
  }
};

#ifndef NEIGHBORGRID_FENNS_THREADS
#define NEIGHBORGRID_FENNS_THREADS 256
#endif
#ifndef NEIGHBORGRID_FENNS_PER_THREAD
#define NEIGHBORGRID_FENNS_PER_THREAD 4
#endif
#ifndef NEIGHBORGRID_FENNS_MIN_BLOCKS
#define NEIGHBORGRID_FENNS_MIN_BLOCKS 4
#endif
constexpr int fennsThreads = NEIGHBORGRID_FENNS_THREADS;
constexpr int fennsWarps = fennsThreads / 32;
constexpr int fennsPerThread = NEIGHBORGRID_FENNS_PER_THREAD; // chunk particles each thread owns
constexpr int fennsChunk = fennsThreads * fennsPerThread;   // particles per chunk
constexpr int fennsBatch = fennsChunk;                      // neighbors binned per round
constexpr int fennsWarpQuota = fennsBatch / fennsWarps;     // staging slots per warp and round
constexpr int maxNeighborRuns = 26;

/// Dynamic shared memory of one search block: staging and binned batch (positions and indices),
/// the symmetric sums of the chunk, and the fine grid's cell starts.
template <class Op>
std::size_t fennsSharedBytes(int fineCells)
{
  return 2 * fennsBatch * (sizeof(Particle) + sizeof(int)) + fennsChunk * Op::Terms * sizeof(typename Op::Value) +
    (fineCells + 1) * sizeof(int);
}

__device__ __forceinline__ int fineClamped(const FennsGrid& g, float local)
{
  return min(max(g.fineAxis(local), 0), g.fineDim - 1);
}

/// Block-wide exclusive scan of data[0, count) in place.
template <int Threads>
__device__ void blockExclusiveScan(int* data, int count, typename cub::BlockScan<int, Threads>::TempStorage& storage)
{
  const int perThread = (count + Threads - 1) / Threads;
  const int first = static_cast<int>(threadIdx.x) * perThread;
  const int last = min(first + perThread, count);
  int total = 0;
  for (int k = first; k < last; ++k)
  {
    total += data[k];
  }
  int start = 0;
  cub::BlockScan<int, Threads>(storage).ExclusiveSum(total, start);
  __syncthreads();
  for (int k = first; k < last; ++k)
  {
    const int value = data[k];
    data[k] = start;
    start += value;
  }
}

template <class Value>
struct FennsBlockState
{
  Particle* stageP;
  int* stageJ;
  Particle* batchP;
  int* batchJ;
  Value* chunkSums; // symmetric: what the chunk's particles receive from each other
  int* fineStart;
  int* warpCount;
  float ox, oy, oz;
};

/// Bins the staged particles (per-warp runs of warpCount[w] in slots w * quota ...) into the fine
/// grid: batchP/batchJ in fine-cell order, fineStart the exclusive starts.
template <class Value>
__device__ void binBatch(const FennsGrid& g, const FennsBlockState<Value>& s,
  cub::BlockScan<int, fennsThreads>::TempStorage& scanStorage)
{
  const int entries = g.fineCells + 1;
  for (int k = threadIdx.x; k < entries; k += fennsThreads)
  {
    s.fineStart[k] = 0;
  }
  __syncthreads();
  constexpr int itemsPerThread = fennsBatch / fennsThreads;
  int cell[itemsPerThread], offset[itemsPerThread];
#pragma unroll
  for (int i = 0; i < itemsPerThread; ++i)
  {
    const int q = threadIdx.x + i * fennsThreads;
    cell[i] = -1;
    if (q % fennsWarpQuota < s.warpCount[q / fennsWarpQuota])
    {
      const Particle p = s.stageP[q];
      cell[i] = (fineClamped(g, p.z - s.oz) * g.fineDim + fineClamped(g, p.y - s.oy)) * g.fineDim +
        fineClamped(g, p.x - s.ox);
      offset[i] = atomicAdd(s.fineStart + cell[i], 1);
    }
  }
  __syncthreads();
  blockExclusiveScan<fennsThreads>(s.fineStart, entries, scanStorage);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < itemsPerThread; ++i)
  {
    if (cell[i] >= 0)
    {
      const int q = threadIdx.x + i * fennsThreads;
      const int slot = s.fineStart[cell[i]] + offset[i];
      s.batchP[slot] = s.stageP[q];
      s.batchJ[slot] = s.stageJ[q];
    }
  }
  __syncthreads();
}

/// Stages `count` (at most a chunk) of the cell's own particles, from position `first` of the
/// cell's sequence (range a, then range b), and bins them.
template <class Value>
__device__ void binOwn(const FennsGrid& g, const FennsBlockState<Value>& s, const Particle* __restrict__ ordered,
  int a0, int aLength, int b0, int first, int count, cub::BlockScan<int, fennsThreads>::TempStorage& scanStorage)
{
  if (threadIdx.x < fennsWarps)
  {
    s.warpCount[threadIdx.x] = min(max(count - static_cast<int>(threadIdx.x) * fennsWarpQuota, 0), fennsWarpQuota);
  }
  for (int q = threadIdx.x; q < count; q += fennsThreads)
  {
    const int position = first + q;
    const int j = position < aLength ? a0 + position : b0 + (position - aLength);
    s.stageP[q] = ordered[j];
    s.stageJ[q] = j;
  }
  __syncthreads();
  binBatch(g, s, scanStorage);
}

/// Every owned particle against the binned batch, through the 27 fine cells around it (9 runs of
/// three with `merged`). With `halfShell` (symmetric, the batch is the own chunk) a pair is
/// evaluated only by the particle earlier in fine-grid order, and the other one's terms go to
/// chunkSums; the particle itself is added once.
template <class Op>
__device__ __forceinline__ void gatherBatch(const FennsGrid& g, const FennsBlockState<typename Op::Value>& s,
  const Particle (&mine)[fennsPerThread], const int (&mineJ)[fennsPerThread], const bool (&owned)[fennsPerThread],
  RegisterSums<Op> (&sums)[fennsPerThread], float r2max, const Op& op, bool merged, bool halfShell)
{
  using Value = typename Op::Value;
  const int f = g.fineDim;
#pragma unroll
  for (int i = 0; i < fennsPerThread; ++i)
  {
    if (!owned[i])
    {
      continue;
    }
    const Particle p = mine[i];
    const int slot = threadIdx.x + i * fennsThreads; // the chunk is binned in the batch
    if (halfShell)
    {
      sums[i].add(op, mineJ[i], p, 0.0f);
    }
    const int fx = fineClamped(g, p.x - s.ox), fy = fineClamped(g, p.y - s.oy), fz = fineClamped(g, p.z - s.oz);
    const int x0 = max(fx - 1, 0), x1 = min(fx + 1, f - 1);
    auto visitRange = [&](int begin, int end) {
      if (halfShell)
      {
        begin = max(begin, slot + 1);
      }
      for (int k = begin; k < end; ++k)
      {
        const Particle q = s.batchP[k];
        const float r2 = squaredDistance(p, q);
        if (r2 <= r2max)
        {
          sums[i].add(op, s.batchJ[k], q, r2);
          if (halfShell)
          {
            Value t[Op::Terms];
            op.pair(t, mineJ[i], p, r2);
            for (int term = 0; term < Op::Terms; ++term)
            {
              atomicAdd(s.chunkSums + k * Op::Terms + term, t[term]);
            }
          }
        }
      }
    };
    for (int z = max(fz - 1, 0); z <= min(fz + 1, f - 1); ++z)
    {
      for (int y = max(fy - 1, 0); y <= min(fy + 1, f - 1); ++y)
      {
        const int row = (z * f + y) * f;
        if (merged)
        {
          visitRange(s.fineStart[row + x0], s.fineStart[row + x1 + 1]);
        }
        else
        {
          for (int x = x0; x <= x1; ++x)
          {
            visitRange(s.fineStart[row + x], s.fineStart[row + x + 1]);
          }
        }
      }
    }
  }
}

/// The FENNS search (and CLAWS, by flags). One block per coarse cell.
template <class Op>
__global__ void __launch_bounds__(fennsThreads, NEIGHBORGRID_FENNS_MIN_BLOCKS) fennsSearch(FennsGrid g,
  const Particle* __restrict__ ordered, CellLayout layout, const int* __restrict__ orderToInput, float r2max, Op op,
  SearchFlags flags)
{
  using Value = typename Op::Value;
  __shared__ typename cub::BlockScan<int, fennsThreads>::TempStorage scanStorage;
  __shared__ int warpCount[fennsWarps];
  __shared__ int rangeStart[maxNeighborRuns];
  __shared__ int rangeLength[maxNeighborRuns];
  __shared__ int rangePrefix[maxNeighborRuns + 1];
  __shared__ int rangeCount;
  extern __shared__ __align__(16) unsigned char sharedBytes[];

  const int cell = blockIdx.x;
  int a0, aLength, b0, bLength;
  layout.ownRanges(cell, a0, aLength, b0, bLength);
  const int cellCount = aLength + bLength;
  if (cellCount == 0)
  {
    return; // uniform across the block
  }
  const int dimX = g.coarse.dimX, dimY = g.coarse.dimY, dimZ = g.coarse.dimZ;
  const int cx = cell % dimX, cy = (cell / dimX) % dimY, cz = cell / (dimX * dimY);
  FennsBlockState<Value> s;
  s.stageP = reinterpret_cast<Particle*>(sharedBytes);
  s.batchP = s.stageP + fennsBatch;
  s.stageJ = reinterpret_cast<int*>(s.batchP + fennsBatch);
  s.batchJ = s.stageJ + fennsBatch;
  s.chunkSums = reinterpret_cast<Value*>(s.batchJ + fennsBatch);
  s.fineStart = reinterpret_cast<int*>(s.chunkSums + fennsChunk * Op::Terms);
  s.warpCount = warpCount;
  s.ox = g.cellOrigin(cx);
  s.oy = g.cellOrigin(cy);
  s.oz = g.cellOrigin(cz);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int f = g.fineDim;

  // The neighbors' border sections: 26 ranges, or with the CLAWS layout and merged lookups, one
  // run per row of three cells (two in the cell's own row, which leaves the cell itself out).
  if (threadIdx.x == 0)
  {
    int runs = 0;
    for (int dz = -1; dz <= 1; ++dz)
    {
      for (int dy = -1; dy <= 1; ++dy)
      {
        const int ny = cy + dy, nz = cz + dz;
        if (ny < 0 || nz < 0 || ny >= dimY || nz >= dimZ)
        {
          continue;
        }
        const int x0 = max(cx - 1, 0), x1 = min(cx + 1, dimX - 1);
        const int row = (nz * dimY + ny) * dimX;
        auto addRun = [&](int begin, int end) {
          if (end > begin)
          {
            rangeStart[runs] = begin;
            rangeLength[runs] = end - begin;
            ++runs;
          }
        };
        if (flags.merged && layout.claws)
        {
          const int* border = layout.start + layout.cells;
          if (dy == 0 && dz == 0)
          {
            addRun(border[row + x0], border[row + cx]);
            addRun(border[row + cx + 1], border[row + x1 + 1]);
          }
          else
          {
            addRun(border[row + x0], border[row + x1 + 1]);
          }
        }
        else
        {
          for (int x = x0; x <= x1; ++x)
          {
            if (dy == 0 && dz == 0 && x == cx)
            {
              continue;
            }
            int begin, end;
            layout.borderRange(row + x, begin, end);
            addRun(begin, end);
          }
        }
      }
    }
    rangeCount = runs;
    int total = 0;
    for (int r = 0; r < runs; ++r)
    {
      rangePrefix[r] = total;
      total += rangeLength[r];
    }
    rangePrefix[runs] = total;
  }
  __syncthreads();
  const int runs = rangeCount;
  const int total = rangePrefix[runs];

  for (int base = 0; base < cellCount; base += fennsChunk)
  {
    const int chunkCount = min(fennsChunk, cellCount - base);
    // The chunk, binned; each thread takes consecutive particles of the fine-cell order.
    binOwn(g, s, ordered, a0, aLength, b0, base, chunkCount, scanStorage);
    Particle mine[fennsPerThread];
    int mineJ[fennsPerThread];
    bool owned[fennsPerThread];
    RegisterSums<Op> sums[fennsPerThread];
#pragma unroll
    for (int i = 0; i < fennsPerThread; ++i)
    {
      const int slot = threadIdx.x + i * fennsThreads;
      owned[i] = slot < chunkCount;
      mine[i] = owned[i] ? s.batchP[slot] : Particle{ 0, 0, 0, 0 };
      mineJ[i] = owned[i] ? s.batchJ[slot] : 0;
    }
    if (flags.symmetric)
    {
      for (int k = threadIdx.x; k < chunkCount * Op::Terms; k += fennsThreads)
      {
        s.chunkSums[k] = Value(0);
      }
      __syncthreads();
    }
    // Stage 1: the cell's own particles, chunk by chunk (this chunk first: it is binned already).
    gatherBatch(g, s, mine, mineJ, owned, sums, r2max, op, flags.merged, flags.symmetric);
    if (flags.symmetric)
    {
      __syncthreads();
#pragma unroll
      for (int i = 0; i < fennsPerThread; ++i)
      {
        if (owned[i])
        {
          sums[i].addTerms(s.chunkSums + (threadIdx.x + i * fennsThreads) * Op::Terms);
        }
      }
    }
    for (int other = 0; other < cellCount; other += fennsChunk)
    {
      if (other == base)
      {
        continue;
      }
      __syncthreads();
      binOwn(g, s, ordered, a0, aLength, b0, other, min(fennsChunk, cellCount - other), scanStorage);
      gatherBatch(g, s, mine, mineJ, owned, sums, r2max, op, flags.merged, false);
    }

    // Stage 2: border particles of the neighbors that reach into the fine grid, in rounds of at
    // most one batch. Each warp stages into its own slots, compacting with a ballot.
    int range = warp, position = 0; // one warp per neighbor cell (per run)
    int run = warp;                 // balanced: the next run of 32 in the concatenated sections
    for (;;)
    {
      int appended = 0;
      for (;;)
      {
        int j = -1;
        if (flags.balancedWarps)
        {
          if (!(run * 32 < total && appended + 32 <= fennsWarpQuota))
          {
            break;
          }
          const int item = run * 32 + lane;
          if (item < total)
          {
            int r = 0;
            while (rangePrefix[r + 1] <= item)
            {
              ++r;
            }
            j = rangeStart[r] + (item - rangePrefix[r]);
          }
          run += fennsWarps;
        }
        else
        {
          while (range < runs && position >= rangeLength[range])
          {
            range += fennsWarps;
            position = 0;
          }
          if (!(range < runs && appended + 32 <= fennsWarpQuota))
          {
            break;
          }
          if (position + lane < rangeLength[range])
          {
            j = rangeStart[range] + position + lane;
          }
          position += 32;
        }
        bool inRange = false;
        Particle p{ 0, 0, 0, 0 };
        if (j >= 0)
        {
          p = ordered[j];
          const int fx = g.fineAxis(p.x - s.ox), fy = g.fineAxis(p.y - s.oy), fz = g.fineAxis(p.z - s.oz);
          inRange = fx >= 0 && fy >= 0 && fz >= 0 && fx < f && fy < f && fz < f;
        }
        const unsigned mask = __ballot_sync(0xffffffffu, inRange);
        if (inRange)
        {
          const int slot = warp * fennsWarpQuota + appended + __popc(mask & ((1u << lane) - 1u));
          s.stageP[slot] = p;
          s.stageJ[slot] = j;
        }
        appended += __popc(mask);
      }
      if (lane == 0)
      {
        warpCount[warp] = appended;
      }
      while (!flags.balancedWarps && range < runs && position >= rangeLength[range])
      {
        range += fennsWarps;
        position = 0;
      }
      const bool remaining = flags.balancedWarps ? run * 32 < total : range < runs;
      const bool anyRemaining = __syncthreads_or(remaining);
      binBatch(g, s, scanStorage);
      gatherBatch(g, s, mine, mineJ, owned, sums, r2max, op, flags.merged, false);
      __syncthreads();
      if (!anyRemaining)
      {
        break;
      }
    }

#pragma unroll
    for (int i = 0; i < fennsPerThread; ++i)
    {
      if (owned[i])
      {
        sums[i].finish(op, mineJ[i], orderToInput[mineJ[i]]);
      }
    }
    __syncthreads();
  }
}

// --- CLAWS sort: inner sections of all cells first, then border sections ------------------------
/// Counts per section (inner of c at c, border of c at cells + c) in shared memory, then global.
__global__ void clawsCount(const float* __restrict__ xyz, int n, FennsGrid g, int* __restrict__ counts)
{
  extern __shared__ int sharedCounts[];
  const int cells = static_cast<int>(g.coarse.cellCount());
  for (int c = threadIdx.x; c < 2 * cells; c += blockDim.x)
  {
    sharedCounts[c] = 0;
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    const Particle p{ xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2], 1.0f };
    const int cx = g.coarse.cellX(p), cy = g.coarse.cellY(p), cz = g.coarse.cellZ(p);
    const bool border = inBorder(g, p.x - g.cellOrigin(cx), p.y - g.cellOrigin(cy), p.z - g.cellOrigin(cz));
    atomicAdd(sharedCounts + g.coarse.cellIndex(cx, cy, cz) + (border ? cells : 0), 1);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * cells; c += blockDim.x)
  {
    if (sharedCounts[c])
    {
      atomicAdd(counts + c, sharedCounts[c]);
    }
  }
}

/// On entry cursor holds the inclusive sums of the section counts (each section's end); particles
/// fill each section from its end, so on exit cursor holds each section's start (the last entry,
/// n, untouched).
__global__ void clawsReorder(const float* __restrict__ xyz, int n, FennsGrid g, int* __restrict__ cursor,
  Particle* __restrict__ ordered, int* __restrict__ orderToInput)
{
  const int cells = static_cast<int>(g.coarse.cellCount());
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
  {
    const Particle p{ xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2], 1.0f };
    const int cx = g.coarse.cellX(p), cy = g.coarse.cellY(p), cz = g.coarse.cellZ(p);
    const bool border = inBorder(g, p.x - g.cellOrigin(cx), p.y - g.cellOrigin(cy), p.z - g.cellOrigin(cz));
    const int slot = atomicSub(cursor + g.coarse.cellIndex(cx, cy, cz) + (border ? cells : 0), 1) - 1;
    ordered[slot] = p;
    orderToInput[slot] = i;
  }
}

} // namespace detail
} // namespace neighborgrid
