// The composition matrix of the engine's layers (issue 23): {fixed R, radii Gather / Scatter /
// Symmetric} x {open, periodic box} x {one run, slabs} x {count, density, Shepard and SPH smoothing,
// gradient} x {particles, probe points, a query grid}, where the operation applies, each against
// the double brute force over the particles and their periodic images (RadiiReference on the
// unrolled box). The MPI part of the matrix (2-4 ranks, with and without ghost points) is the
// filters': Testing/Plugin/TestPointNeighborhoodMPI.py.
#include "RadiiReference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace neighborgrid;
using ngtest::backendUnderTest;
using ngtest::Cloud;
using ngtest::RadiiReference;
using ngtest::UnrolledBox;

namespace
{

enum class Radii
{
  Fixed,
  Gather,
  Scatter,
  Symmetric
};

struct Cell
{
  Radii radii;
  bool periodic;
  bool slabs;
};

std::string cellName(const testing::TestParamInfo<Cell>& info)
{
  const char* radii[] = { "FixedR", "Gather", "Scatter", "Symmetric" };
  return std::string(radii[static_cast<int>(info.param.radii)]) + (info.param.periodic ? "_Periodic" : "_Open") +
    (info.param.slabs ? "_Slabs" : "_OneRun");
}

std::vector<Cell> everyCell()
{
  std::vector<Cell> cells;
  for (Radii radii : { Radii::Fixed, Radii::Gather, Radii::Scatter, Radii::Symmetric })
  {
    for (bool periodic : { false, true })
    {
      for (bool slabs : { false, true })
      {
        cells.push_back({ radii, periodic, slabs });
      }
    }
  }
  return cells;
}

constexpr double boxLength = 10.0;
constexpr double fixedRadius = 1.2;
constexpr Kernel kernel = Kernel::CubicSpline;

/// One cell of the matrix: the particles (clusters, one across the faces, and a background), the
/// request every run starts from, and the brute force for particles or other queries.
class Composition
{
public:
  explicit Composition(const Cell& cell)
    : cell_(cell), box_(ngtest::unrolledBox(900, boxLength, 4100 + static_cast<int>(cell.radii), 0.12))
  {
    const std::int64_t n = particles().size();
    if (cell.radii == Radii::Fixed)
    {
      box_.radii.assign(static_cast<std::size_t>(n), static_cast<float>(fixedRadius));
      box_.unrolledRadii.assign(box_.unrolled.size(), static_cast<float>(fixedRadius));
    }
  }

  const Cloud& particles() const { return box_.particles; }
  std::int64_t count() const { return particles().size(); }
  /// The pair rule of the reference: a fixed R is Gather (and Scatter) with every radius R.
  SmoothingLengthMode mode() const
  {
    return cell_.radii == Radii::Scatter ? SmoothingLengthMode::Scatter
      : cell_.radii == Radii::Symmetric  ? SmoothingLengthMode::Symmetric
                                         : SmoothingLengthMode::Gather;
  }
  bool takesQueries() const { return cell_.radii == Radii::Fixed || cell_.radii == Radii::Scatter; }

  Request request() const
  {
    Request r;
    r.points = particles().points();
    r.backend = backendUnderTest;
    r.kernel = kernel;
    r.mass = particles().mass.data();
    if (cell_.radii == Radii::Fixed)
    {
      r.radius = fixedRadius;
    }
    else
    {
      r.radii = box_.radii.data();
      r.smoothingLengthMode = mode();
    }
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = cell_.periodic;
      r.boxLengths[a] = boxLength;
    }
    return r;
  }

  /// The brute force at the particles (queries null) or at other points, in `mode`.
  RadiiReference reference(const std::vector<double>* queries, SmoothingLengthMode mode) const
  {
    const Cloud& sources = cell_.periodic ? box_.unrolled : box_.particles;
    const std::vector<float>& radii = cell_.periodic ? box_.unrolledRadii : box_.radii;
    return RadiiReference(sources, radii, mode, queries, queries || !cell_.periodic ? -1 : count());
  }

  /// m_j / rho_j of every source of the reference (an image takes its particle's).
  std::vector<double> volumes(const std::vector<double>& particleDensity) const
  {
    const Cloud& sources = cell_.periodic ? box_.unrolled : box_.particles;
    std::vector<double> v(static_cast<std::size_t>(sources.size()));
    for (std::int64_t j = 0; j < sources.size(); ++j)
    {
      const std::int64_t i = cell_.periodic ? box_.original[j] : j;
      v[j] = particles().mass[i] / particleDensity[i];
    }
    return v;
  }

  /// Values of every source of the reference: a particle's, also at its images.
  std::vector<float> sourceValues(const std::vector<float>& values, int components) const
  {
    if (!cell_.periodic)
    {
      return values;
    }
    std::vector<float> out;
    for (std::int64_t i : box_.original)
    {
      out.insert(out.end(), values.begin() + i * components, values.begin() + (i + 1) * components);
    }
    return out;
  }

  /// In the slab cells, a memory limit that cuts runs of `r` into slabs: the CPU search needs
  /// about 100 bytes a point, and 50 a point of one run (the particles and their images) leaves
  /// room for two to four slabs.
  void limitMemory(Engine& engine, const Request& r) const
  {
    if (cell_.slabs)
    {
      Engine whole;
      const Report one = whole.run(r);
      const std::int64_t sources = hasSource(r) ? r.source.count : r.points.count;
      engine.setMemoryLimit(50 * (sources + one.periodicImages));
    }
  }
  static bool hasSource(const Request& r) { return r.source.count > 0; }

  const Cell& cell() const { return cell_; }
  const UnrolledBox& box() const { return box_; }

private:
  Cell cell_;
  UnrolledBox box_;
};

class EngineComposition : public testing::TestWithParam<Cell>
{
protected:
  void SetUp() override
  {
    if (GetParam().slabs && backendUnderTest == Backend::CUDA)
    {
      // The CUDA methods keep 16-32 MB of scratch a run: no limit cuts a run of these few
      // points into slabs. EngineSlabsRadii runs slabs on the GPU against one run instead.
      GTEST_SKIP() << "slabs of a cloud this small run on the CPU backend (EngineSlabsRadii covers CUDA)";
    }
  }
};

/// Smoothing at a query without neighbors: the null value 0 where the reference has 0 / 0 (Shepard)
/// or an empty sum, compared on a unit scale.
void withNullValues(std::vector<double>& values, std::vector<double>& scale)
{
  for (std::size_t k = 0; k < values.size(); ++k)
  {
    if (std::isnan(values[k]) || scale[k] == 0.0)
    {
      values[k] = 0.0;
      scale[k] = 1.0;
    }
  }
}

/// Runs `r` and checks how it ran: slabs in the slab cells, one run in the others.
Report runChecked(Engine& engine, const Request& r, const Cell& cell)
{
  const Report report = engine.run(r);
  if (cell.slabs)
  {
    EXPECT_GE(report.slabs, 2) << "the memory limit did not cut the run into slabs";
  }
  else
  {
    EXPECT_EQ(report.slabs, 1);
  }
  return report;
}

/// Sets the slab cells' memory limit on `engine`, then checks the neighbor count and the density
/// (with the mass array) of `r` against the reference; returns the reference density.
std::vector<double> expectCountAndDensity(
  Engine& engine, Request r, const Composition& setup, const RadiiReference& ref, std::vector<double>& rhoScale)
{
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> count(ref.m, -1);
  r.neighborCount = count.data();
  setup.limitMemory(engine, r);
  runChecked(engine, r, setup.cell());
  EXPECT_EQ(ngtest::asDouble(count), ref.counts());
  r.neighborCount = nullptr;
  const std::vector<double> rho = ref.density(kernel, &rhoScale);
  r.operation = Operation::Density;
  std::vector<float> density(ref.m, -1.0f);
  r.density = density.data();
  runChecked(engine, r, setup.cell());
  ngtest::expectClose(density, rho, "density", &rhoScale);
  return rho;
}

TEST_P(EngineComposition, AtTheParticlesEveryOperationMatchesDoubleBruteForce)
{
  const Composition setup(GetParam());
  const Cloud& c = setup.particles();
  const std::int64_t n = setup.count();
  const RadiiReference ref = setup.reference(nullptr, setup.mode());
  Engine engine;
  Request r = setup.request();
  std::vector<double> rhoScale;
  const std::vector<double> rho = expectCountAndDensity(engine, r, setup, ref, rhoScale);
  std::vector<float> density(n, -1.0f);

  std::vector<double> shepardScale;
  const std::vector<double> shepard =
    ref.smooth(kernel, setup.sourceValues(c.vector3, 3), 3, {}, &shepardScale);
  r.operation = Operation::Smoothing;
  r.normalization = Normalization::Shepard;
  std::vector<float> shepardOut(3 * n, -1.0f);
  r.smoothed = { SmoothedArray{ c.vector3.data(), 3, shepardOut.data(), "vector" } };
  runChecked(engine, r, GetParam());
  ngtest::expectClose(shepardOut, shepard, "Shepard smoothing", &shepardScale);

  const std::vector<double> volumes = setup.volumes(rho);
  const std::vector<float> scalars = setup.sourceValues(c.scalar, 1);
  std::vector<double> sphScale;
  const std::vector<double> sph = ref.smooth(kernel, scalars, 1, volumes, &sphScale);
  r.normalization = Normalization::SPH;
  std::vector<float> sphOut(n, -1.0f);
  r.smoothed = { SmoothedArray{ c.scalar.data(), 1, sphOut.data(), "scalar" } };
  runChecked(engine, r, GetParam());
  ngtest::expectClose(sphOut, sph, "SPH smoothing", &sphScale);

  std::vector<double> gradientScale;
  const std::vector<double> gradient = ref.gradient(kernel, scalars, 1, volumes, &gradientScale);
  r.operation = Operation::Gradient;
  std::vector<float> gradientOut(3 * n, -1.0f);
  std::fill(density.begin(), density.end(), -1.0f);
  r.density = density.data();
  r.smoothed = { SmoothedArray{ c.scalar.data(), 1, gradientOut.data(), "scalar" } };
  runChecked(engine, r, GetParam());
  ngtest::expectClose(gradientOut, gradient, "gradient", &gradientScale);
  ngtest::expectClose(density, rho, "density of the gradient", &rhoScale);
}

/// Probe points and a query grid take the particles' radii (Scatter) or R; SPH weights come from
/// the particles' own density.
TEST_P(EngineComposition, AtProbePointsAndAGridEveryOperationMatchesDoubleBruteForce)
{
  const Composition setup(GetParam());
  if (!setup.takesQueries())
  {
    GTEST_SKIP() << "queries other than the particles have no radius of their own: Scatter or a fixed R only";
  }
  const Cloud& c = setup.particles();
  std::mt19937_64 rng(77);
  // In the box (periodic: where the engine's wrap leaves them), or around it.
  std::uniform_real_distribution<double> position(
    GetParam().periodic ? 0.0 : -0.1 * boxLength, GetParam().periodic ? boxLength : 1.1 * boxLength);
  std::vector<float> probe(3 * 400);
  for (float& x : probe)
  {
    x = std::min(static_cast<float>(position(rng)), std::nextafter(static_cast<float>(boxLength), 0.0f));
  }
  const std::vector<double> probeXyz(probe.begin(), probe.end());
  QueryGrid grid;
  std::vector<double> gridXyz;
  for (int a = 0; a < 3; ++a)
  {
    grid.origin[a] = 0.3;
    grid.spacing[a] = boxLength / 9.0;
    grid.dimensions[a] = 7 + a;
  }
  for (std::int64_t q = 0; q < grid.count(); ++q)
  {
    const std::int64_t ijk[3] = { q % grid.dimensions[0], q / grid.dimensions[0] % grid.dimensions[1],
      q / (grid.dimensions[0] * grid.dimensions[1]) };
    for (int a = 0; a < 3; ++a)
    {
      gridXyz.push_back(grid.origin[a] + double(ijk[a]) * grid.spacing[a]);
    }
  }
  const std::vector<double> particleRho = setup.reference(nullptr, SmoothingLengthMode::Scatter).density(kernel);
  const std::vector<double> volumes = setup.volumes(particleRho);
  for (const bool onGrid : { false, true })
  {
    SCOPED_TRACE(onGrid ? "query grid" : "probe points");
    const RadiiReference ref = setup.reference(onGrid ? &gridXyz : &probeXyz, SmoothingLengthMode::Scatter);
    const std::int64_t m = ref.m;
    Request r = setup.request();
    r.smoothingLengthMode = SmoothingLengthMode::Scatter;
    r.source = c.points();
    r.points = onGrid ? Points() : Points(probe.data(), m);
    if (onGrid)
    {
      r.queryGrid = grid;
    }
    Engine engine;
    std::vector<double> rhoScale;
    expectCountAndDensity(engine, r, setup, ref, rhoScale);

    std::vector<double> shepardScale, sphScale;
    std::vector<double> shepard = ref.smooth(kernel, setup.sourceValues(c.vector3, 3), 3, {}, &shepardScale);
    withNullValues(shepard, shepardScale);
    std::vector<double> sph = ref.smooth(kernel, setup.sourceValues(c.scalar, 1), 1, volumes, &sphScale);
    withNullValues(sph, sphScale);
    r.operation = Operation::Smoothing;
    std::vector<float> shepardOut(3 * m, -1.0f), sphOut(m, -1.0f);
    r.normalization = Normalization::Shepard;
    r.smoothed = { SmoothedArray{ c.vector3.data(), 3, shepardOut.data(), "vector" } };
    runChecked(engine, r, GetParam());
    ngtest::expectClose(shepardOut, shepard, "Shepard smoothing", &shepardScale);
    r.normalization = Normalization::SPH;
    r.smoothed = { SmoothedArray{ c.scalar.data(), 1, sphOut.data(), "scalar" } };
    runChecked(engine, r, GetParam());
    ngtest::expectClose(sphOut, sph, "SPH smoothing", &sphScale);
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, EngineComposition, testing::ValuesIn(everyCell()), cellName);

/// Same to float rounding: |a - b| <= 1e-5 |b| + 1e-4 of the array's root mean square (sums in
/// another order; the gradient's terms cancel).
void expectSameSums(const std::vector<float>& got, const std::vector<float>& want, const char* what)
{
  ASSERT_EQ(got.size(), want.size());
  double squares = 0.0;
  for (float v : want)
  {
    squares += double(v) * double(v);
  }
  const double rms = std::sqrt(squares / double(std::max<std::size_t>(1, want.size())));
  int bad = 0;
  for (std::size_t k = 0; k < want.size(); ++k)
  {
    if (!(std::fabs(double(got[k]) - want[k]) <= 1e-5 * std::fabs(want[k]) + 1e-4 * rms) && bad++ < 5)
    {
      ADD_FAILURE() << what << " entry " << k << ": in slabs " << got[k] << ", in one run " << want[k];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

/// Per-particle radii in slabs on a cloud large enough for a memory limit to cut it on either
/// backend (the CUDA methods keep 16-32 MB of scratch a run): every mode, open and periodic,
/// count, density and the gradient against one run of the same request (which the matrix above
/// checks against the brute force on small clouds).
TEST(EngineSlabsRadii, EveryModeInSlabsMatchesOneRun)
{
  const bool cuda = backendUnderTest == Backend::CUDA;
  const std::int64_t n = cuda ? 3000000 : 60000;
  const double box = cuda ? 230.0 : 64.0;
  const Cloud cloud = ngtest::makeCloud("clustered", n, box, 74);
  // Radii for 32 neighbors (Smoothing Length), at most 3: clusters and a sparse background.
  std::vector<float> radii(n);
  {
    Engine engine;
    Request k;
    k.points = cloud.points();
    k.backend = backendUnderTest;
    k.operation = Operation::SmoothingLength;
    k.neighborTarget = 32;
    k.supportRadius = radii.data();
    engine.run(k);
    for (float& h : radii)
    {
      h = std::min(h, 3.0f);
    }
  }
  Engine whole, sliced;
  sliced.setMemoryLimit(cuda ? (std::int64_t(96) << 20) : 100 * n / 4);
  for (const bool periodic : { false, true })
  {
    for (SmoothingLengthMode mode : { SmoothingLengthMode::Gather, SmoothingLengthMode::Scatter, SmoothingLengthMode::Symmetric })
    {
      SCOPED_TRACE(std::string(toString(mode)) + (periodic ? ", periodic" : ", open"));
      Request r;
      r.points = cloud.points();
      r.backend = backendUnderTest;
      r.radii = radii.data();
      r.smoothingLengthMode = mode;
      r.mass = cloud.mass.data();
      for (int a = 0; a < 3; ++a)
      {
        r.periodic[a] = periodic;
        r.boxLengths[a] = box;
      }
      std::vector<std::int32_t> wantCount(n), gotCount(n, -1);
      std::vector<float> wantRho(n), gotRho(n, -1.0f), wantGradient(3 * n), gotGradient(3 * n, -1.0f);
      auto runAll = [&](Engine& engine, std::vector<std::int32_t>& count, std::vector<float>& rho,
                      std::vector<float>& gradient) {
        Request q = r;
        q.operation = Operation::NeighborCount;
        q.neighborCount = count.data();
        std::int64_t slabs = engine.run(q).slabs;
        q.neighborCount = nullptr;
        q.operation = Operation::Density;
        q.density = rho.data();
        slabs = std::min(slabs, engine.run(q).slabs);
        q.density = nullptr;
        q.operation = Operation::Gradient;
        q.smoothed = { SmoothedArray{ cloud.scalar.data(), 1, gradient.data(), "scalar" } };
        return std::min(slabs, engine.run(q).slabs);
      };
      EXPECT_EQ(runAll(whole, wantCount, wantRho, wantGradient), 1);
      EXPECT_GE(runAll(sliced, gotCount, gotRho, gotGradient), 2) << "the memory limit did not cut every run";
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < n; ++i)
      {
        bad += gotCount[i] != wantCount[i];
      }
      EXPECT_EQ(bad, 0) << "points whose count in slabs differs from one run";
      expectSameSums(gotRho, wantRho, "density");
      expectSameSums(gotGradient, wantGradient, "gradient");
    }
  }
}

} // namespace
