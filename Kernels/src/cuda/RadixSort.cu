// Radix Sort (Green 2008/2012, the CUDA particles sample): (cell key, index) pairs sorted with
// CUB's radix sort, cells found where the sorted key changes, the points gathered in cell order,
// and one thread per point searching the 27 cells around its own (GridSearch.cuh).
// Cells of size R are keyed by their coordinates (CellGrid.h): 32-bit keys where the bounds span
// at most 2^31 cells, so the sort runs over only the bits the keys use.
// Memory: 20 bytes per point (the particles, which take the place of the keys once they are
// sorted, and the order), plus the cell starts and the lookup table.
#include "GridSearch.cuh"

namespace neighborgrid
{
namespace detail
{
namespace
{

class RadixSort final : public CudaMethod
{
public:
  explicit RadixSort(DevicePool& pool) : cells_(pool) {}
  Method id() const override { return Method::RadixSort; }

  std::int64_t plannedBytes(const CudaRun& run) const override
  {
    const Problem& p = *run.problem;
    const double size = baselineCellSize(p.radius);
    return RadixCells::plannedBytes(run.count, makeKeyLayout(p.lo, p.hi, size), false);
  }

  void sort(CudaRun& run) override
  {
    const Problem& p = *run.problem;
    cellSize_ = baselineCellSize(p.radius);
    // The gather of the particles runs while the host waits for the count of cells.
    cells_.build(run, makeKeyLayout(p.lo, p.hi, cellSize_), cellSize_, false, 0, [&]() {
      particlesInOrder<<<blocksFor(run.count), 256, 0, run.stream>>>(run.input, cells_.orderToInput(),
        static_cast<int>(run.count), cellSize_, 1.0 / cellSize_, cells_.particleRegion());
      NG_CUDA_CHECK_LAUNCH("particlesInOrder");
    });
    test_ = makePairTest(p.radius, cellSize_, 2.0, run.input);
  }
  double cellSize() const override { return cellSize_; }
  bool sortWeighsOne() const override { return true; }
  Particle* particles() override { return cells_.particleRegion(); }
  const std::int32_t* orderToInput() const override { return cells_.orderToInput(); }
  QuerySource querySource() override { return cellQuerySource(cells_.table(), particles(), orderToInput(), 1); }
  std::int64_t heldBytes() const override { return cells_.heldBytes(); }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    launchGridSearch(run, cells_.table(), cells_.particleRegion(), cells_.orderToInput(), test_, op);
  }

  RadixCells cells_;
  double cellSize_ = 1.0;
  PairTest test_;
};

} // namespace

std::unique_ptr<CudaMethod> makeRadixSort(DevicePool& pool)
{
  return std::make_unique<RadixSort>(pool);
}

} // namespace detail
} // namespace neighborgrid
