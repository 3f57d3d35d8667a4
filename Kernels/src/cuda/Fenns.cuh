// FENNS (Groß, Köster, Krüger 2019) and CLAWS (2020): the kernels. Fenns.cu drives them.
//
// A coarse grid in global memory, a two-part sort that splits every coarse cell into a border
// section (points within R of a face) and an inner section, and a search with one thread block
// per coarse cell that builds a fine grid of the cell's points in shared memory.
//
// On the grid every method shares (CellGrid.h): coarse cells are keyed by their coordinates and
// only occupied ones hold a slot of the table (SlotCells, CellTable.h); where the data fill their
// bounds the slots are the paper's dense coarse grid. Points are stored in frame coordinates of
// their coarse cell (units of its size): a neighbor cell's points are moved into a block's frame
// by adding the integer offset of that cell. Pairs within rounding of R are decided in double
// (PairTest.h).
#pragma once

#include "CellTable.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>

namespace neighborgrid
{
namespace detail
{

/// Geometry of the fine grid inside a coarse cell, in frame units (the coarse cell is [0, 1)^3);
/// chosen on the host (Fenns.cu, planFenns).
struct FennsGrid
{
  float border = 0.0f;      // a point within this of a face is in the border section
  float fineOffset = 0.0f;  // the fine grid starts this far before the cell's origin
  float inverseFineCellSize = 1.0f;
  int fineDim = 1;          // fine cells per axis
  int fineCells = 1;        // fineDim^3

  NG_HD int fineAxis(float local) const
  {
    // NaN (a huge axis, CellGrid.h) goes to the first fine cell, with every point that shares it.
    return local == local ? static_cast<int>(floorf((local + fineOffset) * inverseFineCellSize)) : 0;
  }
};

/// In the border section unless clearly inside on every axis (NaN counts as border).
__device__ __forceinline__ bool inBorder(const FennsGrid& g, const Particle& p)
{
  const float far = 1.0f - g.border;
  return !(p.x >= g.border && p.y >= g.border && p.z >= g.border && p.x <= far && p.y <= far && p.z <= far);
}

struct CoarseFrame
{
  double size = 1.0;
  double inverse = 1.0;
};

// --- Sort part 1 (the paper's Algorithm 1): counts per coarse cell ------------------------------
/// Counts per slot (FENNS) or per inner and border section (CLAWS: border counts at slots + slot),
/// in shared memory when the counters fit (then added to global memory once per block, as in the
/// paper), in global memory otherwise. Grid-stride loop; a block's counts are in global memory
/// when it returns. cellOf gives each point's slot: SlotInsert inserts the point's cell into the
/// table here (SlotCells::prepare), SlotsGiven reads what SlotCells::build wrote.
template <class Slots>
__device__ void countBlockSections(InputPoints input, int n, CoarseFrame frame, FennsGrid g, const Slots& cellOf,
  int slots, bool sections, bool useShared, int* __restrict__ counts)
{
  extern __shared__ int sharedCounts[];
  const int counters = sections ? 2 * slots : slots;
  if (useShared)
  {
    for (int c = threadIdx.x; c < counters; c += blockDim.x)
    {
      sharedCounts[c] = 0;
    }
    __syncthreads();
  }
  int* target = useShared ? sharedCounts : counts;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    int counter = cellOf.insert(i);
    if (sections && inBorder(g, inputParticle(input, i, frame.size, frame.inverse)))
    {
      counter += slots;
    }
    atomicAdd(target + counter, 1);
  }
  if (useShared)
  {
    __syncthreads();
    for (int c = threadIdx.x; c < counters; c += blockDim.x)
    {
      if (sharedCounts[c])
      {
        atomicAdd(counts + c, sharedCounts[c]);
      }
    }
  }
}

template <class Slots>
__global__ void fennsCount(InputPoints input, int n, CoarseFrame frame, FennsGrid g, Slots cellOf, int slots,
  bool sections, bool useShared, int* __restrict__ counts)
{
  countBlockSections(input, n, frame, g, cellOf, slots, sections, useShared, counts);
}

// --- Sort part 2 (Algorithm 2): border sections from the left, inner sections from the right ----
/// On entry cellEnd holds the inclusive and borderEnd the exclusive prefix sums of the counts.
/// Border points take slots from the left (borderEnd counts up), inner points from the right
/// (cellEnd counts down); on exit both hold the start of each cell's inner section. Border points
/// are also counted per cell (borderCount). The paper subtracts them from cellEnd in the same
/// kernel; blocks do not wait for each other, so a block that finished early would move cellEnd
/// under one still taking inner slots: fennsCellStarts does it once every block is done.
__global__ void fennsReorder(InputPoints input, int n, CoarseFrame frame, FennsGrid g,
  const std::int32_t* __restrict__ slotOf, int* __restrict__ cellEnd, int* __restrict__ borderEnd,
  int* __restrict__ borderCount, Particle* __restrict__ ordered, std::int32_t* __restrict__ orderToInput)
{
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    const Particle p = inputParticle(input, i, frame.size, frame.inverse);
    const int cell = slotOf[i];
    int slot;
    if (inBorder(g, p))
    {
      atomicAdd(borderCount + cell, 1);
      slot = atomicAdd(borderEnd + cell, 1);
    }
    else
    {
      slot = atomicSub(cellEnd + cell, 1) - 1;
    }
    ordered[slot] = p;
    orderToInput[slot] = static_cast<std::int32_t>(i);
  }
}

/// Cell starts: the inner start less the border count.
__global__ void fennsCellStarts(int slots, const int* __restrict__ borderCount, int* __restrict__ cellStart)
{
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < slots)
  {
    cellStart[c] -= borderCount[c];
  }
}

// --- CLAWS sort: inner sections of all cells first, then border sections ------------------------
/// On entry cursor holds the inclusive sums of the section counts (each section's end); points
/// fill each section from its end, so on exit cursor holds each section's start.
__global__ void clawsReorder(InputPoints input, int n, CoarseFrame frame, FennsGrid g,
  const std::int32_t* __restrict__ slotOf, int slots, int* __restrict__ cursor, Particle* __restrict__ ordered,
  std::int32_t* __restrict__ orderToInput)
{
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
  {
    const Particle p = inputParticle(input, i, frame.size, frame.inverse);
    const int slot = atomicSub(cursor + slotOf[i] + (inBorder(g, p) ? slots : 0), 1) - 1;
    ordered[slot] = p;
    orderToInput[slot] = static_cast<std::int32_t>(i);
  }
}

// --- Sort part 2 for few sections: a block's atomics instead of a point's -------------------------
constexpr int tiledReorderThreads = 512;
constexpr int tiledReorderMostSections = 1024;

/// clawsReorder and fennsReorder for clouds of few sections (2 * slots, CLAWS's and FENNS's
/// sections alike: inner ones, then border ones). There every point's global atomic meets
/// hundreds of others at its section's end: 65,536 points in about 125 coarse cells, 260 an
/// address, made clawsReorder 17 us against 5 for Counting Sort's scatter (H200). A block counts
/// its points per section in shared memory (a point's rank within the block's share), takes each
/// section's share with one global atomic, and places its points there: 6.5 us. A point a
/// thread: blocks of 1,024 or 2,048 points (2 or 4 a thread) took 7.7 and 11.7 us, on fewer SMs.
/// The same contract as the two kernels: CLAWS (borderEnd null): innerEnd holds the inclusive
/// sums of all 2 * slots sections, shares are taken from the ends. FENNS: innerEnd holds the
/// inclusive sums of the cells (inner shares from the ends), borderEnd the exclusive sums
/// (border shares from the starts, counted in borderCount).
__global__ void __launch_bounds__(tiledReorderThreads) tiledReorder(InputPoints input, int n, CoarseFrame frame,
  FennsGrid g, const std::int32_t* __restrict__ slotOf, int slots, int* __restrict__ innerEnd,
  int* __restrict__ borderEnd, int* __restrict__ borderCount, Particle* __restrict__ ordered,
  std::int32_t* __restrict__ orderToInput)
{
  extern __shared__ int share[]; // a section's points in this block, then its share's first slot
  const int sections = 2 * slots;
  for (int s = threadIdx.x; s < sections; s += tiledReorderThreads)
  {
    share[s] = 0;
  }
  __syncthreads();
  const std::int64_t i = std::int64_t(blockIdx.x) * tiledReorderThreads + threadIdx.x; // n may be near 2^31
  Particle p;
  int section = -1, rank = 0;
  if (i < n)
  {
    p = inputParticle(input, i, frame.size, frame.inverse);
    section = slotOf[i] + (inBorder(g, p) ? slots : 0);
    rank = atomicAdd(share + section, 1);
  }
  __syncthreads();
  for (int s = threadIdx.x; s < sections; s += tiledReorderThreads)
  {
    const int count = share[s];
    if (count == 0)
    {
      continue;
    }
    if (borderEnd && s >= slots)
    {
      atomicAdd(borderCount + (s - slots), count);
      share[s] = atomicAdd(borderEnd + (s - slots), count);
    }
    else
    {
      share[s] = atomicSub(innerEnd + s, count) - count;
    }
  }
  __syncthreads();
  if (section >= 0)
  {
    const int slot = share[section] + rank;
    ordered[slot] = p;
    orderToInput[slot] = static_cast<std::int32_t>(i);
  }
}

/// Where a cell's points are. FENNS layout: cell c is [start[c], start[c + 1]), its border
/// section [start[c], innerStart[c]). CLAWS layout: start has 2 * slots + 1 entries: inner section
/// of c [start[c], start[c + 1]), border section [start[slots + c], start[slots + c + 1]).
struct CellLayout
{
  const int* start = nullptr;
  const int* innerStart = nullptr;
  int slots = 0;
  bool claws = false;

  NG_HD void ownRanges(int c, int& a0, int& aLength, int& b0, int& bLength) const
  {
    a0 = start[c];
    aLength = start[c + 1] - a0;
    b0 = claws ? start[slots + c] : 0;
    bLength = claws ? start[slots + c + 1] - b0 : 0;
  }
  NG_HD void borderRange(int c, int& begin, int& end) const
  {
    begin = claws ? start[slots + c] : start[c];
    end = claws ? start[slots + c + 1] : innerStart[c];
  }
  NG_HD int size(int c) const
  {
    int a0, aLength, b0, bLength;
    ownRanges(c, a0, aLength, b0, bLength);
    return aLength + bLength;
  }
};

/// Lists slot c, which holds `points` > 0 points: its cell, and one item a chunk.
__device__ __forceinline__ void listSlot(int c, int points, int chunk, int* __restrict__ occupied,
  int2* __restrict__ items, int* __restrict__ counts)
{
  occupied[atomicAdd(counts, 1)] = c;
  const int chunks = (points + chunk - 1) / chunk;
  const int first = atomicAdd(counts + 1, chunks);
  for (int k = 0; k < chunks; ++k)
  {
    items[first + k] = make_int2(c, k * chunk);
  }
}

/// The occupied slots (one block each in the scatter variant), and the search's work items: one
/// per chunk of `chunk` points of an occupied cell, (slot, first point), so that a cell of many
/// chunks runs on many blocks instead of looping over its chunks on one. counts[0] receives the
/// occupied cells, counts[1] the items.
__global__ void listOccupied(CellLayout layout, int chunk, int* __restrict__ occupied, int2* __restrict__ items,
  int* __restrict__ counts)
{
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int size = c < layout.slots ? layout.size(c) : 0;
  if (size > 0)
  {
    listSlot(c, size, chunk, occupied, items, counts);
  }
}

/// What the sort tallies on the device for the host and the search. The first two are read back
/// together.
struct SortTallies
{
  unsigned long long squaredCounts = 0; // the host sizes the coarse cells by it
  unsigned long long chunks = 0;        // the search's blocks: chunks of `chunk` points a cell
  int listed[2] = { 0, 0 };             // listOccupied: occupied cells and chunks listed
  unsigned int countedBlocks = 0;       // countAndScanSmallSort: blocks done counting
};

/// The points of slot c: counts[c], plus borders[c] where the counts are CLAWS's inner sections.
__device__ __forceinline__ unsigned long long slotPoints(const int* counts, const int* borders, int c)
{
  return static_cast<unsigned long long>(counts[c]) + (borders ? borders[c] : 0);
}

/// Over the slots: the sum of their points squared, and their chunks of `chunk` points (as
/// listOccupied lists them), added to the tallies.
__global__ void sumOfSquares(const int* __restrict__ counts, const int* __restrict__ borders, int slots, int chunk,
  SortTallies* __restrict__ tallies)
{
  unsigned long long sum = 0, chunks = 0;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < slots; c += gridDim.x * blockDim.x)
  {
    const unsigned long long points = slotPoints(counts, borders, c);
    sum += points * points;
    chunks += (points + chunk - 1) / chunk;
  }
  for (int offset = 16; offset > 0; offset /= 2)
  {
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
    chunks += __shfl_down_sync(0xffffffffu, chunks, offset);
  }
  if (threadIdx.x % 32 == 0 && sum)
  {
    atomicAdd(&tallies->squaredCounts, sum);
    atomicAdd(&tallies->chunks, chunks);
  }
}

/// Clouds whose sections fit one block (smallSortEntries): the sum of squares of sumOfSquares, the
/// scans of the sort and listOccupied's lists in the block that counts last, since a sort of a few
/// thousand points is mostly the host's launch calls (five launches become one). counts: the
/// `entries` section counts (the last a zero), scanned in place (inclusive sums); exclusive,
/// where not null, receives their exclusive sums (FENNS's inner starts); the tallies as
/// sumOfSquares and listOccupied write them.
constexpr int smallSortThreads = 1024;
constexpr int smallSortItems = 8;
constexpr int smallSortEntries = 4 * smallSortThreads * smallSortItems;

struct SmallSortScan
{
  int entries = 0;
  int chunk = 0;
  int* exclusive = nullptr;
  SortTallies* tallies = nullptr;
  int* occupied = nullptr;
  int2* items = nullptr;
  // The squared counts and the chunks also go to the host's pinned memory (device-mapped), so
  // no copy back has to follow the kernel in the stream.
  unsigned long long* hostTallies = nullptr;
};

/// One block of smallSortThreads. Counts are read past L1 (__ldcg): other blocks wrote them.
__device__ void scanSmallSections(int* __restrict__ counts, int slots, bool bordersFollow, const SmallSortScan& scan)
{
  using Scan = cub::BlockScan<int, smallSortThreads>;
  using Reduce = cub::BlockReduce<unsigned long long, smallSortThreads>;
  __shared__ union
  {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } temp;
  // The squares, chunks and listOccupied's lists first: the scan overwrites the counts they read.
  unsigned long long squares = 0, chunks = 0;
  for (int c = threadIdx.x; c < slots; c += smallSortThreads)
  {
    const unsigned long long points =
      static_cast<unsigned long long>(__ldcg(counts + c)) + (bordersFollow ? __ldcg(counts + slots + c) : 0);
    squares += points * points;
    chunks += (points + scan.chunk - 1) / scan.chunk;
    if (points > 0)
    {
      listSlot(c, static_cast<int>(points), scan.chunk, scan.occupied, scan.items, scan.tallies->listed);
    }
  }
  const unsigned long long squareSum = Reduce(temp.reduce).Sum(squares);
  __syncthreads();
  const unsigned long long chunkSum = Reduce(temp.reduce).Sum(chunks);
  if (threadIdx.x == 0)
  {
    scan.tallies->squaredCounts = squareSum;
    scan.tallies->chunks = chunkSum;
    scan.hostTallies[0] = squareSum;
    scan.hostTallies[1] = chunkSum;
  }
  __syncthreads();
  int carry = 0;
  for (int base = 0; base < scan.entries; base += smallSortThreads * smallSortItems)
  {
    const int first = base + threadIdx.x * smallSortItems;
    int items[smallSortItems], sums[smallSortItems];
    for (int k = 0; k < smallSortItems; ++k)
    {
      items[k] = first + k < scan.entries ? __ldcg(counts + first + k) : 0;
    }
    int tileTotal = 0;
    Scan(temp.scan).InclusiveSum(items, sums, tileTotal);
    for (int k = 0; k < smallSortItems; ++k)
    {
      if (first + k < scan.entries)
      {
        counts[first + k] = carry + sums[k];
        if (scan.exclusive)
        {
          scan.exclusive[first + k] = carry + sums[k] - items[k];
        }
      }
    }
    carry += tileTotal;
    __syncthreads(); // the next tile reuses the scan's storage
  }
}

/// fennsCount, then scanSmallSections in the block that finishes counting last (every block's
/// counts are in global memory by then: each fences before it is counted as done).
template <class Slots>
__global__ void __launch_bounds__(smallSortThreads) countAndScanSmallSort(InputPoints input, int n, CoarseFrame frame,
  FennsGrid g, Slots cellOf, int slots, bool sections, bool useShared, int* __restrict__ counts, SmallSortScan scan)
{
  countBlockSections(input, n, frame, g, cellOf, slots, sections, useShared, counts);
  if (finishedLastOfGrid(&scan.tallies->countedBlocks))
  {
    scanSmallSections(counts, slots, sections, scan);
  }
}

/// The 26 neighbor cells of a block's cell, as runs of points with the offset of their cell. A
/// run may merge up to three cells of one row whose sections lie next to each other in memory
/// (CLAWS' merged lookups): the x offset then steps up at split1 and again at split2.
constexpr int maxNeighborRuns = 26;
struct NeighborRuns
{
  int start[maxNeighborRuns];
  int length[maxNeighborRuns];
  int prefix[maxNeighborRuns + 1];
  // Positions, not shorts: a border section of a dense cell holds far more than 32767 points
  // (a short overflowed there and moved the rest of the run into the wrong cell).
  int split1[maxNeighborRuns];
  int split2[maxNeighborRuns];
  signed char dx[maxNeighborRuns], dy[maxNeighborRuns], dz[maxNeighborRuns];
  int count;
  int slot[27]; // the neighbor cells' slots (-1: none), by offset index (dz + 1) * 9 + (dy + 1) * 3 + dx + 1
};

/// Threads 0..26 look up one neighbor each; thread 0 then forms the runs. Ends with a barrier.
__device__ void findNeighborRuns(const CellTable& table, const CellLayout& layout, int cell, bool merge, NeighborRuns& r)
{
  if (threadIdx.x < 27)
  {
    const int t = threadIdx.x;
    int found = -1;
    double c[3], neighbor[3];
    table.coordinates(cell, c);
    if (t != 13 && offsetCell(c, t % 3 - 1, (t / 3) % 3 - 1, t / 9 - 1, neighbor))
    {
      found = table.find(neighbor);
    }
    r.slot[t] = found;
  }
  __syncthreads();
  if (threadIdx.x == 0)
  {
    int runs = 0;
    for (int row = 0; row < 9; ++row)
    {
      bool open = false;
      int lastEnd = 0;
      for (int x = 0; x < 3; ++x)
      {
        const int t = row * 3 + x;
        const int s = r.slot[t];
        if (s < 0)
        {
          continue;
        }
        int begin, end;
        layout.borderRange(s, begin, end);
        if (merge && open && begin == lastEnd)
        {
          // Next to the open run in memory: extend it; the x offset steps up here.
          const int r0 = runs - 1;
          const int at = r.length[r0];
          const int steps = (x - 1) - (r.dx[r0] + (r.split1[r0] <= at ? 1 : 0) + (r.split2[r0] <= at ? 1 : 0));
          for (int k = 0; k < steps; ++k)
          {
            if (r.split1[r0] > at)
            {
              r.split1[r0] = at;
            }
            else
            {
              r.split2[r0] = at;
            }
          }
          r.length[r0] += end - begin;
          lastEnd = end;
          continue;
        }
        if (end <= begin && !merge)
        {
          continue;
        }
        r.start[runs] = begin;
        r.length[runs] = end - begin;
        r.split1[runs] = r.split2[runs] = INT_MAX; // no step
        r.dx[runs] = static_cast<signed char>(x - 1);
        r.dy[runs] = static_cast<signed char>(row % 3 - 1);
        r.dz[runs] = static_cast<signed char>(row / 3 - 1);
        ++runs;
        open = true;
        lastEnd = end;
      }
    }
    r.count = runs;
    int total = 0;
    for (int k = 0; k < runs; ++k)
    {
      r.prefix[k] = total;
      total += r.length[k];
    }
    r.prefix[runs] = total;
  }
  __syncthreads();
}

/// The x offset of the point at `position` of run k.
__device__ __forceinline__ int runDx(const NeighborRuns& r, int k, int position)
{
  return r.dx[k] + (position >= r.split1[k] ? 1 : 0) + (position >= r.split2[k] ? 1 : 0);
}

/// Threads per block of the paper-direction (scatter) search variant.
constexpr int fennsScatterBlockSize = 512;

/// Shared-memory bytes of one block of the scatter variant.
template <class Op>
constexpr std::size_t fennsScatterSharedBytes(int fineCells)
{
  return fennsScatterBlockSize * (sizeof(Particle) + sizeof(int) + Op::Terms * sizeof(typename Op::Value)) +
    (fineCells + 1) * sizeof(int);
}

/// Searches share these, beside the grids.
struct FennsSearchParams
{
  FennsGrid g;
  CellTable table;
  CellLayout layout;
  const int* occupied = nullptr; // the scatter variant: one block per occupied cell
  const int2* items = nullptr;   // the search: one block per chunk of an occupied cell (listOccupied)
  // How many of each listOccupied wrote ([0] cells, [1] items): the grids are launched at their
  // bounds without reading the counts back, and blocks past them return at once.
  const int* listed = nullptr;
  PairTest test;
  unsigned long long* decided = nullptr;
};

/// The search exactly as the paper's Algorithms 3 and 4 direct it: one block per coarse cell;
/// every streamed point (the whole cell, then the 26 neighbors' border sections, one warp per
/// cell) looks up the chunk's fine grid and adds itself to the chunk points within R through
/// shared-memory atomics. Kept as a variant for the benchmark (NEIGHBORGRID_FENNS_VARIANT=scatter):
/// on the H100 its lanes diverge (ncu: 5.7 of 32 threads active), see fennsSearch below.
template <class Op>
__global__ void __launch_bounds__(fennsScatterBlockSize) fennsSearchScatter(FennsSearchParams params,
  const Particle* __restrict__ ordered, const std::int32_t* __restrict__ orderToInput, Op op)
{
  using Value = typename Op::Value;
  using BlockScan = cub::BlockScan<int, fennsScatterBlockSize>;
  __shared__ typename BlockScan::TempStorage scanStorage;
  __shared__ NeighborRuns runs;
  extern __shared__ __align__(16) unsigned char sharedBytes[];
  Particle* chunk = reinterpret_cast<Particle*>(sharedBytes);
  int* chunkOrder = reinterpret_cast<int*>(chunk + fennsScatterBlockSize);
  Value* sums = reinterpret_cast<Value*>(chunkOrder + fennsScatterBlockSize);
  int* fineStart = reinterpret_cast<int*>(sums + fennsScatterBlockSize * Op::Terms);

  const FennsGrid& g = params.g;
  const PairTest& test = params.test;
  if (static_cast<int>(blockIdx.x) >= params.listed[0])
  {
    return;
  }
  const int cell = params.occupied[blockIdx.x];
  const int cellBegin = params.layout.start[cell];
  const int cellEnd = params.layout.start[cell + 1];
  findNeighborRuns(params.table, params.layout, cell, false, runs);
  const int f = g.fineDim;
  const int fineEntries = g.fineCells + 1;
  unsigned decided = 0;

  // Looks up the fine cells around a streamed point pj (in the block's frame) and adds it to every
  // chunk point within R (Algorithm 4). Shared-memory atomics: many threads may reach one.
  auto visit = [&](int j, const Particle& pj) {
    const int fx = g.fineAxis(pj.x), fy = g.fineAxis(pj.y), fz = g.fineAxis(pj.z);
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
            float r2 = squaredDistance(chunk[k], pj);
            if (isNeighbor(test, r2, chunkOrder[k], j, orderToInput, decided))
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
      const int fx = min(max(g.fineAxis(p.x), 0), f - 1);
      const int fy = min(max(g.fineAxis(p.y), 0), f - 1);
      const int fz = min(max(g.fineAxis(p.z), 0), f - 1);
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

    // Stage 1: every point of this coarse cell against the chunk, through the fine grid.
    for (int j = cellBegin + static_cast<int>(threadIdx.x); j < cellEnd; j += fennsScatterBlockSize)
    {
      visit(j, ordered[j]);
    }
    // Stage 2: the border sections of the neighboring coarse cells, one warp per cell, moved into
    // the block's frame.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int w = warp; w < runs.count; w += fennsScatterBlockSize / 32)
    {
      for (int k = lane; k < runs.length[w]; k += 32)
      {
        const int j = runs.start[w] + k;
        const Particle q = ordered[j];
        visit(j, Particle{ __fadd_rn(q.x, float(runDx(runs, w, k))), __fadd_rn(q.y, float(runs.dy[w])),
                   __fadd_rn(q.z, float(runs.dz[w])), q.w });
      }
    }
    __syncthreads();
    // Finish once per point of the chunk.
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
  addDecided(params.decided, decided);
}

// --- The search, H100 form ---------------------------------------------------------------------
// Same structure as the paper: blocks per coarse cell; chunks of the cell's points are loaded
// and binned into a fine grid (atomic counts, a block prefix sum, a local reorder) in shared
// memory; in-cell neighbors are found through that fine grid; the neighbors' border sections are
// scanned one warp per cell; barriers stay uniform; finish() runs once per point.
// One thing is turned around to suit a GPU with 227 KB of shared memory per block: the points that
// the paper streams past the chunk (the rest of the cell, the in-range border points) are binned
// into a second fine grid in shared memory, and every chunk point looks up its 27 fine cells
// there. Lanes then own consecutive points of one fine cell, walk the same cells and stay
// converged, and sums stay in registers.
//
// The same kernel runs CLAWS (Groß et al. 2020) with SearchFlags:
//  - symmetric: pairs inside the loaded chunk are evaluated once, by the point that comes first
//    in fine-grid order, and applied to both (the other one through shared-memory atomics);
//  - clawsLayout: cells are sorted inner sections first (all cells), then border sections (all
//    cells), so the border sections of neighboring cells lie next to each other;
//  - merged: lookups read runs of three consecutive cells as one range: 27 fine-cell lookups
//    become 9 and, with clawsLayout, neighbor border sections next to each other in memory become
//    one run (with the dense table, 26 become 10);
//  - balancedWarps: the neighbors' border points are dealt out to all warps in runs of 32,
//    instead of one warp per neighbor cell (see fennsSearch).

struct SearchFlags
{
  bool symmetric = false;
  bool clawsLayout = false;
  bool merged = false;
  bool balancedWarps = false;
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
constexpr int fennsPerThread = NEIGHBORGRID_FENNS_PER_THREAD; // chunk points each thread owns
constexpr int fennsChunk = fennsThreads * fennsPerThread;   // points per chunk
constexpr int fennsBatch = fennsChunk;                      // neighbors binned per round
constexpr int fennsWarpQuota = fennsBatch / fennsWarps;     // staging slots per warp and round

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
  Value* chunkSums; // symmetric: what the chunk's points receive from each other
  int* fineStart;
  int* warpCount;
};

/// Bins the staged points (per-warp runs of warpCount[w] in slots w * quota ...) into the fine
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
      cell[i] = (fineClamped(g, p.z) * g.fineDim + fineClamped(g, p.y)) * g.fineDim + fineClamped(g, p.x);
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

/// Stages `count` (at most a chunk) of the cell's own points, from position `first` of the cell's
/// sequence (range a, then range b), and bins them.
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

/// Every owned point against the binned batch, through the 27 fine cells around it (9 runs of
/// three with `merged`). With `halfShell` (symmetric, the batch is the own chunk) a pair is
/// evaluated only by the point earlier in fine-grid order, and the other one's terms go to
/// chunkSums; the point itself is added once.
template <class Op>
__device__ __forceinline__ void gatherBatch(const FennsGrid& g, const FennsBlockState<typename Op::Value>& s,
  const Particle (&mine)[fennsPerThread], const int (&mineJ)[fennsPerThread], const bool (&owned)[fennsPerThread],
  RegisterSums<Op> (&sums)[fennsPerThread], const PairTest& test, const std::int32_t* __restrict__ orderToInput,
  unsigned& decided, const Op& op, bool merged, bool halfShell)
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
    const int fx = fineClamped(g, p.x), fy = fineClamped(g, p.y), fz = fineClamped(g, p.z);
    const int x0 = max(fx - 1, 0), x1 = min(fx + 1, f - 1);
    auto visitRange = [&](int begin, int end) {
      if (halfShell)
      {
        begin = max(begin, slot + 1);
      }
      for (int k = begin; k < end; ++k)
      {
        const Particle q = s.batchP[k];
        float r2 = squaredDistance(p, q);
        if (isNeighbor(test, r2, mineJ[i], s.batchJ[k], orderToInput, decided))
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

/// The FENNS search (and CLAWS, by flags). One block per chunk of an occupied coarse cell: a
/// cell of a dense cluster holds many chunks, and one block looping over them would run alone
/// long after the rest of the device is idle.
template <class Op>
__global__ void __launch_bounds__(fennsThreads, NEIGHBORGRID_FENNS_MIN_BLOCKS) fennsSearch(FennsSearchParams params,
  const Particle* __restrict__ ordered, const std::int32_t* __restrict__ orderToInput, Op op, SearchFlags flags)
{
  using Value = typename Op::Value;
  __shared__ typename cub::BlockScan<int, fennsThreads>::TempStorage scanStorage;
  __shared__ int warpCount[fennsWarps];
  __shared__ NeighborRuns runs;
  extern __shared__ __align__(16) unsigned char sharedBytes[];

  const FennsGrid& g = params.g;
  if (static_cast<int>(blockIdx.x) >= params.listed[1])
  {
    return; // the whole block: no barrier is left waiting
  }
  const int2 item = params.items[blockIdx.x];
  const int cell = item.x;
  int a0, aLength, b0, bLength;
  params.layout.ownRanges(cell, a0, aLength, b0, bLength);
  const int cellCount = aLength + bLength;
  FennsBlockState<Value> s;
  s.stageP = reinterpret_cast<Particle*>(sharedBytes);
  s.batchP = s.stageP + fennsBatch;
  s.stageJ = reinterpret_cast<int*>(s.batchP + fennsBatch);
  s.batchJ = s.stageJ + fennsBatch;
  s.chunkSums = reinterpret_cast<Value*>(s.batchJ + fennsBatch);
  s.fineStart = reinterpret_cast<int*>(s.chunkSums + fennsChunk * Op::Terms);
  s.warpCount = warpCount;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int f = g.fineDim;
  unsigned decided = 0;

  // The neighbors' border sections: one run per neighbor cell, or with the CLAWS layout and
  // merged lookups, one run per row of cells whose sections lie next to each other.
  findNeighborRuns(params.table, params.layout, cell, flags.merged && params.layout.claws, runs);
  const int runCount = runs.count;
  const int total = runs.prefix[runCount];

  // This block's chunk of the cell (listOccupied): the whole cell against it, then the neighbors.
  {
    const int base = item.y;
    const int chunkCount = min(fennsChunk, cellCount - base);
    // The chunk, binned; each thread takes consecutive points of the fine-cell order.
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
    // Stage 1: the cell's own points, chunk by chunk (this chunk first: it is binned already).
    gatherBatch(g, s, mine, mineJ, owned, sums, params.test, orderToInput, decided, op, flags.merged, flags.symmetric);
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
      gatherBatch(g, s, mine, mineJ, owned, sums, params.test, orderToInput, decided, op, flags.merged, false);
    }

    // Stage 2: border points of the neighbors that reach into the fine grid, in rounds of at most
    // one batch, moved into the block's frame. Each warp stages into its own slots, compacting
    // with a ballot.
    int range = warp, position = 0; // one warp per neighbor run
    int item = warp;                // balanced: the next run of 32 in the concatenated sections
    for (;;)
    {
      int appended = 0;
      for (;;)
      {
        int j = -1, k = 0, at = 0;
        if (flags.balancedWarps)
        {
          if (!(item * 32 < total && appended + 32 <= fennsWarpQuota))
          {
            break;
          }
          const int element = item * 32 + lane;
          if (element < total)
          {
            while (runs.prefix[k + 1] <= element)
            {
              ++k;
            }
            at = element - runs.prefix[k];
            j = runs.start[k] + at;
          }
          item += fennsWarps;
        }
        else
        {
          while (range < runCount && position >= runs.length[range])
          {
            range += fennsWarps;
            position = 0;
          }
          if (!(range < runCount && appended + 32 <= fennsWarpQuota))
          {
            break;
          }
          if (position + lane < runs.length[range])
          {
            k = range;
            at = position + lane;
            j = runs.start[range] + at;
          }
          position += 32;
        }
        bool inRange = false;
        Particle p{ 0, 0, 0, 0 };
        if (j >= 0)
        {
          const Particle q = ordered[j];
          p = Particle{ __fadd_rn(q.x, float(runDx(runs, k, at))), __fadd_rn(q.y, float(runs.dy[k])),
            __fadd_rn(q.z, float(runs.dz[k])), q.w };
          const int fx = g.fineAxis(p.x), fy = g.fineAxis(p.y), fz = g.fineAxis(p.z);
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
      while (!flags.balancedWarps && range < runCount && position >= runs.length[range])
      {
        range += fennsWarps;
        position = 0;
      }
      const bool remaining = flags.balancedWarps ? item * 32 < total : range < runCount;
      const bool anyRemaining = __syncthreads_or(remaining);
      binBatch(g, s, scanStorage);
      gatherBatch(g, s, mine, mineJ, owned, sums, params.test, orderToInput, decided, op, flags.merged, false);
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
  addDecided(params.decided, decided);
}

} // namespace detail
} // namespace neighborgrid
