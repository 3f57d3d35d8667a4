// Counting Sort (Hoetzlein 2013, Fluids v3): every point finds its cell in a hash table of the
// occupied cells and takes an offset in it with an atomic increment; an exclusive scan over the
// cells gives their starts; the points are scattered into cell order; one thread per point then
// searches the 27 cells around its own (GridSearch.cuh).
// The table's slots are the cells. Where the data fill their bounds the key is its own slot (no
// hashing: the paper's dense grid over the bounding box); elsewhere, such as around a far outlier,
// only occupied cells take slots. Keys wider than 64 bits are grouped by the radix sort instead
// (CellTable.h).
#include "GridSearch.cuh"
#include "ExclusiveSum.cuh"

#include <cub/block/block_scan.cuh>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// Each point's place in its cell, counted. Slots: SlotInsert (the point's cell inserted into the
/// table here, in the same pass) or SlotsGiven (slots the ranked cells wrote).
template <class Slots>
__global__ void takeOffsets(
  Slots slots, int n, std::int32_t* __restrict__ counts, std::int32_t* __restrict__ offsetInCell)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    offsetInCell[i] = atomicAdd(counts + slots.insert(i), 1);
  }
}

/// Tables of at most smallTableEntries counts (clouds of up to 2,048 points, 8 slots a cell): the
/// exclusive scan of the counts in the block of takeOffsetsAndScan that finishes last, instead of
/// CUB's sizing call and two launches. A small sort is mostly the host's launch calls (about 5 us
/// each in the H100 machine's probe, RESULTS.md), as FENNS's and CLAWS's were before
/// countAndScanSmallSort. Not for larger tables: one SM scanning the 65,537 counts of 8,192 points
/// took 25-35 us more than CUB's launches cost (H200, RESULTS.md).
constexpr int offsetsThreads = 1024;
constexpr int offsetsScanItems = 8;
constexpr int smallTableEntries = 4 * offsetsThreads * offsetsScanItems;

/// takeOffsets, then the scan of counts[0, entries) into start in the last block. doneBlocks is
/// zero on entry (cleared with the counts). Counts are read past L1 (__ldcg): other blocks wrote them.
template <class Slots>
__global__ void __launch_bounds__(offsetsThreads) takeOffsetsAndScan(Slots slots, int n,
  std::int32_t* __restrict__ counts, std::int32_t* __restrict__ offsetInCell, std::int32_t* __restrict__ start,
  int entries, unsigned int* __restrict__ doneBlocks)
{
  const std::int64_t i = std::int64_t(blockIdx.x) * offsetsThreads + threadIdx.x;
  if (i < n)
  {
    offsetInCell[i] = atomicAdd(counts + slots.insert(i), 1);
  }
  if (!finishedLastOfGrid(doneBlocks))
  {
    return;
  }
  using Scan = cub::BlockScan<std::int32_t, offsetsThreads>;
  __shared__ typename Scan::TempStorage temp;
  std::int32_t carry = 0;
  for (int base = 0; base < entries; base += offsetsThreads * offsetsScanItems)
  {
    const int first = base + threadIdx.x * offsetsScanItems;
    std::int32_t items[offsetsScanItems];
    for (int k = 0; k < offsetsScanItems; ++k)
    {
      items[k] = first + k < entries ? __ldcg(counts + first + k) : 0;
    }
    std::int32_t total = 0;
    Scan(temp).ExclusiveSum(items, items, total);
    for (int k = 0; k < offsetsScanItems; ++k)
    {
      if (first + k < entries)
      {
        start[first + k] = carry + items[k];
      }
    }
    carry += total;
    __syncthreads(); // the next tile reuses the scan's storage
  }
}

__global__ void scatterToCells(InputPoints input, int n, const std::int32_t* __restrict__ slotOf,
  const std::int32_t* __restrict__ offsetInCell, const std::int32_t* __restrict__ start, double cellSize,
  double inverseCellSize, Particle* __restrict__ particles, std::int32_t* __restrict__ orderToInput)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    const int s = start[slotOf[i]] + offsetInCell[i];
    particles[s] = inputParticle(input, i, cellSize, inverseCellSize);
    orderToInput[s] = i;
  }
}

/// Slots a cell of Counting Sort's table for n points. Its search probes the 27 cells around each
/// point, and in sparse data nearly all of them are empty: a probe for an empty cell walks the run
/// of full slots after its home, 2.5 slots on average in a table half full, 1.4 a quarter full and
/// 1.15 an eighth full, each a load the thread waits on. Small clouds' tables afford the room.
int countingSortSlotsPerCell(std::int64_t n)
{
  return n <= 16384 ? 8 : (n <= 131072 ? 4 : 2);
}

class CountingSort final : public CudaMethod
{
public:
  explicit CountingSort(DevicePool& pool)
    : slots_(pool), radix_(pool), counts_(pool), start_(pool), offsets_(pool), particles_(pool), orderToInput_(pool),
      scratch_(pool)
  {
  }
  Method id() const override { return Method::CountingSort; }

  std::int64_t plannedBytes(const CudaRun& run) const override
  {
    const Problem& p = *run.problem;
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, baselineCellSize(p.radius));
    const std::int64_t n = run.count;
    if (layout.mode == KeyMode::Wide)
    {
      return RadixCells::plannedBytes(n, layout, false);
    }
    const int perCell = countingSortSlotsPerCell(n);
    const std::int64_t slots = perCell * cellCapacity(n, layout) + 2; // upper bound of the table's size
    return SlotCells::plannedBytes(n, layout, perCell) + 4 * (slots + 2) + 4 * (slots + 1) + 4 * n + 16 * n + 4 * n +
      (std::int64_t(8) << 20);
  }

  void sort(CudaRun& run) override
  {
    const Problem& p = *run.problem;
    const int n = static_cast<int>(run.count);
    cellSize_ = baselineCellSize(p.radius);
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, cellSize_);
    test_ = makePairTest(p.radius, cellSize_, 2.0, run.input);
    wide_ = layout.mode == KeyMode::Wide;
    if (wide_)
    {
      radix_.build(run, layout, cellSize_, false);
      particles_.release();
      orderToInput_.release();
      particlesInOrder<<<blocksFor(n), 256, 0, run.stream>>>(
        run.input, radix_.orderToInput(), n, cellSize_, 1.0 / cellSize_, radix_.particleRegion());
      NG_CUDA_CHECK_LAUNCH("particlesInOrder");
      table_ = radix_.table();
      return;
    }
    // The table's slots come from the offsets kernel itself (SlotInsert: one launch and one read
    // of the slots fewer), or from ranked cells where the table would be too large.
    slots_.buildWhile(
      run, layout, cellSize_, countingSortSlotsPerCell(n), [&](const auto& slots) { countAndScan(run, slots); });
    const std::int32_t* start = start_.get();
    Particle* particles = particles_.ensure(std::size_t(n), "particles (cell order)");
    std::int32_t* orderToInput = orderToInput_.ensure(std::size_t(n), "cell order to input order");
    scatterToCells<<<blocksFor(n), 256, 0, run.stream>>>(
      run.input, n, slots_.slotOf(), offsets_.get(), start, cellSize_, 1.0 / cellSize_, particles, orderToInput);
    NG_CUDA_CHECK_LAUNCH("scatterToCells");
    table_ = slots_.table(start);
  }
  double cellSize() const override { return cellSize_; }
  // scatterToCells and particlesInOrder write weights of one (inputParticle).
  bool sortWeighsOne() const override { return true; }
  Particle* particles() override { return wide_ ? radix_.particleRegion() : particles_.get(); }
  const std::int32_t* orderToInput() const override { return wide_ ? radix_.orderToInput() : orderToInput_.get(); }
  QuerySource querySource() override { return cellQuerySource(table_, particles(), orderToInput(), 1); }
  std::int64_t heldBytes() const override
  {
    return slots_.heldBytes() + radix_.heldBytes() +
      std::int64_t(counts_.bytes() + start_.bytes() + offsets_.bytes() + particles_.bytes() + orderToInput_.bytes() +
        scratch_.bytes());
  }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    launchGridSearch(run, table_, particles(), orderToInput(), test_, op);
  }

  /// Each point's offset in its cell and the cells' starts (the exclusive scan of the counts):
  /// small tables in one launch, larger ones with CUB's scan after the count.
  template <class Slots>
  void countAndScan(CudaRun& run, const Slots& slotsOfPoints)
  {
    const int n = static_cast<int>(run.count);
    const int slots = slots_.slots();
    // The counts, their zero end, and (small tables) the count of blocks done: one memset.
    std::int32_t* counts = counts_.ensure(std::size_t(slots) + 2, "cell counts");
    std::int32_t* start = start_.ensure(std::size_t(slots) + 1, "cell starts");
    std::int32_t* offsets = offsets_.ensure(std::size_t(n), "offset of each point in its cell");
    NG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(std::int32_t) * (std::size_t(slots) + 2), run.stream),
      "clearing cell counts");
    if (slots + 1 <= smallTableEntries)
    {
      takeOffsetsAndScan<<<blocksFor(n, offsetsThreads), offsetsThreads, 0, run.stream>>>(slotsOfPoints, n, counts,
        offsets, start, slots + 1, reinterpret_cast<unsigned int*>(counts + slots + 1));
      NG_CUDA_CHECK_LAUNCH("takeOffsetsAndScan");
      return;
    }
    takeOffsets<<<blocksFor(n), 256, 0, run.stream>>>(slotsOfPoints, n, counts, offsets);
    NG_CUDA_CHECK_LAUNCH("takeOffsets");
    exclusiveSum(counts, start, slots + 1, scratch_, run.stream, "scanning cell counts");
  }

  SlotCells slots_;
  RadixCells radix_;
  DeviceBuffer<std::int32_t> counts_;
  DeviceBuffer<std::int32_t> start_;
  DeviceBuffer<std::int32_t> offsets_;
  DeviceBuffer<Particle> particles_;
  DeviceBuffer<std::int32_t> orderToInput_;
  DeviceBuffer<unsigned char> scratch_;
  CellTable table_;
  double cellSize_ = 1.0;
  bool wide_ = false;
  PairTest test_;
};

} // namespace

std::unique_ptr<CudaMethod> makeCountingSort(DevicePool& pool)
{
  return std::make_unique<CountingSort>(pool);
}

} // namespace detail
} // namespace neighborgrid
