// Brute Force: every pair, in double from the input coordinates (the definition of a neighbor
// itself, PairTest.h), tiles of points staged in shared memory. For validation.
#include "CellTable.h"

namespace neighborgrid
{
namespace detail
{
namespace
{

constexpr int bruteForceThreads = 256;

__global__ void inputOrderParticles(int n, Particle* __restrict__ particles)
{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
  {
    particles[i] = Particle{ 0.0f, 0.0f, 0.0f, 1.0f };
  }
}

template <class Op>
__global__ void __launch_bounds__(bruteForceThreads) bruteForceSearch(InputPoints input,
  const Particle* __restrict__ particles, int n, double radiusSquared, double frameScale, Op op)
{
  __shared__ double tile[3 * bruteForceThreads];
  __shared__ Particle tileParticles[bruteForceThreads];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = i < n;
  double xi[3] = { 0, 0, 0 };
  if (active)
  {
    input.get(i, xi[0], xi[1], xi[2]);
  }
  RegisterSums<Op> acc;
  for (int base = 0; base < n; base += bruteForceThreads)
  {
    const int j = base + threadIdx.x;
    if (j < n)
    {
      input.get(j, tile[3 * threadIdx.x], tile[3 * threadIdx.x + 1], tile[3 * threadIdx.x + 2]);
      tileParticles[threadIdx.x] = particles[j];
    }
    __syncthreads();
    const int tileSize = min(bruteForceThreads, n - base);
    if (active)
    {
      for (int k = 0; k < tileSize; ++k)
      {
        const double r2 = exactSquaredDistance(xi[0], xi[1], xi[2], tile[3 * k], tile[3 * k + 1], tile[3 * k + 2]);
        if (r2 <= radiusSquared)
        {
          acc.add(op, base + k, tileParticles[k], static_cast<float>(r2 * frameScale));
        }
      }
    }
    __syncthreads();
  }
  if (active)
  {
    acc.finish(op, i, i);
  }
}

class BruteForce final : public CudaMethod
{
public:
  explicit BruteForce(DevicePool& pool) : particles_(pool) {}
  Method id() const override { return Method::BruteForce; }
  std::int64_t plannedBytes(const CudaRun& run) const override { return 16 * run.count; }
  void sort(CudaRun& run) override
  {
    cellSize_ = cellSizeFor(run.problem->radius, 1);
    Particle* particles = particles_.ensure(std::size_t(run.count), "particles");
    inputOrderParticles<<<blocksFor(run.count), 256, 0, run.stream>>>(static_cast<int>(run.count), particles);
    NG_CUDA_CHECK_LAUNCH("inputOrderParticles");
  }
  double cellSize() const override { return cellSize_; }
  Particle* particles() override { return particles_.get(); }
  const std::int32_t* orderToInput() const override { return nullptr; }
  QuerySource querySource() override
  {
    QuerySource q;
    q.particles = particles_.get();
    q.bruteForce = true;
    return q;
  }
  std::int64_t heldBytes() const override { return std::int64_t(particles_.bytes()); }

  NEIGHBORGRID_SEARCHES_BY(launch)

private:
  template <class Op>
  void launch(CudaRun& run, const Op& op)
  {
    const double radius = run.problem->radius;
    bruteForceSearch<<<blocksFor(run.count, bruteForceThreads), bruteForceThreads, 0, run.stream>>>(
      run.input, particles_.get(), static_cast<int>(run.count), radius * radius, 1.0 / (cellSize_ * cellSize_), op);
  }

  DeviceBuffer<Particle> particles_;
  double cellSize_ = 1.0;
};

} // namespace

std::unique_ptr<CudaMethod> makeBruteForce(DevicePool& pool)
{
  return std::make_unique<BruteForce>(pool);
}

} // namespace detail
} // namespace neighborgrid
