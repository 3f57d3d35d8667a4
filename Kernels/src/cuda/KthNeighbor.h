// Smoothing Length on the GPU (../KthNeighbor.h): per level, all points grouped by cells with
// the radix sort (CellTable.h), one thread per query in cell order, its k nearest in a max-heap in
// shared memory. Included only by .cu files.
#pragma once

#include "CellTable.h"

namespace neighborgrid
{
namespace detail
{

class CudaKthNeighbor
{
public:
  explicit CudaKthNeighbor(DevicePool& pool);
  /// Device bytes run() holds for the run's points (bounds known), the output not included.
  static std::int64_t plannedBytes(const Problem& p);
  /// out[i] (device, input order) for the first `queries` points of the run: the distance to the
  /// k-th nearest other point of the run, exact. Needs run.count > k. Returns the levels searched.
  int run(CudaRun& run, std::int64_t queries, int k, float* out);
  std::int64_t heldBytes() const;

private:
  /// Sorts the run's points by the Morton keys of their finest cells (KthNeighbor.cu, KthMorton).
  void buildMortonOrder(CudaRun& run, double finest, const double origin[3]);

  RadixCells cells_;
  DeviceBuffer<std::int32_t> baseOrder_;
  DeviceBuffer<unsigned char> levels_;
  DeviceBuffer<int> counters_;
  DeviceBuffer<int> selected_;
  DeviceBuffer<unsigned char> scratch_;
  DeviceBuffer<std::uint64_t> mortonKeys_; // two buffers of n keys for the sort
  DeviceBuffer<std::int32_t> mortonOrder_; // two buffers of n positions
  DeviceBuffer<unsigned char> inOrder_;     // the input coordinates in the level's order
  const std::uint64_t* sortedKeys_ = nullptr;
  const std::int32_t* sortedOrder_ = nullptr;
  PinnedBuffer<int> countersHost_;
};

} // namespace detail
} // namespace neighborgrid
