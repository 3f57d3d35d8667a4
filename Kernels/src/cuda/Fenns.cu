// FENNS (Groß, Köster, Krüger 2019) and CLAWS (2020): the coarse grid, the two-part sort and the
// launch of the search (kernels in Fenns.cuh).
//
// What stays from the papers: a coarse grid in global memory whose cells are a whole number of
// fine cells wide; sort part 1 counts points per coarse cell, in shared memory where the counters
// fit; a prefix sum; sort part 2 splits every cell into a border and an inner section (FENNS:
// border from the left, inner from the right; CLAWS: inner sections of all cells, then border
// sections); one block per coarse cell with a fine grid in shared memory.
// What changes: the coarse cells are keyed by their coordinates and only occupied ones hold a slot
// (a far outlier adds one cell instead of stretching the grid), so sort part 1 starts with each
// point inserting its cell's key into the table of occupied cells; blocks run over occupied cells
// only; points are stored relative to their coarse cell and decided exactly (PairTest.h).
#include "Fenns.cuh"

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

namespace neighborgrid
{
namespace detail
{
namespace
{

class Fenns final : public CudaMethod
{
public:
  Fenns(DevicePool& pool, bool claws)
    : claws_(claws), slots_(pool), counts_(pool), innerStart_(pool), borderCount_(pool), occupied_(pool),
      items_(pool), particles_(pool), orderToInput_(pool), scratch_(pool)
  {
    // Benchmarking knob: average points per coarse cell.
    if (const char* target = std::getenv("NEIGHBORGRID_FENNS_TARGET"))
    {
      targetPerCell_ = std::max(1, std::atoi(target));
    }
    // Benchmarking knob: fine cells per point of a chunk (0: as fine as R and 12 per axis allow).
    const char* perPoint = std::getenv("NEIGHBORGRID_FENNS_FINE_PER_POINT");
    if (perPoint && *perPoint)
    {
      fineCellsPerPoint_ = std::max(0.0, std::atof(perPoint));
    }
    // Benchmarking knob: the widest first guess of a coarse cell, in cells of size R.
    if (const char* widest = std::getenv("NEIGHBORGRID_FENNS_WIDEST"))
    {
      widestCoarse_ = std::max(1.0, std::atof(widest));
    }
    // Benchmarking knob: the paper's lookup direction (scatter with shared-memory atomics).
    if (const char* variant = std::getenv("NEIGHBORGRID_FENNS_VARIANT"))
    {
      scatter_ = !claws_ && std::string(variant) == "scatter";
    }
  }
  Method id() const override { return claws_ ? Method::CLAWS : Method::FENNS; }

  std::int64_t plannedBytes(const CudaRun& run) const override
  {
    const Problem& p = *run.problem;
    const std::int64_t n = run.count;
    const double size = coarseSize(p, n);
    const KeyLayout layout = makeKeyLayout(p.lo, p.hi, size);
    const std::int64_t slots = 2 * cellCapacity(n, layout) + 2;
    const std::int64_t sections = claws_ ? 2 * slots : slots;
    const std::int64_t chunkItems = 8 * (slots + n / fennsChunk + 1);
    const std::int64_t countsAndTallies = 4 * (sections + 2) + std::int64_t(sizeof(SortTallies));
    return SlotCells::plannedBytes(n, layout) + countsAndTallies + 4 * 3 * (slots + 1) + chunkItems + 20 * n +
      (std::int64_t(8) << 20);
  }

  void sort(CudaRun& run) override
  {
    const Problem& p = *run.problem;
    const int n = static_cast<int>(run.count);
    flags_ = claws_ ? clawsFlags() : SearchFlags{};
    // The coarse cells: sized from the bounds' average density, then corrected by the points per
    // occupied cell actually found, as a point sees it (a far outlier makes the bounds' average
    // useless, and in dense clusters inside sparse space the plain mean over occupied cells is
    // the sparse cells' own: the clusters' cells then held hundreds of chunks).
    const double fine = cellSizeFor(p.radius, 1);
    double k = coarseSize(p, n) / fine;
    for (int attempt = 0;; ++attempt)
    {
      coarse_.size = k * fine;
      coarse_.inverse = 1.0 / coarse_.size;
      // The count inserts each point's cell into the table itself (SlotInsert: one launch and
      // one read of the slots fewer), but where the cells are ranked (SlotCells::ranksCells).
      const KeyLayout layout = makeKeyLayout(p.lo, p.hi, coarse_.size);
      slots_.buildWhile(run, layout, coarse_.size, 2, [&](const auto& slots) {
        requireThirtyTwoBitSections(slots_.slots(), n);
        countSections(run, n, slots);
      });
      // The rest of the sort is queued before the host waits for the population: the GPU sorts
      // while the host decides (the wait left it idle in every sort; on clouds of up to 65,536
      // points the sort is mostly such latencies). A rejected attempt costs one reorder.
      orderByCells(run, n);
      const double perCell = populationOfCells(n);
      if (attempt == 3 || k <= 1.0 || perCell <= 2.0 * targetPerCell_)
      {
        // The border is R's alone (the reorder used it); the fine cells follow the points found.
        grid_ = planFineGrid(p.radius / coarse_.size, run.device->sharedMemoryPerBlock, perCell, fineCellsPerPoint_);
        break;
      }
      k = std::max(1.0, std::floor(k * std::cbrt(double(targetPerCell_) / perCell)));
    }
    test_ = makePairTest(p.radius, coarse_.size, 2.0, run.input);
  }

  double cellSize() const override { return coarse_.size; }
  // Every reorder (fennsReorder, clawsReorder, tiledReorder) writes weights of one (inputParticle).
  bool sortWeighsOne() const override { return true; }
  Particle* particles() override { return particles_.get(); }
  const std::int32_t* orderToInput() const override { return orderToInput_.get(); }
  /// Separate queries read the coarse cells through their slots (FENNS: one range per cell;
  /// CLAWS: the inner and the border section), 27 around the query's own: the staging in
  /// shared memory is for blocks whose own points are the particles of a cell.
  QuerySource querySource() override
  {
    QuerySource q = cellQuerySource(slots_.table(layout_.start), particles_.get(), orderToInput_.get(), 1);
    q.secondStart = layout_.claws ? layout_.start + layout_.slots : nullptr;
    return q;
  }
  std::int64_t heldBytes() const override
  {
    return slots_.heldBytes() +
      std::int64_t(counts_.bytes() + innerStart_.bytes() + borderCount_.bytes() + occupied_.bytes() + items_.bytes() +
        particles_.bytes() + orderToInput_.bytes() + scratch_.bytes());
  }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    if (layout_.slots == 0)
    {
      return;
    }
    FennsSearchParams params;
    params.g = grid_;
    params.table = slots_.table(nullptr);
    params.layout = layout_;
    params.occupied = occupied_.get();
    params.items = items_.get();
    params.listed = tallies()->listed;
    params.test = test_;
    params.decided = run.decided;
    if (scatter_)
    {
      const std::size_t bytes = fennsScatterSharedBytes<Op>(grid_.fineCells);
      allowDynamicSharedMemory(fennsSearchScatter<Op>, run.device->id, bytes, "raising the FENNS search's shared-memory limit");
      fennsSearchScatter<<<layout_.slots, fennsScatterBlockSize, bytes, run.stream>>>(
        params, particles_.get(), orderToInput_.get(), op);
      return;
    }
    const std::size_t bytes = fennsSharedBytes<Op>(grid_.fineCells);
    allowDynamicSharedMemory(fennsSearch<Op>, run.device->id, bytes, "raising the FENNS search's shared-memory limit");
    // One block a listed chunk: their number came back with the sum of squares (empty slots of
    // the table, which a far point or a dense cluster makes as many as the points, get none).
    fennsSearch<<<std::max(1, searchBlocks_), fennsThreads, bytes, run.stream>>>(params, particles_.get(), orderToInput_.get(), op, flags_);
  }

  /// The most chunks a sort can list (the work items' buffer): every slot's first chunk and every
  /// further one. requireThirtyTwoBitSections keeps it in an int.
  int chunkBound(int n) const { return slots_.slots() + n / fennsChunk + 1; }

  /// The section starts (CLAWS: two a slot) and the search's blocks (a slot and a chunk each)
  /// are 32-bit ints: a clear error where a cloud has more occupied coarse cells than that
  /// (about a billion isolated points; Counting Sort and Radix Sort rank such cells).
  void requireThirtyTwoBitSections(std::int64_t slots, std::int64_t n) const
  {
    const std::int64_t sections = flags_.clawsLayout ? 2 * slots : slots;
    const std::int64_t blocks = slots + n / fennsChunk + 1; // chunkBound's, in 64 bits
    if (std::max(sections, blocks) >= std::int64_t(std::numeric_limits<std::int32_t>::max()))
    {
      throw Error(std::string("NeighborGrid: ") + (claws_ ? "CLAWS" : "FENNS") + ": " + std::to_string(n) +
        " points fill " + std::to_string(slots) + " coarse cells, more than its 32-bit cell starts can index; " +
        "choose Counting Sort or Radix Sort for this cloud");
    }
  }

  /// CLAWS sorts into two sections a slot (inner and border), FENNS into one.
  int sections() const { return flags_.clawsLayout ? 2 * slots_.slots() : slots_.slots(); }

  /// The sort's tallies lie after the section counts (and their end) in one buffer, 8-byte
  /// aligned: one memset clears both.
  static std::size_t talliesOffset(int sections) { return std::size_t((sections + 2) & ~1); }
  SortTallies* tallies() const { return reinterpret_cast<SortTallies*>(counts_.get() + talliesOffset(sections())); }

  /// Part 1 (the paper's Algorithm 1) on the coarse cells of this attempt: points per slot, or
  /// per inner and border section (CLAWS), in shared memory where the counters fit (the paper's
  /// case: few coarse cells). Then the points per occupied coarse cell as a point sees it, read
  /// back without a wait (populationOfCells waits): the sum over cells of their points squared.
  /// The counts of the attempt that is kept are the sort's: no second count.
  template <class Slots>
  void countSections(CudaRun& run, int n, const Slots& cellOf)
  {
    const int slots = slots_.slots();
    const int sections = this->sections();
    // Only the border matters to the count, and it is R's alone: the fine cells come later.
    grid_ = planFineGrid(run.problem->radius / coarse_.size, run.device->sharedMemoryPerBlock, 1.0, fineCellsPerPoint_);
    const std::size_t countAndTallyInts = talliesOffset(sections) + sizeof(SortTallies) / sizeof(int);
    int* counts = counts_.ensure(countAndTallyInts, "coarse cell counts and starts");
    SortTallies* tallies = this->tallies();
    const std::size_t counterBytes = sizeof(int) * std::size_t(sections);
    const bool useShared = counterBytes + 2048 <= static_cast<std::size_t>(run.device->sharedMemoryPerBlock);
    const std::size_t sharedBytes = useShared ? counterBytes : 0;
    NG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int) * countAndTallyInts, run.stream),
      "clearing coarse counts");
    // A grid-stride loop with as many resident blocks as fit: each block flushes its shared
    // counters once, so fewer, fuller blocks mean fewer global atomics. Where the sections fit
    // one block, the block that counts last also makes the section starts' scans, the sum of
    // squares and the lists (orderByCells then has no scan to make).
    scannedWithSquares_ = sections + 1 <= smallSortEntries;
    if (scannedWithSquares_)
    {
      SmallSortScan scan;
      scan.entries = sections + 1;
      scan.chunk = fennsChunk;
      scan.exclusive =
        flags_.clawsLayout ? nullptr : innerStart_.ensure(std::size_t(slots) + 1, "coarse cell inner starts");
      scan.tallies = tallies;
      scan.occupied = occupiedCells();
      scan.items = chunkItems(n);
      scan.hostTallies = mappedTallies();
      allowDynamicSharedMemory(
        countAndScanSmallSort<Slots>, run.device->id, sharedBytes, "raising the coarse count's shared-memory limit");
      const int blocks = countBlocks(run, n, countAndScanSmallSort<Slots>, sharedBytes);
      countAndScanSmallSort<<<blocks, smallSortThreads, sharedBytes, run.stream>>>(
        run.input, n, coarse_, grid_, cellOf, slots, flags_.clawsLayout, useShared, counts, scan);
      NG_CUDA_CHECK_LAUNCH("coarse count and scan");
    }
    else
    {
      allowDynamicSharedMemory(fennsCount<Slots>, run.device->id, sharedBytes, "raising the coarse count's shared-memory limit");
      const int blocks = countBlocks(run, n, fennsCount<Slots>, sharedBytes);
      fennsCount<<<blocks, 1024, sharedBytes, run.stream>>>(
        run.input, n, coarse_, grid_, cellOf, slots, flags_.clawsLayout, useShared, counts);
      NG_CUDA_CHECK_LAUNCH("coarse count");
      sumOfSquares<<<std::min(blocksFor(slots), 32 * run.device->multiprocessors), 256, 0, run.stream>>>(
        counts, flags_.clawsLayout ? counts + slots : nullptr, slots, fennsChunk, tallies);
      NG_CUDA_CHECK_LAUNCH("sumOfSquares");
    }
    if (!scannedWithSquares_)
    {
      auto* host = talliesHost_.ensure(2, "sum of squared cell counts and chunks (pinned host memory)");
      NG_CUDA_CHECK(cudaMemcpyAsync(host, tallies, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, run.stream),
        "reading the sum of squared cell counts and the chunks");
    }
    populationRead_.record(run.stream);
  }

  /// talliesHost_ as the device writes it: the small sort's last block stores the two tallies
  /// there itself, one copy in the stream fewer (kernel writes to mapped pinned memory are
  /// visible to the host once the event after the kernel has completed).
  unsigned long long* mappedTallies()
  {
    unsigned long long* host = talliesHost_.ensure(2, "sum of squared cell counts and chunks (pinned host memory)");
    if (host != mappedHost_)
    {
      NG_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mappedDevice_), host, 0),
        "mapping the sort's tallies");
      mappedHost_ = host;
    }
    return mappedDevice_;
  }

  /// The coarse count's blocks for n points: as many as are resident at once, at most one per
  /// 1,024 points. Resident blocks are asked of the driver once a kernel and shared-memory size
  /// (a host call that clouds of a few thousand points would feel at every attempt).
  template <class Kernel>
  int countBlocks(const CudaRun& run, int n, Kernel* kernel, std::size_t sharedBytes)
  {
    const void* key = reinterpret_cast<const void*>(kernel);
    if (key != countOccupancy_.kernel || sharedBytes != countOccupancy_.sharedBytes || countOccupancy_.perSm == 0)
    {
      int perSm = 0;
      NG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, 1024, sharedBytes),
        "coarse count occupancy");
      countOccupancy_ = { key, sharedBytes, std::max(1, perSm) };
    }
    return std::max(1, std::min(blocksFor(n) / 4 + 1, countOccupancy_.perSm * run.device->multiprocessors));
  }

  /// Waits for countSections' read back (not for the rest of the sort queued behind it), keeps
  /// the attempt's chunks as the search's blocks, and returns the points of the coarse cell an
  /// average point lies in (the mean for even data).
  double populationOfCells(int n)
  {
    populationRead_.wait("sizing the coarse cells");
    searchBlocks_ = static_cast<int>(talliesHost_.get()[1]); // at most chunkBound: an int
    return double(talliesHost_.get()[0]) / double(std::max(1, n));
  }

  /// Parts 2 and 3 of the sort: section starts by scans, the points reordered into cells, and the
  /// list of occupied cells and chunks the search's blocks take (left on the device). For small
  /// clouds countSections' last block already made the scans and the lists.
  void orderByCells(CudaRun& run, int n)
  {
    const int slots = slots_.slots();
    const int sections = this->sections();
    int* counts = counts_.get();
    int* innerStart = innerStart_.ensure(std::size_t(slots) + 1, "coarse cell inner starts");
    particles_.ensure(std::size_t(n), "particles (cell order)");
    orderToInput_.ensure(std::size_t(n), "cell order to input order");

    std::size_t exclusiveBytes = 0, inclusiveBytes = 0;
    void* scratch = nullptr;
    if (!scannedWithSquares_)
    {
      NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, exclusiveBytes, counts, innerStart, slots + 1, run.stream),
        "sizing the coarse scan");
      NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, inclusiveBytes, counts, counts, sections + 1, run.stream),
        "sizing the coarse scan");
      scratch = scratch_.ensure(std::max(exclusiveBytes, inclusiveBytes), "scan scratch");
    }
    const int reorderBlocks = std::min(blocksFor(n), 32 * run.device->multiprocessors);
    // Few sections (small clouds, or any cloud in few coarse cells): a tile takes its share of a
    // section with one atomic, since a point's own would meet hundreds at the section's end.
    const bool fewSections = 2 * std::int64_t(slots) <= tiledReorderMostSections;
    if (flags_.clawsLayout)
    {
      // CLAWS: one inclusive scan gives every section's end; points fill sections from the end.
      if (!scannedWithSquares_)
      {
        NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch, inclusiveBytes, counts, counts, sections + 1, run.stream),
          "inclusive scan of section counts");
      }
      if (fewSections)
      {
        launchTiledReorder(run, n, counts, nullptr, nullptr);
      }
      else
      {
        clawsReorder<<<reorderBlocks, 256, 0, run.stream>>>(
          run.input, n, coarse_, grid_, slots_.slotOf(), slots, counts, particles_.get(), orderToInput_.get());
        NG_CUDA_CHECK_LAUNCH("clawsReorder");
      }
      layout_ = CellLayout{ counts, nullptr, slots, true };
    }
    else
    {
      // FENNS: exclusive sums (border sections fill from each cell's start) and inclusive sums
      // (inner sections fill from each cell's end), as in the paper.
      if (!scannedWithSquares_)
      {
        NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch, exclusiveBytes, counts, innerStart, slots + 1, run.stream),
          "exclusive scan of coarse counts");
        NG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch, inclusiveBytes, counts, counts, slots + 1, run.stream),
          "inclusive scan of coarse counts");
      }
      int* borderCount = borderCount_.ensure(std::size_t(slots), "coarse cell border counts");
      NG_CUDA_CHECK(cudaMemsetAsync(borderCount, 0, sizeof(int) * std::size_t(slots), run.stream),
        "clearing border counts");
      if (fewSections)
      {
        launchTiledReorder(run, n, counts, innerStart, borderCount);
      }
      else
      {
        fennsReorder<<<reorderBlocks, 256, 0, run.stream>>>(
          run.input, n, coarse_, grid_, slots_.slotOf(), counts, innerStart, borderCount, particles_.get(),
          orderToInput_.get());
        NG_CUDA_CHECK_LAUNCH("fennsReorder");
      }
      fennsCellStarts<<<blocksFor(slots), 256, 0, run.stream>>>(slots, borderCount, counts);
      NG_CUDA_CHECK_LAUNCH("fennsCellStarts");
      layout_ = CellLayout{ counts, innerStart, slots, false };
    }
    // One search block per chunk of an occupied cell (one per slot in the scatter variant, whose
    // empty slots return at once). The lists stay on the device (countAndScanSmallSort made them
    // where the sections fit it); the number of chunks came back with the sum of squares, so the
    // search launches no block for an empty slot.
    if (!scannedWithSquares_)
    {
      listOccupied<<<blocksFor(slots), 256, 0, run.stream>>>(
        layout_, fennsChunk, occupiedCells(), chunkItems(n), tallies()->listed);
      NG_CUDA_CHECK_LAUNCH("listOccupied");
    }
  }

  /// listOccupied's lists: the occupied slots, and one item a chunk of a cell.
  int* occupiedCells() { return occupied_.ensure(std::size_t(slots_.slots()), "occupied coarse cells"); }
  int2* chunkItems(int n) { return items_.ensure(std::size_t(chunkBound(n)), "coarse cell chunks"); }

  /// tiledReorder (Fenns.cuh): CLAWS gives no borderEnd (every section fills from its end).
  void launchTiledReorder(CudaRun& run, int n, int* innerEnd, int* borderEnd, int* borderCount)
  {
    const int slots = slots_.slots();
    const std::size_t sharedBytes = sizeof(int) * 2 * std::size_t(slots);
    tiledReorder<<<blocksFor(n, tiledReorderThreads), tiledReorderThreads, sharedBytes, run.stream>>>(run.input, n,
      coarse_, grid_, slots_.slotOf(), slots, innerEnd, borderEnd, borderCount, particles_.get(), orderToInput_.get());
    NG_CUDA_CHECK_LAUNCH("tiledReorder");
  }

  /// The coarse cell size: k cells of size R, k the largest for which a coarse cell holds at most
  /// targetPerCell_ points on average (a chunk is fennsChunk = 1024: most cells then fit one
  /// chunk). Sparse data get wide coarse cells (k of 40 and more), so a block has work for its
  /// threads; the fine grid then has cells wider than R. This first guess takes the average over
  /// the bounding box; sort() corrects it by the points per occupied coarse cell.
  double coarseSize(const Problem& p, std::int64_t n) const
  {
    const double fine = cellSizeFor(p.radius, 1);
    // Over the bulk of the points: a far outlier's bounds made the first coarse cells hold the
    // whole cloud, and each correction of sort() cost a sort (H200, outlier-1M: CLAWS 3.9-4.0 ms,
    // 1.54-1.59 with the bulk; RESULTS.md, "the bulk of the points").
    const double side = std::cbrt(double(targetPerCell_) * bulkVolume(p, fine) / double(n));
    // At most 256 cells of size R: beyond that the first guess is surely the bounds' fault (a
    // far outlier the bulk's sample missed), and sort() narrows it. Sparse clouds want the wide
    // cells: with at most 64, clouds of 8,192-524,288 points with R of 0.2-0.3 in a box of 180-360 (the papers' tables)
    // had a few points per coarse cell and a search 2-3x slower on the H100.
    const double k = std::max(1.0, std::min(widestCoarse_, std::floor(side / fine)));
    return k * fine;
  }

  /// The fine grid over a coarse cell widened by the border on each side (frame units, rho = R
  /// over the coarse cell size): cells at least R wide plus the rounding of the binning, at most
  /// 12 per axis (beyond, clearing and scanning them per batch costs more than the lookups save),
  /// about four cells per point of a chunk (perCell: points of the coarse cell a point lies in),
  /// and small enough for shared memory.
  ///
  /// Why four cells a point: a block clears and scans every fine cell of every batch (about 2 f^3
  /// steps over its threads) and tests each of its P points against the points of 27 fine cells
  /// (27 P / f^3 each); the sum is least near f^3 = 3.7 P. Sparse clouds have a few points per
  /// coarse cell (the papers' tables of up to 65,536 points: 3-40) and blocks that scanned 1,729
  /// cells for them.
  static FennsGrid planFineGrid(double rho, int sharedMemoryPerBlock, double perCell, double fineCellsPerPoint)
  {
    constexpr double u = 1.0 / 16777216.0;
    FennsGrid g;
    g.border = static_cast<float>(rho * (1.0 + 1.0 / 1024.0) + 16.0 * u);
    g.fineOffset = g.border;
    const double span = 1.0 + 2.0 * double(g.border);
    const double minimumFine = rho * (1.0 + 1.0 / 256.0) + 64.0 * u;
    const double chunkPoints = std::min(perCell, double(fennsChunk));
    const int forPoints = fineCellsPerPoint > 0
      ? std::max(1, static_cast<int>(std::lround(std::cbrt(fineCellsPerPoint * chunkPoints))))
      : 12;
    int f = std::max(1, std::min({ 12, forPoints, static_cast<int>(std::floor(span / minimumFine)) }));
    while (f > 1 &&
      std::max(fennsSharedBytes<SmoothingOperation<4>>(f * f * f), fennsScatterSharedBytes<SmoothingOperation<4>>(f * f * f)) +
          4096 > static_cast<std::size_t>(sharedMemoryPerBlock))
    {
      --f;
    }
    g.fineDim = f;
    g.fineCells = f * f * f;
    g.inverseFineCellSize = static_cast<float>(f / span);
    return g;
  }

  /// CLAWS's ideas, all on unless NEIGHBORGRID_CLAWS_DISABLE names some of them (a comma-separated
  /// list of symmetric, reorder, merged, warps): a benchmarking knob to show what each one buys.
  static SearchFlags clawsFlags()
  {
    SearchFlags flags;
    flags.symmetric = flags.clawsLayout = flags.merged = flags.balancedWarps = true;
    if (const char* disabled = std::getenv("NEIGHBORGRID_CLAWS_DISABLE"))
    {
      const std::string list = std::string(",") + disabled + ",";
      flags.symmetric = list.find(",symmetric,") == std::string::npos;
      flags.clawsLayout = list.find(",reorder,") == std::string::npos;
      flags.merged = list.find(",merged,") == std::string::npos;
      flags.balancedWarps = list.find(",warps,") == std::string::npos;
    }
    return flags;
  }

  bool claws_;
  bool scatter_ = false;
  int targetPerCell_ = fennsChunk * 3 / 5;
  double fineCellsPerPoint_ = 4.0;
  double widestCoarse_ = 256.0;
  SearchFlags flags_;
  CoarseFrame coarse_;
  FennsGrid grid_;
  PairTest test_;
  CellLayout layout_;
  SlotCells slots_;
  DeviceBuffer<int> counts_; // section counts, then starts; then SortTallies
  DeviceBuffer<int> innerStart_;
  DeviceBuffer<int> borderCount_;
  DeviceBuffer<int> occupied_;
  DeviceBuffer<int2> items_;
  PinnedBuffer<unsigned long long> talliesHost_; // SortTallies' squaredCounts and chunks, read back
  unsigned long long* mappedHost_ = nullptr;      // talliesHost_ when mappedDevice_ was asked
  unsigned long long* mappedDevice_ = nullptr;    // its device pointer (mappedTallies)
  StreamMark populationRead_; // the host waits here, not for the whole sort
  struct
  {
    const void* kernel = nullptr;
    std::size_t sharedBytes = 0;
    int perSm = 0;
  } countOccupancy_; // countBlocks: the kernel and shared bytes last asked, their blocks an SM
  bool scannedWithSquares_ = false; // this attempt's section starts came with its sum (countAndScanSmallSort)
  int searchBlocks_ = 0;            // the kept attempt's chunks (populationOfCells)
  DeviceBuffer<Particle> particles_;
  DeviceBuffer<std::int32_t> orderToInput_;
  DeviceBuffer<unsigned char> scratch_;
};

} // namespace

std::unique_ptr<CudaMethod> makeFenns(DevicePool& pool, bool claws)
{
  return std::make_unique<Fenns>(pool, claws);
}

} // namespace detail
} // namespace neighborgrid
