// What a CUDA method sees of a run, what every method provides, and the device functions they
// share: frame coordinates of an input point, and the pair test. Included only by .cu files.
#pragma once

#include "../Backend.h"
#include "../CellGrid.h"
#include "../Operations.h"
#include "../PairTest.h"
#include "CudaSupport.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

namespace neighborgrid
{
namespace detail
{

struct CudaDevice
{
  int id = 0;
  std::string name;
  int multiprocessors = 1;
  int sharedMemoryPerBlock = 48 * 1024; // opt-in maximum
  int sharedMemoryPerSm = 48 * 1024;
  int reservedSharedMemoryPerBlock = 0;  // what the system takes of an SM's for each resident block
};

/// One run of the engine on the device.
struct CudaRun
{
  const Problem* problem = nullptr;
  Report* report = nullptr;
  cudaStream_t stream = nullptr;
  // For work beside the stream's that waits on a point marked in it (StreamMark::holdBack) and
  // that the stream waits on in turn before the method returns.
  cudaStream_t side = nullptr;
  const CudaDevice* device = nullptr;
  std::int64_t count = 0;
  InputPoints input;                      // the caller's coordinates, on the device
  unsigned long long* decided = nullptr;  // device counter of pairs decided in double
  // The operation's output (input order), cleared to zero bits before the search, where the
  // method adds into it (CudaMethod::addsToOutput); null where the method clears it itself.
  void* clearedOutput = nullptr;
};

struct QuerySource; // CellTable.h

/// A CUDA method: its sort leaves the points in its order as Particles (frame coordinates of its
/// cells, weight 1) with the map to input order; its search runs an operation over every point.
class CudaMethod
{
public:
  virtual ~CudaMethod() = default;
  virtual Method id() const = 0;
  /// Device bytes the method will hold for the run beyond inputs and outputs, before anything is
  /// allocated (for the memory check; sizes that depend on the data use their upper bounds).
  virtual std::int64_t plannedBytes(const CudaRun& run) const = 0;
  virtual void sort(CudaRun& run) = 0;
  /// The frame unit: squared distances given to operations are in units of cellSize()^2.
  virtual double cellSize() const = 0;
  virtual Particle* particles() = 0;
  /// Method order to input order; null when the method keeps input order.
  virtual const std::int32_t* orderToInput() const = 0;
  /// Device bytes the method holds now (Report::extraDeviceBytes).
  virtual std::int64_t heldBytes() const = 0;
  /// How separate queries search the particles (valid after sort()).
  virtual QuerySource querySource() = 0;
  /// Whether sort() leaves every particle's weight at 1 (particlesInOrder writes it), so that a
  /// pass with weights of one needs no pass of its own to set them.
  virtual bool sortWeighsOne() const { return false; }
  /// Whether the search may add its results into the operation's output rather than write them,
  /// so that the backend clears it (CudaRun::clearedOutput).
  virtual bool addsToOutput(const Problem&) const { return false; }

  virtual void search(CudaRun& run, const CountOperation& op) = 0;
  virtual void search(CudaRun& run, const DensityOperation& op) = 0;
  virtual void search(CudaRun& run, const SmoothingOperation<1>& op) = 0;
  virtual void search(CudaRun& run, const SmoothingOperation<2>& op) = 0;
  virtual void search(CudaRun& run, const SmoothingOperation<3>& op) = 0;
  virtual void search(CudaRun& run, const SmoothingOperation<4>& op) = 0;
  /// After a search and the stream's synchronization: queues what the search left for a second
  /// launch and returns true, or returns false (Staged Tiles: the chunks of a clump's tile
  /// beyond its block's, where blocks take grid tiles directly).
  virtual bool searchRest(CudaRun&) { return false; }
};

/// Inside a method class: the six search overrides, each calling the template member `launch`.
#define NEIGHBORGRID_SEARCHES_BY(launch)                                                           \
  void search(CudaRun& run, const CountOperation& op) override { launch(run, op); }                \
  void search(CudaRun& run, const DensityOperation& op) override { launch(run, op); }              \
  void search(CudaRun& run, const SmoothingOperation<1>& op) override { launch(run, op); }         \
  void search(CudaRun& run, const SmoothingOperation<2>& op) override { launch(run, op); }         \
  void search(CudaRun& run, const SmoothingOperation<3>& op) override { launch(run, op); }         \
  void search(CudaRun& run, const SmoothingOperation<4>& op) override { launch(run, op); }

/// The cell size of Counting Sort and Radix Sort: R, or larger through the benchmarking knob
/// NEIGHBORGRID_BASELINE_CELL_SIZE, to repeat FENNS Table 2, where every method uses FENNS's 18^3
/// grid of the scene.
inline double baselineCellSize(double radius)
{
  double size = cellSizeFor(radius, 1);
  if (const char* knob = std::getenv("NEIGHBORGRID_BASELINE_CELL_SIZE"))
  {
    size = std::max(size, std::atof(knob));
  }
  return size;
}

std::unique_ptr<CudaMethod> makeCountingSort(DevicePool& pool);
std::unique_ptr<CudaMethod> makeRadixSort(DevicePool& pool);
std::unique_ptr<CudaMethod> makeBruteForce(DevicePool& pool);
std::unique_ptr<CudaMethod> makeFenns(DevicePool& pool, bool claws);
std::unique_ptr<CudaMethod> makeBayraktar(DevicePool& pool);
std::unique_ptr<CudaMethod> makeStagedTiles(DevicePool& pool);

// --- Device functions shared by the methods ------------------------------------------------------
#if defined(__CUDACC__)

/// The cell of input point i (cells of `size`), exactly as CellGrid.h defines it.
__device__ __forceinline__ void inputCell(const InputPoints& input, std::int64_t i, double size, double c[3])
{
  double x[3];
  input.get(i, x[0], x[1], x[2]);
  for (int a = 0; a < 3; ++a)
  {
    c[a] = cellCoordinate(x[a], size);
  }
}

/// The same, given inverse = 1.0 / size: a multiply a coordinate instead of a division.
__device__ __forceinline__ void inputCell(const InputPoints& input, std::int64_t i, double size, double inverse,
  double c[3])
{
  double x[3];
  input.get(i, x[0], x[1], x[2]);
  for (int a = 0; a < 3; ++a)
  {
    c[a] = cellCoordinate(x[a], size, inverse);
  }
}

/// Input point i in frame coordinates of its own cell, weight 1.
__device__ __forceinline__ Particle inputParticle(const InputPoints& input, std::int64_t i, double size, double inverse)
{
  double x[3];
  input.get(i, x[0], x[1], x[2]);
  float f[3];
  for (int a = 0; a < 3; ++a)
  {
    f[a] = frameCoordinate(x[a], cellCoordinate(x[a], size, inverse), size, inverse);
  }
  return Particle{ f[0], f[1], f[2], 1.0f };
}

/// p moved by an integer cell offset: its coordinates in the frame of the cell at that offset.
__device__ __forceinline__ Particle shifted(const Particle& p, float dx, float dy, float dz)
{
  return Particle{ __fsub_rn(p.x, dx), __fsub_rn(p.y, dy), __fsub_rn(p.z, dz), p.w };
}

/// The pair test of PairTest.h for points at method positions si, sj (input indices through
/// orderToInput, or the positions themselves when it is null): true when j is a neighbor of i;
/// r2 becomes the exact squared distance in frame units when decided in double.
__device__ __forceinline__ bool isNeighbor(const PairTest& test, float& r2, int si, int sj,
  const std::int32_t* __restrict__ orderToInput, unsigned& decided)
{
  const int verdict = test.classify(r2);
  if (verdict >= 0)
  {
    return verdict > 0;
  }
  ++decided;
  const std::int64_t i = orderToInput ? orderToInput[si] : si;
  const std::int64_t j = orderToInput ? orderToInput[sj] : sj;
  return test.exact(i, j, r2);
}

/// The last-block pattern: true in the one block of the grid that finishes after all others, once
/// every block's global writes before the call are visible to it (each fences, then counts itself
/// done in doneBlocks, zero on entry). Call from every thread of every block.
__device__ __forceinline__ bool finishedLastOfGrid(unsigned int* doneBlocks)
{
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
  {
    last = atomicAdd(doneBlocks, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last)
  {
    __threadfence();
  }
  return last;
}

/// Adds a thread's count of double decisions to the run's counter: the lanes that call it
/// together add their sum with one atomic. Where most points decide pairs in double (a lattice
/// with R on a neighbor shell), one atomic add a point to the one counter serialized the search:
/// a 4M count whose points mostly decided pairs took 3.08 ms against 2.07 with the warp's sum
/// (H200; RESULTS.md, issue 22).
__device__ __forceinline__ void addDecided(unsigned long long* counter, unsigned decided)
{
  const unsigned together = __activemask();
  if (__ballot_sync(together, decided != 0) == 0)
  {
    return;
  }
  if (__ballot_sync(together, decided >= (1u << 26)) != 0)
  {
    // A sum of 32 such counts could pass 2^32: each lane adds its own.
    if (decided)
    {
      atomicAdd(counter, static_cast<unsigned long long>(decided));
    }
    return;
  }
  const unsigned sum = __reduce_add_sync(together, decided);
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  if (lane == unsigned(__ffs(together) - 1))
  {
    atomicAdd(counter, static_cast<unsigned long long>(sum));
  }
}

#endif

} // namespace detail
} // namespace neighborgrid
