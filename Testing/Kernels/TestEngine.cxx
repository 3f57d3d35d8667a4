// Engine tests: every operation x kernel x method on the backend named on the command line
// (--backend=cpu or --backend=cuda), against a double-precision brute force.
// With --backend=cuda and no usable device the program exits 77, which CTest reports as skipped.
#include "Clouds.h"
#include "RadiiReference.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <algorithm>
#include <array>
#include <initializer_list>
#include <set>
#include <vector>

using namespace neighborgrid;
using ngtest::Cloud;
using ngtest::Reference;
using ngtest::RadiiReference;
using ngtest::UnrolledBox;
using ngtest::asDouble;
using ngtest::expectClose;
using ngtest::firstOf;
using ngtest::unrolledBox;
using ngtest::volumesFrom;
using ngtest::withinDouble;

neighborgrid::Backend ngtest::backendUnderTest = neighborgrid::Backend::CPU;
using ngtest::backendUnderTest;

namespace
{

struct Scenario
{
  std::string kind;
  std::int64_t count;
  double box;
  double radius;
  bool asFloat;
  std::uint64_t seed;
};

std::string scenarioName(const testing::TestParamInfo<Scenario>& info)
{
  std::string r = std::to_string(info.param.radius);
  for (auto& ch : r)
  {
    if (ch == '.')
    {
      ch = 'p';
    }
  }
  r.erase(r.find_last_not_of('0') + 1);
  return info.param.kind + "_" + std::to_string(info.param.count) + "_R" + r + (info.param.asFloat ? "_f32" : "_f64");
}

struct Fixture
{
  Cloud cloud;
  std::unique_ptr<Reference> reference;
};

Fixture& fixtureFor(const Scenario& s)
{
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  const std::string key = s.kind + std::to_string(s.count) + std::to_string(s.radius) + std::to_string(s.asFloat);
  auto& slot = cache[key];
  if (!slot)
  {
    slot = std::make_unique<Fixture>();
    slot->cloud = ngtest::makeCloud(s.kind, s.count, s.box, s.seed, s.asFloat);
    slot->reference = std::make_unique<Reference>(slot->cloud, s.radius);
  }
  return *slot;
}

Request baseRequest(const Cloud& c, double radius, Method method)
{
  Request r;
  r.points = c.points();
  r.radius = radius;
  r.backend = backendUnderTest;
  r.method = method;
  r.dimension = c.dimension;
  return r;
}

std::vector<Method> methodsFor(const Scenario& s)
{
  std::vector<Method> methods{ Method::CountingSort, Method::Auto };
  if (backendUnderTest == Backend::CUDA)
  {
    methods.push_back(Method::FENNS);
    methods.push_back(Method::RadixSort);
    methods.push_back(Method::CLAWS);
    methods.push_back(Method::Bayraktar);
    methods.push_back(Method::StagedTiles);
  }
  // The CPU brute force is quadratic: keep CI fast.
  if (backendUnderTest == Backend::CUDA || s.count <= 5000)
  {
    methods.push_back(Method::BruteForce);
  }
  return methods;
}

/// methodsFor, and on CUDA the Radius Tree, which computes at the particles only (no probes).
std::vector<Method> particleMethodsFor(const Scenario& s)
{
  std::vector<Method> methods = methodsFor(s);
  if (backendUnderTest == Backend::CUDA)
  {
    methods.push_back(Method::RadiusTree);
  }
  return methods;
}

class EngineAccuracy : public testing::TestWithParam<Scenario>
{
};

TEST_P(EngineAccuracy, NeighborCountMatchesDoubleBruteForce)
{
  const Scenario& s = GetParam();
  Fixture& f = fixtureFor(s);
  const Reference& ref = *f.reference;
  Engine engine;
  RecordProperty("average_neighbors", std::to_string(ref.averageNeighbors()));
  for (Method method : particleMethodsFor(s))
  {
    SCOPED_TRACE(toString(method));
    Request r = baseRequest(f.cloud, s.radius, method);
    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> counts(s.count, -7); // poison: every entry must be written
    r.neighborCount = counts.data();
    const Report report = engine.run(r);
    EXPECT_EQ(report.backend, backendUnderTest);
    EXPECT_NE(report.method, Method::Auto);
    std::int64_t total = 0, bad = 0;
    for (std::int64_t i = 0; i < s.count; ++i)
    {
      total += counts[i];
      if (counts[i] != ref.certain[i] && bad++ < 5)
      {
        ADD_FAILURE() << "point " << i << ": count " << counts[i] << ", exact reference " << ref.certain[i];
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(report.neighborPairs, total);
  }
}


TEST_P(EngineAccuracy, DensityMatchesDoubleBruteForceForEveryKernel)
{
  const Scenario& s = GetParam();
  Fixture& f = fixtureFor(s);
  Engine engine;
  for (Kernel kernel : { Kernel::CubicSpline, Kernel::QuarticSpline, Kernel::QuinticSpline, Kernel::WendlandC2 })
  {
    const auto withMass = f.reference->density(f.cloud, kernel, f.cloud.mass.data(), 1.0);
    const auto constant = f.reference->density(f.cloud, kernel, nullptr, 2.5);
    for (Method method : particleMethodsFor(s))
    {
      SCOPED_TRACE(std::string(toString(kernel)) + ", " + toString(method));
      Request r = baseRequest(f.cloud, s.radius, method);
      r.operation = Operation::Density;
      r.kernel = kernel;
      r.mass = f.cloud.mass.data();
      std::vector<float> rho(s.count, -1.0f);
      r.density = rho.data();
      engine.run(r);
      expectClose(rho, withMass, "density (mass array)");

      r.mass = nullptr;
      r.constantMass = 2.5;
      std::fill(rho.begin(), rho.end(), -1.0f);
      engine.run(r);
      expectClose(rho, constant, "density (constant mass)");
    }
  }
}

TEST_P(EngineAccuracy, SmoothingMatchesDoubleBruteForce)
{
  const Scenario& s = GetParam();
  Fixture& f = fixtureFor(s);
  const Cloud& c = f.cloud;
  Engine engine;
  struct Case
  {
    Kernel kernel;
    Normalization normalization;
  };
  for (const Case& k : { Case{ Kernel::CubicSpline, Normalization::Shepard }, Case{ Kernel::QuinticSpline, Normalization::Shepard },
         Case{ Kernel::WendlandC2, Normalization::SPH }, Case{ Kernel::QuarticSpline, Normalization::SPH } })
  {
    const bool shepard = k.normalization == Normalization::Shepard;
    const auto scalarRef = f.reference->smooth(c, k.kernel, c.scalar, 1, shepard, c.mass.data(), 1.0);
    const auto vectorRef = f.reference->smooth(c, k.kernel, c.vector3, 3, shepard, c.mass.data(), 1.0);
    const auto vectorScale = f.reference->smooth(c, k.kernel, c.vector3, 3, shepard, c.mass.data(), 1.0, true);
    const auto tensorRef = f.reference->smooth(c, k.kernel, c.tensor9, 9, shepard, c.mass.data(), 1.0);
    const auto tensorScale = f.reference->smooth(c, k.kernel, c.tensor9, 9, shepard, c.mass.data(), 1.0, true);
    // Two components: the one width that no other array here takes in a pass of its own.
    std::vector<float> pairValues(2 * std::size_t(s.count));
    for (std::size_t i = 0; i < std::size_t(s.count); ++i)
    {
      pairValues[2 * i] = c.vector3[3 * i];
      pairValues[2 * i + 1] = c.tensor9[9 * i + 4];
    }
    const auto pairRef = f.reference->smooth(c, k.kernel, pairValues, 2, shepard, c.mass.data(), 1.0);
    const auto pairScale = f.reference->smooth(c, k.kernel, pairValues, 2, shepard, c.mass.data(), 1.0, true);
    const auto densityRef = f.reference->density(c, k.kernel, c.mass.data(), 1.0);
    for (Method method : particleMethodsFor(s))
    {
      SCOPED_TRACE(std::string(toString(k.kernel)) + ", " + toString(k.normalization) + ", " + toString(method));
      Request r = baseRequest(c, s.radius, method);
      r.operation = Operation::Smoothing;
      r.kernel = k.kernel;
      r.normalization = k.normalization;
      r.mass = c.mass.data();
      std::vector<float> scalar(s.count, -1.0f), vector(3 * s.count, -1.0f), tensor(9 * s.count, -1.0f),
        pair(2 * s.count, -1.0f), rho(s.count, -1.0f);
      r.smoothed = { { c.scalar.data(), 1, scalar.data(), "scalar" }, { c.vector3.data(), 3, vector.data(), "vector" },
        { c.tensor9.data(), 9, tensor.data(), "tensor" }, { pairValues.data(), 2, pair.data(), "pair" } };
      if (!shepard)
      {
        r.density = rho.data();
      }
      engine.run(r);
      expectClose(scalar, scalarRef, "smoothed scalar");
      expectClose(vector, vectorRef, "smoothed vector", &vectorScale);
      expectClose(tensor, tensorRef, "smoothed 9-component array", &tensorScale);
      expectClose(pair, pairRef, "smoothed 2-component array", &pairScale);
      if (!shepard)
      {
        expectClose(rho, densityRef, "density of SPH smoothing");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Clouds, EngineAccuracy,
  testing::Values(Scenario{ "uniform", 500, 6.0, 1.0, true, 1 }, Scenario{ "uniform", 4000, 10.0, 0.9, true, 2 },
    Scenario{ "uniform", 20000, 16.0, 1.0, true, 3 }, Scenario{ "clustered", 4000, 10.0, 0.5, true, 4 },
    Scenario{ "duplicates", 3000, 8.0, 0.8, true, 5 }, Scenario{ "planar", 3000, 10.0, 0.7, true, 6 },
    Scenario{ "far", 3000, 8.0, 0.8, false, 7 }, Scenario{ "far", 2000, 8.0, 0.8, true, 8 },
    // Tiny radius: a grid of cells of size R would have 10^12 cells; most points have no neighbor.
    Scenario{ "uniform", 3000, 100.0, 0.01, true, 9 },
    // Radius larger than the whole cloud: everyone is everyone's neighbor.
    Scenario{ "uniform", 400, 5.0, 50.0, true, 10 },
    // 40 positions, 150 points each: cells far fuller than a FENNS chunk.
    Scenario{ "stacked", 6000, 4.0, 0.6, true, 13 },
    // A dense cube and far points (1e6, 3.5e9, 1e30, 1e300, a -9999 sentinel): keys wider than 64
    // bits, huge cells; float and double input.
    Scenario{ "outliers", 4000, 8.0, 0.8, false, 17 }, Scenario{ "outliers", 3000, 8.0, 0.8, true, 18 }),
  scenarioName);

// --- Kernels integrate to one (as VTK's TestSPHKernels checks) ----------------------------------
TEST(Kernels, IntegrateToOne)
{
  for (Kernel kernel : { Kernel::CubicSpline, Kernel::QuarticSpline, Kernel::QuinticSpline, Kernel::WendlandC2 })
  {
    for (int dimension : { 2, 3 })
    {
      const double radius = 1.7;
      const int steps = 200000;
      const double dr = radius / steps;
      double integral = 0;
      for (int k = 0; k < steps; ++k)
      {
        const double r = (k + 0.5) * dr; // midpoint rule
        const double shell = dimension == 3 ? 4.0 * M_PI * r * r : 2.0 * M_PI * r;
        integral += shell * kernelValue(kernel, dimension, radius, r) * dr;
      }
      EXPECT_NEAR(integral, 1.0, 1e-6) << toString(kernel) << " in " << dimension << "D";
      EXPECT_EQ(kernelValue(kernel, dimension, radius, radius), 0.0) << toString(kernel);
      EXPECT_GT(kernelValue(kernel, dimension, radius, 0.0), 0.0);
    }
  }
}

// --- Bad input: a clear error, outputs untouched ----------------------------------------------
class EngineErrors : public testing::Test
{
protected:
  Cloud cloud = ngtest::makeCloud("uniform", 100, 3.0, 11);
  std::vector<float> rho = std::vector<float>(100, -1.0f);
  Request request()
  {
    Request r = baseRequest(cloud, 0.5, Method::Auto);
    r.operation = Operation::Density;
    r.density = rho.data();
    return r;
  }
  void expectError(const Request& r, const std::string& fragment)
  {
    Engine engine;
    try
    {
      engine.run(r);
      ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
    }
    catch (const Error& e)
    {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    for (float v : rho)
    {
      ASSERT_EQ(v, -1.0f) << "an output was written despite the error";
    }
  }
};

TEST_F(EngineErrors, RejectsBadRadius)
{
  for (double radius : { 0.0, -1.0, std::nan(""), HUGE_VAL, 1e-160, 1e160 })
  {
    Request r = request();
    r.radius = radius;
    expectError(r, "radius");
  }
}

TEST_F(EngineErrors, RejectsEmptyInput)
{
  Request r = request();
  r.points = Points(cloud.xyzFloat.data(), 0);
  expectError(r, "no points");
}

TEST_F(EngineErrors, NamesThePointWithANonFiniteCoordinate)
{
  cloud.xyzFloat[3 * 42 + 1] = std::nanf("");
  expectError(request(), "point 42");
  cloud.xyzFloat[3 * 42 + 1] = 1.0f;
  cloud.xyzFloat[3 * 57] = INFINITY;
  expectError(request(), "point 57");
}

TEST_F(EngineErrors, RejectsNonFiniteMass)
{
  Request r = request();
  cloud.mass[9] = NAN;
  r.mass = cloud.mass.data();
  expectError(r, "mass of point 9");
}

TEST_F(EngineErrors, RejectsMissingOutputsAndArrays)
{
  Request r = request();
  r.density = nullptr;
  expectError(r, "Density needs");
  r = request();
  r.operation = Operation::Smoothing;
  expectError(r, "at least one array");
  r.smoothed = { { cloud.scalar.data(), 0, rho.data(), "pressure" } };
  expectError(r, "'pressure'");
  r = request();
  r.dimension = 4;
  expectError(r, "dimension");
}

TEST_F(EngineErrors, AbortFromProgressCallbackStopsTheRun)
{
  Request r = request();
  int calls = 0;
  r.progress = [&](double fraction, const char*) {
    EXPECT_GE(fraction, 0.0);
    EXPECT_LE(fraction, 1.0);
    return ++calls < 2;
  };
  Engine engine;
  EXPECT_THROW(engine.run(r), Aborted);
  EXPECT_EQ(calls, 2);
}

TEST(EngineMethods, GpuOnlyMethodsOnTheCpuGiveAClearError)
{
  Cloud cloud = ngtest::makeCloud("uniform", 200, 3.0, 14);
  std::vector<float> rho(200, -1.0f);
  for (Method method : { Method::FENNS, Method::RadixSort, Method::CLAWS, Method::Bayraktar, Method::StagedTiles })
  {
    Request r = baseRequest(cloud, 0.5, method);
    r.backend = Backend::CPU;
    r.density = rho.data();
    Engine engine;
    try
    {
      engine.run(r);
      ADD_FAILURE() << toString(method) << " ran on the CPU";
    }
    catch (const Error& e)
    {
      EXPECT_NE(std::string(e.what()).find("CUDA backend only"), std::string::npos) << e.what();
    }
    for (float v : rho)
    {
      ASSERT_EQ(v, -1.0f);
    }
  }
}

/// Runs Neighbor Count and Density (Wendland C2, mass array) with `engine` and checks both against
/// the double reference.
void expectCountsAndDensity(Engine& engine, Request r, const Cloud& cloud, const Reference& ref,
  const std::vector<double>& rhoRef)
{
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> counts(cloud.size(), -7);
  r.neighborCount = counts.data();
  engine.run(r);
  for (std::int64_t i = 0; i < cloud.size(); ++i)
  {
    ASSERT_EQ(counts[i], ref.certain[i]) << "point " << i;
  }
  r.operation = Operation::Density;
  r.kernel = Kernel::WendlandC2;
  r.mass = cloud.mass.data();
  std::vector<float> rho(cloud.size(), -1.0f);
  r.density = rho.data();
  engine.run(r);
  for (std::int64_t i = 0; i < cloud.size(); ++i)
  {
    ASSERT_NEAR(rho[i], rhoRef[i], 1e-5 * rhoRef[i]) << "point " << i;
  }
}

/// A clustered cloud of 6,000 points with R = 0.45 and its counts and density in double: the
/// exactness case for one method's variants and knobs.
struct ClusteredExactCase
{
  static constexpr double radius = 0.45;
  Cloud cloud;
  Reference ref;
  std::vector<double> rhoRef;

  explicit ClusteredExactCase(std::uint64_t seed)
    : cloud(ngtest::makeCloud("clustered", 6000, 8.0, seed)), ref(cloud, radius),
      rhoRef(ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0))
  {
  }
  void expectExact(Engine& engine, Method method) const
  {
    expectCountsAndDensity(engine, baseRequest(cloud, radius, method), cloud, ref, rhoRef);
  }
};

// FENNS with very small coarse cells (most particles in border sections, many chunks of few
// particles) and very large ones (many chunks per cell): the grid sizes must never change results.
TEST(EngineMethods, FennsIsExactForAnyCoarseCellSize)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "FENNS runs on the CUDA backend only";
  }
  const ClusteredExactCase exact(15);
  for (const char* variant : { "gather", "scatter" })
  {
    setenv("NEIGHBORGRID_FENNS_VARIANT", variant, 1);
    for (const char* target : { "1", "40", "5000", "100000" })
    {
      SCOPED_TRACE(std::string("NEIGHBORGRID_FENNS_TARGET=") + target + ", NEIGHBORGRID_FENNS_VARIANT=" + variant);
      setenv("NEIGHBORGRID_FENNS_TARGET", target, 1);
      Engine engine; // reads the knobs when its CUDA backend starts
      exact.expectExact(engine, Method::FENNS);
    }
  }
  unsetenv("NEIGHBORGRID_FENNS_TARGET");
  unsetenv("NEIGHBORGRID_FENNS_VARIANT");
}

// An occupied-cell table too large for 32-bit slots (sparse clouds of more than 2^28 points, or a
// far outlier beside them) ranks the cells with the radix sort instead: the knob takes that path
// on a small cloud, for every method that groups its points that way.
TEST(EngineMethods, RankedSlotCellsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "the occupied-cell table is the CUDA backend's";
  }
  const ClusteredExactCase exact(17);
  setenv("NEIGHBORGRID_SLOT_CELLS_RANKED", "1", 1);
  for (Method method : { Method::CountingSort, Method::FENNS, Method::CLAWS })
  {
    SCOPED_TRACE(toString(method));
    Engine engine;
    exact.expectExact(engine, method);
  }
  unsetenv("NEIGHBORGRID_SLOT_CELLS_RANKED");
}

// Counting Sort scans tables of up to 32,768 counts in the last block of its offsets kernel and
// larger ones with CUB: clouds whose tables (8 slots a cell up to 16,384 points) lie on either side
// of that limit, of sizes that leave a ragged last tile, sparse and clustered.
TEST(EngineMethods, CountingSortIsExactOnEitherSideOfItsOneBlockScan)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "the one-block scan is the CUDA backend's";
  }
  Engine engine;
  for (std::int64_t n : { 700, 2048, 4095, 4099, 8195, 20001 })
  {
    for (const char* kind : { "uniform", "clustered" })
    {
      const Cloud cloud = ngtest::makeCloud(kind, n, 6.0 * std::cbrt(double(n) / 1000.0), 101 + n);
      const double radius = 0.45;
      SCOPED_TRACE(cloud.name);
      const Reference ref(cloud, radius);
      expectCountsAndDensity(engine, baseRequest(cloud, radius, Method::CountingSort), cloud, ref,
        ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0));
    }
  }
}

// CLAWS with each of its ideas switched off in turn (and all of them), on clouds whose cells hold
// several chunks, many duplicates and planar data: every combination must give the same results.
TEST(EngineMethods, ClawsIsExactWithEachIdeaSwitchedOff)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "CLAWS runs on the CUDA backend only";
  }
  for (const char* kind : { "clustered", "stacked", "planar" })
  {
    Cloud cloud = ngtest::makeCloud(kind, 5000, 8.0, 16);
    const double radius = 0.5;
    Reference ref(cloud, radius);
    const auto rhoRef = ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0);
    const auto smoothRef = ref.smooth(cloud, Kernel::CubicSpline, cloud.vector3, 3, true, nullptr, 1.0);
    const auto smoothScale = ref.smooth(cloud, Kernel::CubicSpline, cloud.vector3, 3, true, nullptr, 1.0, true);
    for (const char* disabled : { "", "symmetric", "reorder", "merged", "warps", "symmetric,reorder,merged,warps" })
    {
      SCOPED_TRACE(std::string(kind) + ", NEIGHBORGRID_CLAWS_DISABLE=" + disabled);
      setenv("NEIGHBORGRID_CLAWS_DISABLE", disabled, 1);
      Engine engine;
      Request r = baseRequest(cloud, radius, Method::CLAWS);
      expectCountsAndDensity(engine, r, cloud, ref, rhoRef);
      if (HasFatalFailure())
      {
        return;
      }
      r.operation = Operation::Smoothing;
      std::vector<float> smooth(3 * cloud.size(), -1.0f);
      r.smoothed = { { cloud.vector3.data(), 3, smooth.data(), "vector" } };
      engine.run(r);
      for (std::size_t k = 0; k < smooth.size(); ++k)
      {
        ASSERT_NEAR(smooth[k], smoothRef[k], 1e-5 * std::max(std::abs(smoothRef[k]), smoothScale[k])) << "entry " << k;
      }
    }
  }
  unsetenv("NEIGHBORGRID_CLAWS_DISABLE");
}

/// Stars: centers 3R apart, each with 2-9 satellites at R in random directions, rounded to float,
/// so that many centers have several pairs within rounding of R (a lane decides one alone and
/// walks its candidates again for two or more), among clustered background points.
Cloud starsAtTheRadius(double radius, std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> satellites(2, 9);
  Cloud c = ngtest::makeCloud("clustered", 3000, 12.0 * radius, seed);
  for (int cx = 0; cx < 4; ++cx)
  {
    for (int cy = 0; cy < 4; ++cy)
    {
      for (int cz = 0; cz < 4; ++cz)
      {
        const double center[3] = { 0.3 + 3.0 * radius * cx, 0.2 + 3.0 * radius * cy, 0.1 + 3.0 * radius * cz };
        c.xyz.insert(c.xyz.end(), center, center + 3);
        for (int s = satellites(rng); s > 0; --s)
        {
          double d[3], norm = 0.0;
          for (double& v : d)
          {
            v = unit(rng);
            norm += v * v;
          }
          for (int a = 0; a < 3; ++a)
          {
            c.xyz.push_back(center[a] + radius * d[a] / std::sqrt(norm));
          }
        }
      }
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

/// A ball of 6,000 points 0.3 R across among 3,000 clustered ones: each of its points has about
/// 6,000 neighbors, so no tile around it fits shared memory (Staged Tiles reads those from global
/// memory).
Cloud denseBall(double radius, std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  Cloud c = ngtest::makeCloud("clustered", 3000, 12.0 * radius, seed);
  const double center[3] = { 2.1 * radius, 3.3 * radius, 4.7 * radius };
  for (int k = 0; k < 6000;)
  {
    double d[3] = { unit(rng), unit(rng), unit(rng) };
    if (d[0] * d[0] + d[1] * d[1] + d[2] * d[2] > 1.0)
    {
      continue;
    }
    for (int a = 0; a < 3; ++a)
    {
      c.xyz.push_back(center[a] + 0.15 * radius * d[a]);
    }
    ++k;
  }
  ngtest::finishCloud(c, rng);
  return c;
}

/// 6 x 6 x 6 cells of R / 2, each with `perCell` uniform points: Staged Tiles takes tiles of one
/// cell there, and a tile's region (5^3 cells) stages about 125 perCell points.
Cloud fullCellsOfHalfRadius(double radius, int perCell, std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Cloud c;
  c.name = "full-cells";
  c.asFloat = true;
  const double side = 0.5 * radius;
  for (int cell = 0; cell < 216; ++cell)
  {
    const int place[3] = { cell % 6, (cell / 6) % 6, cell / 36 };
    for (int k = 0; k < perCell; ++k)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz.push_back(side * (place[a] + unit(rng)));
      }
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

/// An environment knob set for one scope (also when an assertion leaves it early).
struct ScopedKnob
{
  ScopedKnob(const char* name, const char* value)
    : name(name)
  {
    setenv(name, value, 1);
  }
  ~ScopedKnob() { unsetenv(name); }
  const char* name;
};

/// What a loop of Staged Tiles must match on a cloud: the double references of count, density
/// (Wendland C2, the cloud's masses) and Shepard smoothing (cubic spline) of its scalar and its
/// 3-vector, with the smoothing's rounding scales.
struct LoopReference
{
  LoopReference(const Cloud& cloud, double radius)
    : ref(cloud, radius)
    , rho(ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0))
    , rhoOneMass(ref.density(cloud, Kernel::CubicSpline, nullptr, oneMass))
    , rhoOneMassQuintic(ref.density(cloud, Kernel::QuinticSpline, nullptr, oneMass))
    , smooth1(ref.smooth(cloud, Kernel::CubicSpline, cloud.scalar, 1, true, nullptr, 1.0))
    , smooth1Scale(ref.smooth(cloud, Kernel::CubicSpline, cloud.scalar, 1, true, nullptr, 1.0, true))
    , smooth3(ref.smooth(cloud, Kernel::CubicSpline, cloud.vector3, 3, true, nullptr, 1.0))
    , smooth3Scale(ref.smooth(cloud, Kernel::CubicSpline, cloud.vector3, 3, true, nullptr, 1.0, true))
    , smooth9(ref.smooth(cloud, Kernel::CubicSpline, cloud.tensor9, 9, true, nullptr, 1.0))
    , smooth9Scale(ref.smooth(cloud, Kernel::CubicSpline, cloud.tensor9, 9, true, nullptr, 1.0, true))
  {
  }
  static constexpr double oneMass = 1.75; // density of one mass for every point (the half shell's)
  Reference ref;
  std::vector<double> rho, rhoOneMass, rhoOneMassQuintic, smooth1, smooth1Scale, smooth3, smooth3Scale, smooth9, smooth9Scale;
};

/// Counts and density (expectCountsAndDensity), density of one mass for every point (which Staged
/// Tiles sums over the half shell: StagedTiles::takesHalfShell), then Shepard smoothing of the
/// scalar, the 3-vector and the 9-component tensor (passes of four, four and one), each against
/// `want`.
void expectLoopResults(Engine& engine, Request r, const Cloud& cloud, const LoopReference& want)
{
  expectCountsAndDensity(engine, r, cloud, want.ref, want.rho);
  if (::testing::Test::HasFatalFailure())
  {
    return;
  }
  // The cubic spline's shape is at most 1, the quintic's 66 (the half shell's fixed point).
  for (const Kernel kernel : { Kernel::CubicSpline, Kernel::QuinticSpline })
  {
    const std::vector<double>& rhoWant = kernel == Kernel::CubicSpline ? want.rhoOneMass : want.rhoOneMassQuintic;
    Request oneMass = r;
    oneMass.operation = Operation::Density;
    oneMass.kernel = kernel;
    oneMass.mass = nullptr;
    oneMass.constantMass = LoopReference::oneMass;
    std::vector<float> rho(cloud.size(), -1.0f);
    oneMass.density = rho.data();
    engine.run(oneMass);
    for (std::int64_t i = 0; i < cloud.size(); ++i)
    {
      ASSERT_NEAR(rho[i], rhoWant[i], 1e-5 * rhoWant[i]) << "point " << i << ", one mass, " << toString(kernel);
    }
  }
  r.operation = Operation::Smoothing;
  std::vector<float> smooth1(cloud.size(), -1.0f), smooth3(3 * cloud.size(), -1.0f);
  r.smoothed = { { cloud.scalar.data(), 1, smooth1.data(), "scalar" } };
  engine.run(r);
  r.smoothed = { { cloud.vector3.data(), 3, smooth3.data(), "vector" } };
  engine.run(r);
  for (std::size_t k = 0; k < smooth1.size(); ++k)
  {
    ASSERT_NEAR(smooth1[k], want.smooth1[k], 1e-5 * std::max(std::abs(want.smooth1[k]), want.smooth1Scale[k])) << "entry " << k;
  }
  for (std::size_t k = 0; k < smooth3.size(); ++k)
  {
    ASSERT_NEAR(smooth3[k], want.smooth3[k], 1e-5 * std::max(std::abs(want.smooth3[k]), want.smooth3Scale[k])) << "entry " << k;
  }
  std::vector<float> smooth9(9 * cloud.size(), -1.0f);
  r.smoothed = { { cloud.tensor9.data(), 9, smooth9.data(), "tensor" } };
  engine.run(r);
  for (std::size_t k = 0; k < smooth9.size(); ++k)
  {
    ASSERT_NEAR(smooth9[k], want.smooth9[k], 1e-5 * std::max(std::abs(want.smooth9[k]), want.smooth9Scale[k])) << "entry " << k;
  }
}

/// The loop per point (NEIGHBORGRID_TILES_LOOP=points) on each cloud, once for each variant
/// "reach value": NEIGHBORGRID_TILES_REACH=reach and `knob`=value, exact (expectLoopResults).
void expectLoopExactForKnob(const std::vector<Cloud>& clouds, double radius, const char* knob,
  std::initializer_list<const char*> variants)
{
  for (const Cloud& cloud : clouds)
  {
    const LoopReference want(cloud, radius);
    for (const char* variant : variants)
    {
      const std::string reach(variant, 1), value(variant + 2);
      SCOPED_TRACE(cloud.name + ", NEIGHBORGRID_TILES_REACH=" + reach + ", " + knob + "=" + value);
      const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", reach.c_str());
      const ScopedKnob valueKnob(knob, value.c_str());
      const ScopedKnob loopKnob("NEIGHBORGRID_TILES_LOOP", "points");
      Engine engine;
      expectLoopResults(engine, baseRequest(cloud, radius, Method::StagedTiles), cloud, want);
      if (::testing::Test::HasFatalFailure())
      {
        return;
      }
    }
  }
}

/// A Staged Tiles knob set to a value it does not take: the run is an error that names the knob,
/// and the output stays untouched.
void expectMisspelledKnobRefused(const char* name, const char* value)
{
  const ScopedKnob knob(name, value);
  const Cloud cloud = ngtest::makeCloud("clustered", 2000, 8.0, 3);
  Engine engine;
  Request r = baseRequest(cloud, 0.5, Method::StagedTiles);
  r.operation = Operation::Density;
  std::vector<float> rho(cloud.size(), -1.0f);
  r.density = rho.data();
  try
  {
    engine.run(r);
    ADD_FAILURE() << "a misspelled " << name << " ran";
  }
  catch (const Error& e)
  {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::all_of(rho.begin(), rho.end(), [](float v) { return v == -1.0f; }));
}

// Staged Tiles has two loops over a staged tile (one thread per point; cluster pairs) and picks
// one per operation, on cells of R / 2 or of R (reach 2 or 1) by the data's density, and on
// sparse data a search by point; each must be exact for every operation, also where a tile does
// not fit shared memory ("ball"). "sparse" is 2,000 uniform points in a box of 8 with R = 0.3:
// about one point per occupied cell of R, so with cells of R every point looks up its 27 cells
// (StagedTiles::sort).
// Band-free smoothing stages its values in shared memory, 24 bytes a point for three components
// and 32 for four (cluster pairs): a region of about 8,750 points fits shared memory as particles
// and indices but not with those values, and such a pass takes the banded loop, which stages
// indices. Every width must still match the double reference there.
TEST(EngineMethods, StagedTilesSmoothRegionsTooFullForStagedValues)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.4;
  const Cloud cloud = fullCellsOfHalfRadius(radius, 70, 31);
  const Reference ref(cloud, radius);
  Engine engine;
  Request r = baseRequest(cloud, radius, Method::StagedTiles);
  r.operation = Operation::Smoothing;
  struct Width
  {
    const std::vector<float>* values;
    int components;
  };
  for (const Width& w : { Width{ &cloud.scalar, 1 }, Width{ &cloud.vector3, 3 }, Width{ &cloud.tensor9, 9 } })
  {
    SCOPED_TRACE(std::to_string(w.components) + " components");
    const auto want = ref.smooth(cloud, Kernel::CubicSpline, *w.values, w.components, true, nullptr, 1.0);
    const auto scale = ref.smooth(cloud, Kernel::CubicSpline, *w.values, w.components, true, nullptr, 1.0, true);
    std::vector<float> got(w.values->size(), -1.0f);
    r.smoothed = { { w.values->data(), w.components, got.data(), "field" } };
    const Report report = engine.run(r);
    // Which loop ran shows in the pairs decided in double (the banded loop decides some, the
    // staged one none); printed, not asserted: it follows the device's shared memory.
    std::cout << "  " << w.components << " components: " << report.pairsDecidedInDouble << " pairs decided in double\n";
    for (std::size_t k = 0; k < got.size(); ++k)
    {
      ASSERT_NEAR(got[k], want[k], 1e-5 * std::max(std::abs(want[k]), scale[k])) << "entry " << k;
    }
  }
}

TEST(EngineMethods, StagedTilesLoopsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  std::int64_t decided = 0;
  for (const char* kind : { "clustered", "stacked", "planar", "stars", "ball", "sparse" })
  {
    const bool sparse = std::string(kind) == "sparse";
    const double radius = sparse ? 0.3 : 0.5;
    const Cloud cloud = std::string(kind) == "stars" ? starsAtTheRadius(radius, 8)
      : std::string(kind) == "ball"                 ? denseBall(radius, 9)
      : sparse                                      ? ngtest::makeCloud("uniform", 2000, 8.0, 23)
                                                    : ngtest::makeCloud(kind, 6000, 8.0, 17);
    const LoopReference want(cloud, radius);
    for (const char* variant : { "1 points", "1 clusters", "2 points", "2 clusters" })
    {
      const std::string reach(variant, 1), loop(variant + 2);
      SCOPED_TRACE(std::string(kind) + ", NEIGHBORGRID_TILES_REACH=" + reach + ", NEIGHBORGRID_TILES_LOOP=" + loop);
      const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", reach.c_str());
      const ScopedKnob knob("NEIGHBORGRID_TILES_LOOP", loop.c_str());
      Engine engine;
      Request r = baseRequest(cloud, radius, Method::StagedTiles);
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> counts(cloud.size(), -7);
      r.neighborCount = counts.data();
      decided += engine.run(r).pairsDecidedInDouble;
      expectLoopResults(engine, r, cloud, want);
      if (HasFatalFailure())
      {
        return;
      }
    }
  }
  // The stars put pairs within rounding of R: both loops decided some in double.
  EXPECT_GT(decided, 0);

  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_LOOP", "cluster");
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_REACH", "3");
}

/// 12,000 uniform points in a box of 4 (about 100 neighbors at R = 0.5) and, 1.5 beyond it, three
/// clumps of 4 x 4 x 4 cells of R / 2 with 16 points each. A clump's region fits a tile's shared
/// memory, and a row of cells across a clump holds about 64 points: more than the 31 of a narrow
/// row entry, so its rows split into pieces, and a point with nine such rows has more pieces than
/// its 25 entries and walks its rows without a list.
Cloud clumpsBesideUniform(std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Cloud c = ngtest::makeCloud("uniform", 12000, 4.0, seed);
  c.name = "clumps beside uniform";
  const double corners[][3] = { { 5.5, 0.5, 0.5 }, { 0.5, 5.5, 2.5 }, { 5.5, 5.5, 1.5 } };
  for (const auto& corner : corners)
  {
    for (int cell = 0; cell < 64; ++cell)
    {
      const int place[3] = { cell % 4, (cell / 4) % 4, cell / 16 };
      for (int k = 0; k < 16; ++k)
      {
        for (int a = 0; a < 3; ++a)
        {
          c.xyz.push_back(corner[a] + 0.25 * (place[a] + unit(rng)));
        }
      }
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

// Narrow row entries (16 bits) are taken where they let one more block share an SM; rows longer
// than an entry holds split into pieces, and a point with more pieces than entries walks its rows
// without a list. Both formats, both reaches, every operation of the loop per point: exact.
TEST(EngineMethods, StagedTilesRowFormatsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  expectLoopExactForKnob({ clumpsBesideUniform(41), starsAtTheRadius(radius, 43) }, radius, "NEIGHBORGRID_TILES_ROWS",
    { "1 narrow", "1 wide", "2 narrow", "2 wide" });
  if (HasFatalFailure())
  {
    return;
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_ROWS", "short");
}

/// 6,000 distinct sites of a lattice of spacing R / 8 in a cube of 6 R (exact in float): in cells
/// of R / 2 (or R) with four x bins a cell, every point lies on the edge of a bin, and many pairs
/// lie exactly R apart, where the pair test decides in double.
Cloud latticeOnBinEdges(double radius, std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> site(0, 47);
  Cloud c;
  c.name = "lattice on the x bins' edges";
  std::set<std::array<int, 3>> taken;
  while (taken.size() < 6000)
  {
    const std::array<int, 3> s = { site(rng), site(rng), site(rng) };
    if (taken.insert(s).second)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz.push_back(radius / 8.0 * s[a]);
      }
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

// Each fine cell's points lie in the order of their x bins (RadixCells), and a point's rows end at
// the bins its sphere reaches. One, two and four bins a cell, both reaches, points on the bins'
// edges and pairs exactly R apart: exact.
TEST(EngineMethods, StagedTilesXBinsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  expectLoopExactForKnob({ latticeOnBinEdges(radius, 47), clumpsBesideUniform(53), starsAtTheRadius(radius, 59) },
    radius, "NEIGHBORGRID_TILES_BINS", { "1 1", "1 4", "2 1", "2 2", "2 4" });
  if (HasFatalFailure())
  {
    return;
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_BINS", "3");
}

/// A lattice in a cube of `side` unit cells, every site exact in float: "simple cubic" (spacing
/// a) or "face-centred" (cubes of 2a, nearest neighbors a sqrt(2) apart).
Cloud latticeOf(const std::string& kind, double a, int side)
{
  std::mt19937_64 rng(61);
  Cloud c;
  c.name = kind + " lattice";
  const bool faceCentred = kind == "face-centred";
  const int sites[4][3] = { { 0, 0, 0 }, { 1, 1, 0 }, { 1, 0, 1 }, { 0, 1, 1 } };
  for (int z = 0; z < side; ++z)
  {
    for (int y = 0; y < side; ++y)
    {
      for (int x = 0; x < side; ++x)
      {
        for (int k = 0; k < (faceCentred ? 4 : 1); ++k)
        {
          const int cell[3] = { x, y, z };
          for (int d = 0; d < 3; ++d)
          {
            c.xyz.push_back(faceCentred ? a * (2 * cell[d] + sites[k][d]) : a * cell[d]);
          }
        }
      }
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

// A crystal with R on one of its neighbor shells puts that shell's pairs of every point within
// rounding of R, each decided in double: six on a simple cubic lattice at R = 2a, twelve on a
// face-centred one at its nearest distance, thirty at R = 5a (3-4-0 and 5-0-0), more than the
// sixteen a point lists (BandPairs). Counted (a point with two or more sweeps its rows again) and
// listed, both reaches: exact.
TEST(EngineMethods, StagedTilesLatticeShellsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const std::initializer_list<const char*> ways = { "1 counted", "1 listed", "2 counted", "2 listed" };
  expectLoopExactForKnob({ latticeOf("simple cubic", 0.25, 20) }, 0.5, "NEIGHBORGRID_TILES_BAND", ways);
  if (HasFatalFailure())
  {
    return;
  }
  expectLoopExactForKnob({ latticeOf("face-centred", 0.25, 10) }, 0.25 * std::sqrt(2.0), "NEIGHBORGRID_TILES_BAND", ways);
  if (HasFatalFailure())
  {
    return;
  }
  expectLoopExactForKnob({ latticeOf("simple cubic", 0.125, 20) }, 0.625, "NEIGHBORGRID_TILES_BAND", ways);
  if (HasFatalFailure())
  {
    return;
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_BAND", "list");
}

// Neighbor Count over the half shell (each pair tested by one of its points and counted for both:
// StagedTiles::countsHalfShell) and over every neighbor, both reaches: exact where tiles fit
// shared memory, where they do not (the dense ball), with points on the x bins' edges, stars at R
// and a crystal whose shell lies at R, its pairs within rounding of R counted and listed.
TEST(EngineMethods, StagedTilesShellsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  const std::initializer_list<const char*> shells = { "1 half", "1 full", "2 half", "2 full" };
  expectLoopExactForKnob({ latticeOnBinEdges(radius, 67), clumpsBesideUniform(71), starsAtTheRadius(radius, 73),
                           denseBall(radius, 79) },
    radius, "NEIGHBORGRID_TILES_SHELL", shells);
  if (HasFatalFailure())
  {
    return;
  }
  for (const char* band : { "counted", "listed" })
  {
    const ScopedKnob bandKnob("NEIGHBORGRID_TILES_BAND", band);
    expectLoopExactForKnob({ latticeOf("simple cubic", 0.25, 20) }, radius, "NEIGHBORGRID_TILES_SHELL", { "1 half", "2 half" });
    if (HasFatalFailure())
    {
      return;
    }
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_SHELL", "quarter");
}

// Where a uniform cloud fills more of a block's threads with them, tiles are one cell deeper along
// z (side x side x (side + 1) cells: StagedTiles::chooseDepthAndCapacity), their own cells in
// Morton order of the cube and then of its top layer, their staged region 9/8 of the cube's;
// Neighbor Count over the half shell takes them two cells deeper (chooseHalfShellTiles: "deepest",
// "deeper" for the other loops), a tile over 256 own points in two blocks. Cube and deeper tiles,
// both reaches, both loops over a staged tile, every operation of the loops: exact on a uniform
// cloud of about 80 neighbors (the density at which the rule takes deeper tiles), clumps beside
// it and points on the x bins' edges.
TEST(EngineMethods, StagedTilesTileDepthsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  const std::vector<Cloud> clouds = { ngtest::makeCloud("uniform", 10000, 4.0, 67), clumpsBesideUniform(71),
    latticeOnBinEdges(radius, 73) };
  for (const Cloud& cloud : clouds)
  {
    const LoopReference want(cloud, radius);
    for (const char* reach : { "1", "2" })
    {
      for (const char* depth : { "cube", "deeper", "deepest" })
      {
        for (const char* loop : { "points", "clusters" })
        {
          SCOPED_TRACE(cloud.name + ", NEIGHBORGRID_TILES_REACH=" + reach + ", NEIGHBORGRID_TILES_DEPTH=" + depth +
            ", NEIGHBORGRID_TILES_LOOP=" + loop);
          const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", reach);
          const ScopedKnob depthKnob("NEIGHBORGRID_TILES_DEPTH", depth);
          const ScopedKnob loopKnob("NEIGHBORGRID_TILES_LOOP", loop);
          Engine engine;
          expectLoopResults(engine, baseRequest(cloud, radius, Method::StagedTiles), cloud, want);
          if (HasFatalFailure())
          {
            return;
          }
        }
      }
    }
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_DEPTH", "cubic");
}

// Tiles of the half shell deeper than wide hold about a block's threads in points; a tile over
// them splits at a layer into two work items, each staging its layers' region (splitLayerOf), and
// one over twice them (or whose layers do not split) takes further chunks of its points. Uniform
// clouds at about 2.4 and 3.3 points per cell of R / 2 (about 230 and 320 points a 4 x 4 x 6 tile,
// so that some and then most tiles hold more than 256), their tiles forced that deep over the half
// shell: counts exact against the brute force in double, and density.
TEST(EngineMethods, StagedTilesHalfShellTilesOverABlocksThreadsAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5; // cells of R / 2 = 0.25 along each axis
  const int n = 40000;
  for (const double perCell : { 2.4, 3.3 })
  {
    const double box = 0.25 * std::cbrt(n / perCell);
    const Cloud cloud = ngtest::makeCloud("uniform", n, box, 89);
    SCOPED_TRACE("uniform, " + std::to_string(perCell) + " points per cell of R / 2");
    const Reference ref(cloud, radius);
    const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", "2");
    const ScopedKnob shellKnob("NEIGHBORGRID_TILES_SHELL", "half");
    const ScopedKnob depthKnob("NEIGHBORGRID_TILES_DEPTH", "deepest");
    Engine engine;
    expectCountsAndDensity(engine, baseRequest(cloud, radius, Method::StagedTiles), cloud, ref,
      ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0));
    if (HasFatalFailure())
    {
      return;
    }
  }
}

/// A uniform cloud of about 2.4 points per cell of R / 2 (about 230 points a 4 x 4 x 6 tile of
/// the half shell) in a cube, with `clump` more points inside a sphere of R / 50 at a point of it.
Cloud uniformWithClump(double radius, int n, int clump, std::uint64_t seed)
{
  const double box = 0.5 * radius * std::cbrt(n / 2.4);
  Cloud c = ngtest::makeCloud("uniform", n, box, seed);
  c.name = clump > 0 ? "uniform with a clump of " + std::to_string(clump) : "uniform";
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const double center[3] = { 0.37 * box, 0.52 * box, 0.61 * box };
  for (int k = 0; k < clump;)
  {
    const double d[3] = { unit(rng), unit(rng), unit(rng) };
    if (d[0] * d[0] + d[1] * d[1] + d[2] * d[2] <= 1.0)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz.push_back(center[a] + 0.02 * radius * d[a]);
      }
      ++k;
    }
  }
  ngtest::finishCloud(c, rng);
  return c;
}

// Over the half shell each block may take a grid tile directly instead of a listed work item
// (StagedTiles::takesTilesDirectly): its tile's first two chunks of own points, and where a tile
// holds more, a second search of listed items takes the chunks after them (searchRest). Both ways
// forced (NEIGHBORGRID_TILES_ITEMS; "direct" refuses a run it cannot take) on a uniform cloud,
// the same with a clump of 1,500 points inside a sphere of R / 50 (its tile has four chunks or
// more for the second search, and its region does not fit shared memory), and clumps beside
// uniform points: Neighbor Count exact against the brute force in double and density of one mass
// against the reference in double, each twice on one engine (a search after one with a second
// launch, and after one without).
TEST(EngineMethods, StagedTilesDirectTilesAreExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  for (const Cloud& cloud : { uniformWithClump(radius, 40000, 0, 97), uniformWithClump(radius, 40000, 1500, 101),
         clumpsBesideUniform(103) })
  {
    const Reference ref(cloud, radius);
    const std::vector<double> rhoRef = ref.density(cloud, Kernel::WendlandC2, nullptr, 1.0);
    for (const char* items : { "direct", "listed" })
    {
      SCOPED_TRACE(cloud.name + ", NEIGHBORGRID_TILES_ITEMS=" + items);
      const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", "2");
      const ScopedKnob shellKnob("NEIGHBORGRID_TILES_SHELL", "half");
      const ScopedKnob depthKnob("NEIGHBORGRID_TILES_DEPTH", "deepest");
      const ScopedKnob itemsKnob("NEIGHBORGRID_TILES_ITEMS", items);
      Engine engine;
      for (int run = 0; run < 2; ++run)
      {
        Request r = baseRequest(cloud, radius, Method::StagedTiles);
        r.operation = Operation::NeighborCount;
        std::vector<std::int32_t> counts(cloud.size(), -7);
        r.neighborCount = counts.data();
        engine.run(r);
        for (std::int64_t i = 0; i < cloud.size(); ++i)
        {
          ASSERT_EQ(counts[i], ref.certain[i]) << "point " << i << ", run " << run;
        }
        r.operation = Operation::Density;
        r.kernel = Kernel::WendlandC2;
        std::vector<float> rho(cloud.size(), -1.0f);
        r.density = rho.data();
        engine.run(r);
        for (std::int64_t i = 0; i < cloud.size(); ++i)
        {
          ASSERT_NEAR(rho[i], rhoRef[i], 1e-5 * rhoRef[i]) << "point " << i << ", run " << run;
        }
      }
    }
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_ITEMS", "tiles");
}

// Staged Tiles stages tiles of cells of R from 1.5 points per occupied cell, and below it each
// point looks up its 27 cells. Both ways forced (NEIGHBORGRID_TILES_STAGING) on a sparse uniform
// cloud (about 0.3 points per cell of R: most staged cells empty), clumps beside uniform points,
// and a face-centred crystal with R on its first shell: exact.
TEST(EngineMethods, StagedTilesStagingIsExact)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const double radius = 0.5;
  expectLoopExactForKnob({ ngtest::makeCloud("uniform", 8000, 15.0, 67), clumpsBesideUniform(71) }, radius,
    "NEIGHBORGRID_TILES_STAGING", { "1 tiles", "1 points" });
  if (HasFatalFailure())
  {
    return;
  }
  expectLoopExactForKnob({ latticeOf("face-centred", 0.25, 10) }, 0.25 * std::sqrt(2.0), "NEIGHBORGRID_TILES_STAGING",
    { "1 tiles", "1 points" });
  if (HasFatalFailure())
  {
    return;
  }
  expectMisspelledKnobRefused("NEIGHBORGRID_TILES_STAGING", "point");
}

// --- Exactness at the cutoff ----------------------------------------------------------------
/// Pairs at distance R and within a few units in the last place of it, far apart from each other,
/// around `origin`, in the caller's type (float or double). Each pair's second point is the first
/// moved by R in a random direction (or along an axis), then nudged by -2..2 ulp per axis: the
/// variants closest to R on either side are kept, so the float distance of every kept pair lies
/// within rounding of R and the double reference decides.
Cloud cutoffPairs(double origin, double radius, bool asFloat, bool planar, std::uint64_t seed)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  Cloud c;
  c.asFloat = asFloat;
  c.dimension = planar ? 2 : 3;
  auto representable = [&](double v) { return asFloat ? double(static_cast<float>(v)) : v; };
  auto nudge = [&](double v, int steps) {
    for (int k = 0; k < std::abs(steps); ++k)
    {
      v = asFloat ? double(std::nextafter(static_cast<float>(v), steps > 0 ? HUGE_VALF : -HUGE_VALF))
                  : std::nextafter(v, steps > 0 ? HUGE_VAL : -HUGE_VAL);
    }
    return v;
  };
  const int pairs = 400;
  for (int k = 0; k < pairs; ++k)
  {
    double p[3] = { representable(origin + 10.0 * radius * k), representable(origin + radius * 0.37 * (k % 7)),
      representable(planar ? origin : origin - radius * 0.53 * (k % 5)) };
    double v[3] = { 1.0, 0.0, 0.0 };
    if (k % 4 != 0) // every fourth pair lies along an axis, the others in random directions
    {
      double norm = 0.0;
      do
      {
        norm = 0.0;
        for (int a = 0; a < 3; ++a)
        {
          v[a] = (planar && a == 2) ? 0.0 : unit(rng);
          norm += v[a] * v[a];
        }
      } while (norm < 1e-3 || norm > 1.0);
      for (double& x : v)
      {
        x /= std::sqrt(norm);
      }
    }
    double q0[3];
    for (int a = 0; a < 3; ++a)
    {
      q0[a] = representable(p[a] + radius * v[a]);
    }
    // The nudged variants closest to R, inside and outside.
    double bestIn[3] = {}, bestOut[3] = {};
    double gapIn = HUGE_VAL, gapOut = HUGE_VAL;
    for (int dx = -2; dx <= 2; ++dx)
    {
      for (int dy = -2; dy <= 2; ++dy)
      {
        for (int dz = planar ? 0 : -2; dz <= (planar ? 0 : 2); ++dz)
        {
          const double q[3] = { nudge(q0[0], dx), nudge(q0[1], dy), nudge(q0[2], dz) };
          const double ddx = p[0] - q[0], ddy = p[1] - q[1], ddz = p[2] - q[2];
          const double r2 = (ddx * ddx + ddy * ddy) + ddz * ddz;
          const double gap = std::abs(r2 - radius * radius);
          double* best = ngtest::within(p, q, radius) ? bestIn : bestOut;
          double& bestGap = ngtest::within(p, q, radius) ? gapIn : gapOut;
          if (gap < bestGap)
          {
            bestGap = gap;
            std::copy(q, q + 3, best);
          }
        }
      }
    }
    const double* q = (k % 2 == 0) ? bestIn : bestOut;
    if ((k % 2 == 0 ? gapIn : gapOut) == HUGE_VAL)
    {
      q = q0;
    }
    c.xyz.insert(c.xyz.end(), p, p + 3);
    c.xyz.insert(c.xyz.end(), q, q + 3);
  }
  ngtest::finishCloud(c, rng);
  return c;
}

TEST(EngineExactness, PairsWithinRoundingOfTheRadiusAreDecidedLikeTheDoubleReference)
{
  struct Case
  {
    double origin;
    double radius;
    bool asFloat;
    bool planar;
  };
  const Case cases[] = { { 0.0, 1.0, true, false }, { 0.0, 0.37, false, false }, { 4.2e6, 3.0, true, false },
    { -1.3e6, 0.8, true, true }, { 6.0e5, 0.01, false, false }, { -3.3e12, 0.25, false, true },
    { 1e-3, 1e-9, false, false }, { 2.5e4, 1.0 / 3.0, true, false } };
  std::int64_t decided = 0;
  for (const Case& k : cases)
  {
    const Cloud cloud = cutoffPairs(k.origin, k.radius, k.asFloat, k.planar, 99);
    const Reference ref(cloud, k.radius);
    std::int64_t expectedPairs = 0;
    for (auto v : ref.certain)
    {
      expectedPairs += v;
    }
    // Both kinds of pair are there: the test means something either way.
    ASSERT_GT(expectedPairs, cloud.size() / 8);
    ASSERT_LT(expectedPairs, cloud.size() - cloud.size() / 8);
    Engine engine;
    for (Method method : particleMethodsFor(Scenario{ "pairs", cloud.size(), 0.0, k.radius, k.asFloat, 0 }))
    {
      SCOPED_TRACE(std::string(toString(method)) + ", origin " + std::to_string(k.origin) + ", R " +
        std::to_string(k.radius) + (k.asFloat ? ", float" : ", double") + (k.planar ? ", 2D" : ", 3D"));
      Request r = baseRequest(cloud, k.radius, method);
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> counts(cloud.size(), -7);
      r.neighborCount = counts.data();
      const Report report = engine.run(r);
      int bad = 0;
      for (std::int64_t i = 0; i < cloud.size(); ++i)
      {
        if (counts[i] != ref.certain[i] && bad++ < 5)
        {
          ADD_FAILURE() << "point " << i << ": count " << counts[i] << ", exact reference " << ref.certain[i];
        }
      }
      decided += report.pairsDecidedInDouble;
      // Density too: the same pairs, the kernel vanishing at R.
      r.operation = Operation::Density;
      r.kernel = Kernel::WendlandC2;
      std::vector<float> rho(cloud.size(), -1.0f);
      r.density = rho.data();
      engine.run(r);
      const auto rhoRef = ref.density(cloud, Kernel::WendlandC2, nullptr, 1.0);
      for (std::int64_t i = 0; i < cloud.size(); ++i)
      {
        ASSERT_NEAR(rho[i], rhoRef[i], 1e-5 * rhoRef[i]) << "point " << i;
      }
    }
  }
  // The band was exercised: pairs this close to R are decided in double (brute force always is).
  EXPECT_GT(decided, 0);
}

TEST(EngineExactness, WithinRadiusIsTheDefinition)
{
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int k = 0; k < 10000; ++k)
  {
    const double a[3] = { u(rng) * 1e6, u(rng), u(rng) };
    const double b[3] = { a[0] + u(rng), a[1] + u(rng), a[2] + u(rng) };
    const double radius = 0.5 + 0.5 * std::abs(u(rng));
    ASSERT_EQ(withinRadius(a, b, radius), ngtest::within(a, b, radius));
  }
}

// Crystals with R on a neighbor shell: every point has a shell of pairs within rounding of R (6, 12
// and 30: simple cubic at R = 2a, face-centred at its nearest distance, simple cubic at R = 5a).
// Every method of the backend counts them exactly and its density matches the double reference.
TEST(EngineExactness, LatticesWithTheRadiusOnAShell)
{
  struct Case
  {
    const char* kind;
    double spacing;
    int side;
    double radius;
    int shell; // pairs of an inner point exactly R apart
  };
  const Case cases[] = { { "simple cubic", 0.25, 16, 0.5, 6 }, { "face-centred", 0.25, 8, 0.25 * std::sqrt(2.0), 12 },
    { "simple cubic", 0.125, 16, 0.625, 30 } };
  for (const Case& k : cases)
  {
    const Cloud cloud = latticeOf(k.kind, k.spacing, k.side);
    const Reference ref(cloud, k.radius);
    const auto rhoRef = ref.density(cloud, Kernel::WendlandC2, cloud.mass.data(), 1.0);
    Engine engine;
    for (Method method : particleMethodsFor(Scenario{ "lattice", cloud.size(), 0.0, k.radius, false, 0 }))
    {
      SCOPED_TRACE(std::string(toString(method)) + ", " + k.kind + " lattice, R = " + std::to_string(k.radius));
      Request r = baseRequest(cloud, k.radius, method);
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> counts(cloud.size(), -7);
      r.neighborCount = counts.data();
      const Report report = engine.run(r);
      // The points decide their shells in double (CLAWS each pair once): the band was met. Brute
      // Force and the Radius Tree decide their own way.
      if (method != Method::BruteForce && method != Method::RadiusTree)
      {
        EXPECT_GE(report.pairsDecidedInDouble, cloud.size() / 4 * k.shell);
      }
      expectCountsAndDensity(engine, r, cloud, ref, rhoRef);
      if (HasFatalFailure())
      {
        return;
      }
    }
  }
}

// --- The grid: occupied cells, not the bounding box ---------------------------------------------
// A lattice of 100^3 points in a cube of side 1e-3 (spacing a = 1e-5) and one point at
// (1e6, 1e6, 1e6), R = 1.05 a: each lattice point has exactly its lattice neighbors along the
// axes (6 inside, fewer on the faces), the far point none. A grid sized from the bounding box put
// every lattice point into one cell (a quadratic search, minutes); cells keyed by occupied cells
// finish this in a fraction of a second.
TEST(EngineGrid, AFarOutlierNextToAMillionPointLattice)
{
  const int side = backendUnderTest == Backend::CUDA ? 100 : 100;
  const double spacing = 1e-5;
  const std::int64_t n = std::int64_t(side) * side * side + 1;
  std::vector<double> xyz(3 * n);
  std::int64_t i = 0;
  for (int z = 0; z < side; ++z)
  {
    for (int y = 0; y < side; ++y)
    {
      for (int x = 0; x < side; ++x, ++i)
      {
        xyz[3 * i] = x * spacing;
        xyz[3 * i + 1] = y * spacing;
        xyz[3 * i + 2] = z * spacing;
      }
    }
  }
  xyz[3 * i] = xyz[3 * i + 1] = xyz[3 * i + 2] = 1e6;
  for (Method method :
    { Method::Auto, Method::CountingSort, Method::RadixSort, Method::FENNS, Method::CLAWS, Method::Bayraktar,
      Method::StagedTiles })
  {
    if (backendUnderTest == Backend::CPU && method != Method::Auto && method != Method::CountingSort)
    {
      continue;
    }
    SCOPED_TRACE(toString(method));
    Request r;
    r.points = Points(xyz.data(), n);
    r.radius = 1.05 * spacing;
    r.backend = backendUnderTest;
    r.method = method;
    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> counts(n, -7);
    r.neighborCount = counts.data();
    Engine engine;
    engine.run(r);
    std::int64_t bad = 0;
    i = 0;
    for (int z = 0; z < side; ++z)
    {
      for (int y = 0; y < side; ++y)
      {
        for (int x = 0; x < side; ++x, ++i)
        {
          const int expected = (x > 0) + (x < side - 1) + (y > 0) + (y < side - 1) + (z > 0) + (z < side - 1);
          if (counts[i] != expected && bad++ < 5)
          {
            ADD_FAILURE() << "lattice point (" << x << ", " << y << ", " << z << "): count " << counts[i]
                          << ", expected " << expected;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(counts[n - 1], 0) << "the far point";
  }
}

// Radii at the ends of the supported range: R = 1e-150 on coordinates of order 1 (keys wider than
// 64 bits; only coincident points are neighbors) and R = 1e140 on coordinates of order 1e140.
TEST(EngineGrid, RadiiAtTheEndsOfTheRange)
{
  for (double scale : { 1e-150, 1e140 })
  {
    Cloud cloud = ngtest::makeCloud("duplicates", 600, 8.0, 21, false);
    if (scale > 1.0)
    {
      for (double& v : cloud.xyz)
      {
        v *= scale;
      }
    }
    const double radius = scale > 1.0 ? 0.9 * scale : scale;
    const Reference ref(cloud, radius);
    Engine engine;
    for (Method method : particleMethodsFor(Scenario{ "range", cloud.size(), 0.0, radius, false, 0 }))
    {
      SCOPED_TRACE(std::string(toString(method)) + ", R " + std::to_string(radius));
      Request r = baseRequest(cloud, radius, method);
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> counts(cloud.size(), -7);
      r.neighborCount = counts.data();
      engine.run(r);
      for (std::int64_t i = 0; i < cloud.size(); ++i)
      {
        ASSERT_EQ(counts[i], ref.certain[i]) << "point " << i;
      }
    }
  }
}

// --- The CUDA backend after errors ----------------------------------------------------------------
// An illegal address ends a CUDA context for good: CUDA's documentation says the process must be
// relaunched to use the GPU again. ParaView keeps running after a failed filter, so the engine
// must say exactly that, and the next run must still work: on the CPU (Backend Auto), or fail
// with that reason (Backend CUDA). NEIGHBORGRID_TEST_CUDA_FAULT injects the error after the sort.
// This test ends the process's use of the GPU: CTest runs it on its own (Kernels.CUDA.ContextLoss).
TEST(EngineCudaContextLoss, AfterAStickyErrorTheNextRunsSayWhyAndRunOnTheCpu)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "CUDA only";
  }
  Cloud cloud = ngtest::makeCloud("uniform", 3000, 8.0, 31);
  const Reference ref(cloud, 0.7);
  Engine engine;
  Request r = baseRequest(cloud, 0.7, Method::Auto);
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> counts(cloud.size(), -7);
  r.neighborCount = counts.data();
  engine.run(r); // a working context with buffers in it
  setenv("NEIGHBORGRID_TEST_CUDA_FAULT", "1", 1);
  try
  {
    engine.run(r);
    ADD_FAILURE() << "the injected fault went unnoticed";
  }
  catch (const Error& e)
  {
    const std::string what = e.what();
    EXPECT_NE(what.find("restart the application"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorIllegalAddress"), std::string::npos) << what;
  }
  unsetenv("NEIGHBORGRID_TEST_CUDA_FAULT");

  std::string why;
  EXPECT_FALSE(Engine::cudaAvailable(&why));
  EXPECT_NE(why.find("restart the application"), std::string::npos) << why;
  // Auto: the CPU, saying why; exact results.
  r.backend = Backend::Auto;
  std::fill(counts.begin(), counts.end(), -7);
  const Report report = engine.run(r);
  EXPECT_EQ(report.backend, Backend::CPU);
  EXPECT_NE(report.backendReason.find("restart the application"), std::string::npos) << report.backendReason;
  for (std::int64_t i = 0; i < cloud.size(); ++i)
  {
    ASSERT_EQ(counts[i], ref.certain[i]) << "point " << i;
  }
  // CUDA: a clear error, outputs untouched.
  r.backend = Backend::CUDA;
  std::fill(counts.begin(), counts.end(), -7);
  try
  {
    engine.run(r);
    ADD_FAILURE() << "ran on a lost CUDA context";
  }
  catch (const Error& e)
  {
    EXPECT_NE(std::string(e.what()).find("restart the application"), std::string::npos) << e.what();
  }
  for (auto v : counts)
  {
    ASSERT_EQ(v, -7);
  }
  // A new engine in the same process is no different.
  Engine another;
  r.backend = Backend::Auto;
  EXPECT_EQ(another.run(r).backend, Backend::CPU);
}

// Auto on sparse data (below a point per cell of R, from 1.5M points on): Radix Sort where its
// cells are looked up in an identity table (the key's bits fit its slots), CLAWS where the bits
// round up past it (CudaBackend.cu, chooseMethod; RESULTS.md "Auto: Radix Sort on sparse data
// with an identity table"). Both give the counts CLAWS gives by name.
TEST(EngineReport, AutoOnSparseDataTakesRadixSortWhereItsTableIsAnIdentity)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Auto's rule for the GPU's methods";
  }
  const std::int64_t n = 1572864; // 0.75 points per cell of R in 128^3 cells of R
  for (const double cellsPerAxis : { 128.0, 129.0 })
  {
    SCOPED_TRACE("box of " + std::to_string(cellsPerAxis) + " R");
    // 128 cells an axis: 7 bits, 21 in all, an identity table; 129: 8 bits, 24, hashed.
    const Method expected = cellsPerAxis == 128.0 ? Method::RadixSort : Method::CLAWS;
    Cloud cloud = ngtest::makeCloud("uniform", n, cellsPerAxis, 41);
    std::vector<std::int32_t> counts(n, -7), clawsCounts(n, -8);
    Request r = baseRequest(cloud, 1.0, Method::Auto);
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts.data();
    Engine engine;
    EXPECT_EQ(engine.run(r).method, expected);
    r.method = Method::CLAWS;
    r.neighborCount = clawsCounts.data();
    EXPECT_EQ(engine.run(r).method, Method::CLAWS);
    EXPECT_EQ(counts, clawsCounts);
  }
}

TEST(EngineReport, SaysWhatRanAndWhy)
{
  Cloud cloud = ngtest::makeCloud("uniform", 1000, 5.0, 12);
  std::vector<float> rho(1000);
  Request r = baseRequest(cloud, 0.6, Method::Auto);
  r.backend = Backend::Auto;
  r.density = rho.data();
  Engine engine;
  const Report report = engine.run(r);
  EXPECT_NE(report.method, Method::Auto);
  EXPECT_FALSE(report.device.empty());
  EXPECT_NE(report.backendReason.find("Auto"), std::string::npos);
  std::string why;
  EXPECT_EQ(report.backend, Engine::cudaAvailable(&why) ? Backend::CUDA : Backend::CPU) << why;
  bool hasSearch = false;
  for (const auto& s : report.stages)
  {
    hasSearch = hasSearch || s.stage == "search";
    EXPECT_GE(s.milliseconds, 0.0);
  }
  EXPECT_TRUE(hasSearch);
}

// The CUDA backend times runs of 2^18 points and more on a stream of its own and smaller ones on
// the run's stream (CudaBackend::stamp): one engine switching between them reports stage times
// that are finite, positive and within the host's wait for the run.
TEST(EngineReport, StageTimesHoldWhereRunsSwitchClocks)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "the stage clocks are the CUDA backend's";
  }
  Engine engine;
  for (std::int64_t n : { 300000, 2000, 300000, 2000 })
  {
    Cloud cloud = ngtest::makeCloud("uniform", n, n > 100000 ? 30.0 : 6.0, 7);
    std::vector<std::int32_t> counts(n, -1);
    Request r = baseRequest(cloud, 0.8, Method::Auto);
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts.data();
    const auto began = std::chrono::steady_clock::now();
    const Report report = engine.run(r);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    double sortAndSearch = 0.0;
    int found = 0;
    for (const auto& s : report.stages)
    {
      EXPECT_TRUE(std::isfinite(s.milliseconds)) << s.stage << " at " << n << " points";
      if (s.stage == "sort" || s.stage == "search")
      {
        EXPECT_GT(s.milliseconds, 0.0) << s.stage << " at " << n << " points";
        sortAndSearch += s.milliseconds;
        ++found;
      }
    }
    EXPECT_EQ(found, 2) << n << " points";
    EXPECT_LE(sortAndSearch, wall) << n << " points";
    EXPECT_EQ(std::count(counts.begin(), counts.end(), -1), 0) << n << " points";
  }
}

TEST(EngineReuse, BuffersAreReusedAcrossDifferentSizes)
{
  Engine engine;
  for (std::int64_t n : { 5000, 300, 7000, 300 })
  {
    Cloud cloud = ngtest::makeCloud("uniform", n, 6.0, 100 + n);
    Reference ref(cloud, 0.7);
    std::vector<std::int32_t> counts(n, -7);
    Request r = baseRequest(cloud, 0.7, Method::CountingSort);
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts.data();
    engine.run(r);
    for (std::int64_t i = 0; i < n; ++i)
    {
      ASSERT_EQ(counts[i], ref.certain[i]) << "n = " << n << ", point " << i;
    }
  }
}

// --- Separate queries (Request::source): results at other points ------------------------------
/// Queries and their double-precision reference against a source cloud: counts (no self
/// exclusion), density, Shepard and SPH smoothing (rho_j at the sources from the sources), and
/// whether any source lies within R.
struct QueryCase
{
  std::string name;
  Cloud source;
  double radius = 1.0;
  bool grid = false;
  QueryGrid queryGrid;
  std::vector<double> xyz;     // the queries as the reference sees them
  std::vector<float> xyzFloat; // as the engine gets them when asFloat
  bool asFloat = false;

  std::int64_t count() const { return grid ? queryGrid.count() : std::int64_t(xyz.size() / 3); }
  void query(std::int64_t q, double x[3]) const
  {
    if (grid)
    {
      const std::int64_t ijk[3] = { q % queryGrid.dimensions[0], (q / queryGrid.dimensions[0]) % queryGrid.dimensions[1],
        q / (queryGrid.dimensions[0] * queryGrid.dimensions[1]) };
      for (int a = 0; a < 3; ++a)
      {
        x[a] = queryGrid.origin[a] + double(ijk[a]) * queryGrid.spacing[a];
      }
    }
    else
    {
      std::copy(xyz.begin() + 3 * q, xyz.begin() + 3 * q + 3, x);
    }
  }
  void setQueries(Request& r) const
  {
    r.source = source.points();
    if (grid)
    {
      r.queryGrid = queryGrid;
    }
    else
    {
      r.points = asFloat ? Points(xyzFloat.data(), count()) : Points(xyz.data(), count());
    }
  }
};

struct QueryReference
{
  std::vector<std::int32_t> count;
  std::vector<std::vector<std::int32_t>> neighbors;
  std::vector<std::vector<double>> distance;

  QueryReference(const QueryCase& c)
  {
    const std::int64_t m = c.count(), n = c.source.size();
    count.assign(m, 0);
    neighbors.resize(m);
    distance.resize(m);
    for (std::int64_t q = 0; q < m; ++q)
    {
      double x[3];
      c.query(q, x);
      for (std::int64_t j = 0; j < n; ++j)
      {
        const double* y = &c.source.xyz[3 * j];
        if (withinRadius(x, y, c.radius))
        {
          const double dx = x[0] - y[0], dy = x[1] - y[1], dz = x[2] - y[2];
          neighbors[q].push_back(static_cast<std::int32_t>(j));
          distance[q].push_back(std::min(c.radius, std::sqrt(dx * dx + dy * dy + dz * dz)));
          ++count[q];
        }
      }
    }
  }
  std::vector<double> density(const QueryCase& c, Kernel k) const
  {
    std::vector<double> rho(count.size(), 0.0);
    for (std::size_t q = 0; q < count.size(); ++q)
    {
      for (std::size_t p = 0; p < neighbors[q].size(); ++p)
      {
        rho[q] += double(c.source.mass[neighbors[q][p]]) * kernelValue(k, c.source.dimension, c.radius, distance[q][p]);
      }
    }
    return rho;
  }
  /// The scale of a query density's float rounding: sum_j m_j W(0). Unlike a particle's own
  /// density, a query's may consist of a few terms near the kernel's cutoff, tiny next to the
  /// rounding of W there (about 1e-7 W(0) per term).
  std::vector<double> densityScale(const QueryCase& c, Kernel k) const
  {
    std::vector<double> scale(count.size(), 1e-30);
    const double center = kernelValue(k, c.source.dimension, c.radius, 0.0);
    for (std::size_t q = 0; q < count.size(); ++q)
    {
      for (std::int32_t j : neighbors[q])
      {
        scale[q] += double(c.source.mass[j]) * center;
      }
    }
    return scale;
  }
  /// Smoothed values (NaN where the query has no neighbor: the null value) and their magnitude.
  /// With `magnitude`: the scale of the float rounding, the same sum over |f_j|, with every W at
  /// W(0) for SPH (see densityScale) and W + 1e-2 W(0) over the sum of W for Shepard: the float
  /// value of W near the cutoff is off by about 1e-7 W(0), which matters where all of a query's
  /// neighbors lie near R and their weights are tiny.
  std::vector<double> smooth(const QueryCase& c, Kernel k, const std::vector<float>& values, int components,
    bool shepard, bool magnitude = false) const
  {
    const double center = kernelValue(k, c.source.dimension, c.radius, 0.0);
    std::vector<double> sourceDensity;
    if (!shepard)
    {
      sourceDensity = Reference(c.source, c.radius).density(c.source, k, c.source.mass.data(), 1.0);
    }
    std::vector<double> out(count.size() * components, 0.0);
    for (std::size_t q = 0; q < count.size(); ++q)
    {
      double weight = 0;
      for (std::size_t p = 0; p < neighbors[q].size(); ++p)
      {
        const std::int32_t j = neighbors[q][p];
        const double w = kernelValue(k, c.source.dimension, c.radius, distance[q][p]);
        const double scaled = !magnitude ? w : (shepard ? w + 1e-2 * center : center);
        const double factor = shepard ? scaled : scaled * double(c.source.mass[j]) / sourceDensity[j];
        weight += w;
        for (int comp = 0; comp < components; ++comp)
        {
          const double v = values[j * components + comp];
          out[q * components + comp] += factor * (magnitude ? std::abs(v) : v);
        }
      }
      for (int comp = 0; comp < components; ++comp)
      {
        double& v = out[q * components + comp];
        if (count[q] == 0 || (shepard && !(weight > 0)))
        {
          v = std::nan("");
        }
        else if (shepard)
        {
          v /= weight;
        }
      }
    }
    return out;
  }
};

/// Like expectClose, with NaN in the reference meaning "the null value".
void expectCloseOrNull(const std::vector<float>& got, const std::vector<double>& want, float nullValue,
  const char* what, const std::vector<double>* magnitude = nullptr)
{
  std::vector<float> kept;
  std::vector<double> keptWant, keptMagnitude;
  int bad = 0;
  for (std::size_t k = 0; k < want.size(); ++k)
  {
    if (std::isnan(want[k]))
    {
      if (got[k] != nullValue && bad++ < 5)
      {
        ADD_FAILURE() << what << " entry " << k << ": no neighbor, expected the null value " << nullValue << ", got "
                      << got[k];
      }
      continue;
    }
    kept.push_back(got[k]);
    keptWant.push_back(want[k]);
    if (magnitude)
    {
      keptMagnitude.push_back((*magnitude)[k]);
    }
  }
  EXPECT_EQ(bad, 0);
  expectClose(kept, keptWant, what, magnitude ? &keptMagnitude : nullptr);
}

QueryCase makeQueryCase(const std::string& name)
{
  QueryCase c;
  c.name = name;
  std::mt19937_64 rng(777);
  auto randomQueries = [&](std::int64_t m, double lo, double hi, bool planar) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (std::int64_t q = 0; q < m; ++q)
    {
      c.xyz.push_back(u(rng));
      c.xyz.push_back(u(rng));
      c.xyz.push_back(planar ? 0.0 : u(rng));
    }
  };
  if (name == "points")
  {
    // Queries inside, around and far outside the particles (empty regions, a far probe).
    c.source = ngtest::makeCloud("uniform", 3000, 8.0, 41);
    c.radius = 0.9;
    randomQueries(1500, -2.0, 10.0, false);
    for (double far : { 1e3, -5e6, 1e12 })
    {
      c.xyz.insert(c.xyz.end(), { far, 1.0, 2.0 });
    }
    c.asFloat = true;
  }
  else if (name == "grid")
  {
    c.source = ngtest::makeCloud("clustered", 4000, 10.0, 42);
    c.radius = 0.8;
    c.grid = true;
    c.queryGrid.origin[0] = -1.3, c.queryGrid.origin[1] = -0.7, c.queryGrid.origin[2] = 0.25;
    c.queryGrid.spacing[0] = 0.37, c.queryGrid.spacing[1] = 0.41, c.queryGrid.spacing[2] = 0.6;
    c.queryGrid.dimensions[0] = 33, c.queryGrid.dimensions[1] = 31, c.queryGrid.dimensions[2] = 17;
  }
  else if (name == "denseGrid")
  {
    // Grid queries by bricks (Queries.cuh) with more particles near a brick than it stages at
    // once (several rounds), partial bricks, and a grid running backwards along y.
    c.source = ngtest::makeCloud("clustered", 10000, 2.5, 46);
    c.radius = 0.5;
    c.grid = true;
    c.queryGrid.origin[0] = -0.2, c.queryGrid.origin[1] = 2.3, c.queryGrid.origin[2] = 0.1;
    c.queryGrid.spacing[0] = 0.083, c.queryGrid.spacing[1] = -0.09, c.queryGrid.spacing[2] = 0.11;
    c.queryGrid.dimensions[0] = 25, c.queryGrid.dimensions[1] = 23, c.queryGrid.dimensions[2] = 13;
  }
  else if (name == "coarseGrid")
  {
    // A grid far coarser than R: bricks reach too many cells and gather point by point.
    c.source = ngtest::makeCloud("uniform", 3000, 20.0, 47);
    c.radius = 0.3;
    c.grid = true;
    c.queryGrid.origin[0] = -0.5, c.queryGrid.origin[1] = 0.2, c.queryGrid.origin[2] = 0.1;
    c.queryGrid.spacing[0] = 2.5, c.queryGrid.spacing[1] = 2.3, c.queryGrid.spacing[2] = 0.15;
    c.queryGrid.dimensions[0] = 9, c.queryGrid.dimensions[1] = 10, c.queryGrid.dimensions[2] = 13;
  }
  else if (name == "line")
  {
    // A line through a dense stack, in double: many queries on cell boundaries.
    c.source = ngtest::makeCloud("stacked", 3000, 4.0, 43);
    c.radius = 0.6;
    for (int k = 0; k <= 400; ++k)
    {
      const double t = k / 400.0;
      c.xyz.insert(c.xyz.end(), { -1.0 + 6.0 * t, 0.5 + 3.0 * t, 2.0 - t });
    }
  }
  else if (name == "outliers")
  {
    // Sources with far outliers (keys wider than 64 bits) and queries at some of them.
    c.source = ngtest::makeCloud("outliers", 3000, 8.0, 44, false);
    c.radius = 0.8;
    randomQueries(800, -1.0, 9.0, false);
    for (std::int64_t j = c.source.size() - 12; j < c.source.size(); ++j)
    {
      c.xyz.insert(c.xyz.end(), c.source.xyz.begin() + 3 * j, c.source.xyz.begin() + 3 * j + 3);
    }
  }
  else // "planar": a 2D cloud and queries in its plane
  {
    c.source = ngtest::makeCloud("planar", 3000, 10.0, 45);
    c.radius = 0.7;
    randomQueries(1200, -1.0, 11.0, true);
    c.asFloat = true;
  }
  c.xyzFloat.assign(c.xyz.begin(), c.xyz.end());
  if (c.asFloat)
  {
    c.xyz.assign(c.xyzFloat.begin(), c.xyzFloat.end());
  }
  return c;
}

class EngineQueries : public testing::TestWithParam<std::string>
{
};

TEST_P(EngineQueries, EveryOperationMatchesDoubleBruteForce)
{
  const QueryCase c = makeQueryCase(GetParam());
  const QueryReference ref(c);
  const std::int64_t m = c.count();
  std::int64_t empty = 0;
  for (auto v : ref.count)
  {
    empty += v == 0;
  }
  RecordProperty("queries_without_neighbors", std::to_string(empty));
  Scenario scenario{ c.name, c.source.size(), 0.0, c.radius, true, 0 };
  Engine engine;
  const float nullValue = -123.5f;
  for (Method method : methodsFor(scenario))
  {
    SCOPED_TRACE(std::string(c.name) + ", " + toString(method));
    Request base;
    base.radius = c.radius;
    base.backend = backendUnderTest;
    base.method = method;
    base.dimension = c.source.dimension;
    base.nullValue = nullValue;
    c.setQueries(base);

    // Neighbor Count, and the valid mask.
    {
      Request r = base;
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> counts(m, -7);
      std::vector<std::uint8_t> valid(m, 7);
      r.neighborCount = counts.data();
      r.valid = valid.data();
      const Report report = engine.run(r);
      int bad = 0;
      std::int64_t total = 0;
      for (std::int64_t q = 0; q < m; ++q)
      {
        total += ref.count[q];
        if ((counts[q] != ref.count[q] || valid[q] != (ref.count[q] > 0 ? 1 : 0)) && bad++ < 5)
        {
          ADD_FAILURE() << "query " << q << ": count " << counts[q] << " valid " << int(valid[q]) << ", reference "
                        << ref.count[q];
        }
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(report.neighborPairs, total);
    }
    // Density, every kernel.
    for (Kernel kernel : { Kernel::CubicSpline, Kernel::QuarticSpline, Kernel::QuinticSpline, Kernel::WendlandC2 })
    {
      SCOPED_TRACE(toString(kernel));
      Request r = base;
      r.operation = Operation::Density;
      r.kernel = kernel;
      r.mass = c.source.mass.data();
      std::vector<float> rho(m, -1.0f);
      r.density = rho.data();
      engine.run(r);
      const auto want = ref.density(c, kernel);
      const auto magnitude = ref.densityScale(c, kernel);
      for (std::int64_t q = 0; q < m; ++q)
      {
        if (ref.count[q] == 0)
        {
          EXPECT_EQ(rho[q], 0.0f) << "query " << q << " has no neighbor";
        }
      }
      expectClose(rho, want, "query density", &magnitude);
    }
    // Smoothing, Shepard and SPH.
    for (Normalization normalization : { Normalization::Shepard, Normalization::SPH })
    {
      const Kernel kernel = normalization == Normalization::Shepard ? Kernel::CubicSpline : Kernel::WendlandC2;
      const bool shepard = normalization == Normalization::Shepard;
      SCOPED_TRACE(toString(normalization));
      Request r = base;
      r.operation = Operation::Smoothing;
      r.kernel = kernel;
      r.normalization = normalization;
      r.mass = c.source.mass.data();
      std::vector<float> scalar(m, -1.0f), vector(3 * m, -1.0f), rho(m, -1.0f);
      std::vector<std::uint8_t> valid(m, 7);
      r.smoothed = { { c.source.scalar.data(), 1, scalar.data(), "scalar" },
        { c.source.vector3.data(), 3, vector.data(), "vector" } };
      r.valid = valid.data();
      if (!shepard)
      {
        r.density = rho.data();
      }
      engine.run(r);
      const auto scalarMagnitude = ref.smooth(c, kernel, c.source.scalar, 1, shepard, true);
      expectCloseOrNull(
        scalar, ref.smooth(c, kernel, c.source.scalar, 1, shepard), nullValue, "smoothed scalar", &scalarMagnitude);
      const auto vectorMagnitude = ref.smooth(c, kernel, c.source.vector3, 3, shepard, true);
      expectCloseOrNull(
        vector, ref.smooth(c, kernel, c.source.vector3, 3, shepard), nullValue, "smoothed vector", &vectorMagnitude);
      for (std::int64_t q = 0; q < m; ++q)
      {
        ASSERT_EQ(valid[q], ref.count[q] > 0 ? 1 : 0) << "query " << q;
      }
      if (!shepard)
      {
        const auto magnitude = ref.densityScale(c, kernel);
        expectClose(rho, ref.density(c, kernel), "query density of SPH smoothing", &magnitude);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, EngineQueries, testing::Values("points", "grid", "denseGrid", "coarseGrid", "line", "outliers", "planar"));

TEST_F(EngineErrors, RejectsBadQueries)
{
  std::vector<double> queries = { 0.5, 0.5, 0.5, 1.0, std::nan(""), 1.0 };
  Request r = request();
  r.source = cloud.points();
  r.points = Points(queries.data(), 2);
  expectError(r, "query point 1");

  r.points = Points(queries.data(), 0);
  expectError(r, "no query points");

  r.points = Points();
  r.queryGrid.dimensions[0] = 4;
  r.queryGrid.dimensions[1] = 0;
  r.queryGrid.dimensions[2] = 2;
  expectError(r, "query grid");

  r.queryGrid.dimensions[1] = 3;
  r.queryGrid.spacing[2] = HUGE_VAL;
  expectError(r, "finite");

  r.queryGrid.spacing[2] = 1.0;
  r.points = Points(queries.data(), 1);
  expectError(r, "not both");

  Request single = request();
  std::vector<std::uint8_t> valid(100);
  single.valid = valid.data();
  expectError(single, "separate source");
}

// Periodic boxes (Request::periodic) against a double brute force over every image.
struct PeriodicCase
{
  std::string name;
  Cloud particles;
  bool periodic[3] = { true, true, true };
  double origin[3] = { 0, 0, 0 };
  double lengths[3] = { 1, 1, 1 };
  double radius = 1.0;
};

/// The documented wrap: kept when inside [o, o + L), else x - L floor((x - o) / L), in double.
double wrapReference(double x, double o, double L)
{
  if (x >= o && x < o + L)
  {
    return x;
  }
  double w = x - L * std::floor((x - o) / L);
  if (w >= o + L)
  {
    w -= L;
  }
  return w < o ? o : w;
}

PeriodicCase makePeriodicCase(const std::string& name)
{
  PeriodicCase c;
  c.name = name;
  auto unwrapSome = [&](double scale) {
    // Every seventh point moved by whole box lengths (an unwrapped trajectory).
    for (std::int64_t i = 0; i < c.particles.size(); i += 7)
    {
      for (int a = 0; a < 3; ++a)
      {
        if (c.periodic[a])
        {
          c.particles.xyz[3 * i + a] += scale * c.lengths[a] * double(int(i % 5) - 2);
        }
      }
    }
    c.particles.xyzFloat.assign(c.particles.xyz.begin(), c.particles.xyz.end());
    if (c.particles.asFloat)
    {
      c.particles.xyz.assign(c.particles.xyzFloat.begin(), c.particles.xyzFloat.end());
    }
  };
  if (name == "small")
  {
    // R well below half the box; points on the faces and outside it.
    c.particles = ngtest::makeCloud("uniform", 2500, 10.0, 51, false);
    c.lengths[0] = c.lengths[1] = c.lengths[2] = 10.0;
    c.radius = 1.3;
    c.particles.xyz[0] = 0.0, c.particles.xyz[1] = 10.0, c.particles.xyz[2] = 9.999999;
    unwrapSome(1.0);
  }
  else if (name == "large")
  {
    // R above half of every box length: several images of one point are neighbors.
    c.particles = ngtest::makeCloud("clustered", 300, 3.0, 52, false);
    c.origin[0] = -1.0, c.origin[1] = 0.5, c.origin[2] = 2.0;
    c.lengths[0] = 3.0, c.lengths[1] = 4.0, c.lengths[2] = 5.0;
    c.radius = 2.7;
    for (std::int64_t i = 0; i < c.particles.size(); ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.particles.xyz[3 * i + a] += c.origin[a];
      }
    }
    unwrapSome(3.0);
  }
  else if (name == "oneAxis")
  {
    // Periodic along y only, float coordinates.
    c.particles = ngtest::makeCloud("uniform", 2000, 6.0, 53, true);
    c.periodic[0] = c.periodic[2] = false;
    c.lengths[1] = 6.0;
    c.radius = 0.9;
    unwrapSome(1.0);
  }
  else // "planar": 2D, periodic in x and y
  {
    c.particles = ngtest::makeCloud("planar", 2000, 8.0, 54, true);
    c.periodic[2] = false;
    c.lengths[0] = c.lengths[1] = 8.0;
    c.radius = 1.1;
    unwrapSome(2.0);
  }
  return c;
}

/// Neighbors of wrapped query points among every image of the wrapped particles.
struct PeriodicReference
{
  std::vector<std::vector<std::int32_t>> neighbors;
  std::vector<std::vector<double>> distance;

  PeriodicReference(const PeriodicCase& c, const std::vector<double>& queries, bool wrapQueries)
  {
    const std::int64_t n = c.particles.size(), m = static_cast<std::int64_t>(queries.size() / 3);
    std::vector<double> w(3 * n);
    for (std::int64_t j = 0; j < n; ++j)
    {
      for (int a = 0; a < 3; ++a)
      {
        const double x = c.particles.xyz[3 * j + a];
        w[3 * j + a] = c.periodic[a] ? wrapReference(x, c.origin[a], c.lengths[a]) : x;
      }
    }
    int reach[3];
    for (int a = 0; a < 3; ++a)
    {
      reach[a] = c.periodic[a] ? int(std::ceil(c.radius / c.lengths[a])) + 1 : 0;
    }
    neighbors.resize(m);
    distance.resize(m);
    for (std::int64_t q = 0; q < m; ++q)
    {
      double x[3];
      for (int a = 0; a < 3; ++a)
      {
        x[a] = queries[3 * q + a];
        if (wrapQueries && c.periodic[a])
        {
          x[a] = wrapReference(x[a], c.origin[a], c.lengths[a]);
        }
      }
      for (std::int64_t j = 0; j < n; ++j)
      {
        for (int kz = -reach[2]; kz <= reach[2]; ++kz)
        {
          for (int ky = -reach[1]; ky <= reach[1]; ++ky)
          {
            for (int kx = -reach[0]; kx <= reach[0]; ++kx)
            {
              const int k[3] = { kx, ky, kz };
              double y[3];
              for (int a = 0; a < 3; ++a)
              {
                y[a] = k[a] == 0 ? w[3 * j + a] : w[3 * j + a] + double(k[a]) * c.lengths[a];
              }
              if (neighborgrid::withinRadius(x, y, c.radius))
              {
                const double dx = x[0] - y[0], dy = x[1] - y[1], dz = x[2] - y[2];
                neighbors[q].push_back(static_cast<std::int32_t>(j));
                distance[q].push_back(std::min(c.radius, std::sqrt(dx * dx + dy * dy + dz * dz)));
              }
            }
          }
        }
      }
    }
  }
  std::vector<double> density(const PeriodicCase& c, Kernel k, std::vector<double>* scale = nullptr) const
  {
    std::vector<double> rho(neighbors.size(), 0.0);
    if (scale)
    {
      scale->assign(neighbors.size(), 1e-30);
    }
    for (std::size_t q = 0; q < neighbors.size(); ++q)
    {
      for (std::size_t p = 0; p < neighbors[q].size(); ++p)
      {
        const double m = c.particles.mass[neighbors[q][p]];
        rho[q] += m * kernelValue(k, c.particles.dimension, c.radius, distance[q][p]);
        if (scale)
        {
          (*scale)[q] += m * kernelValue(k, c.particles.dimension, c.radius, 0.0);
        }
      }
    }
    return rho;
  }
  /// Shepard (rhoSource empty) or SPH smoothing of a 3-component array, and its rounding scale.
  std::vector<double> smooth(const PeriodicCase& c, Kernel k, const std::vector<double>& rhoSource,
    std::vector<double>& scale) const
  {
    const bool shepard = rhoSource.empty();
    const double center = kernelValue(k, c.particles.dimension, c.radius, 0.0);
    std::vector<double> out(3 * neighbors.size(), 0.0);
    scale.assign(out.size(), 1e-30);
    for (std::size_t q = 0; q < neighbors.size(); ++q)
    {
      double weight = 0;
      for (std::size_t p = 0; p < neighbors[q].size(); ++p)
      {
        const std::int32_t j = neighbors[q][p];
        const double wq = kernelValue(k, c.particles.dimension, c.radius, distance[q][p]);
        const double factor = shepard ? wq : wq * c.particles.mass[j] / rhoSource[j];
        const double bound = shepard ? wq + 1e-2 * center : center * c.particles.mass[j] / rhoSource[j];
        weight += wq;
        for (int a = 0; a < 3; ++a)
        {
          const double v = c.particles.vector3[3 * j + a];
          out[3 * q + a] += factor * v;
          scale[3 * q + a] += bound * std::abs(v);
        }
      }
      for (int a = 0; a < 3 && shepard; ++a)
      {
        out[3 * q + a] /= weight;
        scale[3 * q + a] /= weight;
      }
    }
    return out;
  }
};

/// A request over the case's particles in its periodic box.
Request periodicRequest(const PeriodicCase& c, Method method)
{
  Request r;
  r.radius = c.radius;
  r.backend = backendUnderTest;
  r.method = method;
  r.dimension = c.particles.dimension;
  r.points = c.particles.points();
  for (int a = 0; a < 3; ++a)
  {
    r.periodic[a] = c.periodic[a];
    r.boxOrigin[a] = c.origin[a];
    r.boxLengths[a] = c.lengths[a];
  }
  return r;
}

/// Neighbor Count of request r over the periodic particles: every image within R, the point itself
/// excluded, exactly as the reference's.
void expectCountsOverImages(Engine& engine, Request r, const PeriodicReference& ref)
{
  const std::int64_t n = static_cast<std::int64_t>(ref.neighbors.size());
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> counts(n, -7);
  r.neighborCount = counts.data();
  EXPECT_GT(engine.run(r).periodicImages, 0);
  int bad = 0;
  for (std::int64_t i = 0; i < n; ++i)
  {
    const auto want = static_cast<std::int32_t>(ref.neighbors[i].size()) - 1;
    if (counts[i] != want && bad++ < 5)
    {
      ADD_FAILURE() << "point " << i << ": count " << counts[i] << ", reference " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

class EnginePeriodic : public testing::TestWithParam<std::string>
{
};

TEST_P(EnginePeriodic, EveryOperationMatchesDoubleBruteForceOverImages)
{
  const PeriodicCase c = makePeriodicCase(GetParam());
  const std::int64_t n = c.particles.size();
  const PeriodicReference ref(c, c.particles.xyz, true);
  // A probe: points inside and outside the box, against the same particles.
  std::vector<double> probe;
  for (int k = 0; k < 300; ++k)
  {
    for (int a = 0; a < 3; ++a)
    {
      const double t = std::fmod(0.6180339887 * (k + 1) * (a + 1.7), 1.0);
      probe.push_back(c.periodic[a] ? c.origin[a] + (3.0 * t - 1.0) * c.lengths[a] : c.particles.xyz[3 * (k % n) + a]);
    }
  }
  const PeriodicReference probeRef(c, probe, true);
  Scenario scenario{ c.name, n, 0.0, c.radius, true, 0 };
  Engine engine;
  std::int64_t multiple = 0;
  for (std::size_t i = 0; i < ref.neighbors.size(); ++i)
  {
    std::vector<std::int32_t> sorted = ref.neighbors[i];
    std::sort(sorted.begin(), sorted.end());
    multiple += std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
  }
  RecordProperty("points_with_a_neighbor_twice", std::to_string(multiple));
  if (c.name == "large")
  {
    EXPECT_GT(multiple, 0) << "R above half the box must give some point several images of one neighbor";
  }
  std::vector<double> rhoSource = ref.density(c, Kernel::CubicSpline);
  for (Method method : methodsFor(scenario))
  {
    SCOPED_TRACE(c.name + ", " + toString(method));
    const Request base = periodicRequest(c, method);
    const std::vector<double> inputBefore = c.particles.xyz;

    expectCountsOverImages(engine, base, ref);
    // Density, every kernel.
    for (Kernel kernel : { Kernel::CubicSpline, Kernel::QuarticSpline, Kernel::QuinticSpline, Kernel::WendlandC2 })
    {
      SCOPED_TRACE(toString(kernel));
      Request r = base;
      r.operation = Operation::Density;
      r.kernel = kernel;
      r.mass = c.particles.mass.data();
      std::vector<float> rho(n, -1.0f);
      r.density = rho.data();
      engine.run(r);
      expectClose(rho, ref.density(c, kernel), "periodic density");
    }
    // Smoothing, Shepard and SPH, a 3-component signed array.
    for (Normalization normalization : { Normalization::Shepard, Normalization::SPH })
    {
      SCOPED_TRACE(normalization == Normalization::SPH ? "SPH" : "Shepard");
      Request r = base;
      r.operation = Operation::Smoothing;
      r.normalization = normalization;
      r.mass = c.particles.mass.data();
      std::vector<float> out(3 * n, -1.0f), rho(n, -1.0f);
      r.smoothed.push_back({ c.particles.vector3.data(), 3, out.data(), "vector" });
      if (normalization == Normalization::SPH)
      {
        r.density = rho.data();
      }
      engine.run(r);
      std::vector<double> scale;
      const auto want = ref.smooth(c, Kernel::CubicSpline,
        normalization == Normalization::SPH ? rhoSource : std::vector<double>(), scale);
      expectClose(out, want, "periodic smoothing", &scale);
      if (normalization == Normalization::SPH)
      {
        expectClose(rho, rhoSource, "periodic density with SPH smoothing");
      }
    }
    // A probe of the periodic particles: count (the particles themselves are not excluded) and
    // density.
    {
      Request r = base;
      r.source = base.points;
      r.points = Points(probe.data(), static_cast<std::int64_t>(probe.size() / 3));
      r.operation = Operation::Density;
      r.mass = c.particles.mass.data();
      std::vector<float> rho(probe.size() / 3, -1.0f);
      std::vector<std::uint8_t> valid(probe.size() / 3, 7);
      r.density = rho.data();
      r.valid = valid.data();
      engine.run(r);
      std::vector<double> scale;
      const auto want = probeRef.density(c, Kernel::CubicSpline, &scale);
      expectClose(rho, want, "periodic probe density", &scale);
      for (std::size_t q = 0; q < valid.size(); ++q)
      {
        EXPECT_EQ(valid[q], probeRef.neighbors[q].empty() ? 0 : 1) << "probe point " << q;
      }
    }
    EXPECT_EQ(c.particles.xyz, inputBefore) << "the input coordinates changed";
  }
}

INSTANTIATE_TEST_SUITE_P(Boxes, EnginePeriodic, testing::Values("small", "large", "oneAxis", "planar"));

/// Staged Tiles over case c, once for each variant "reach shell" (NEIGHBORGRID_TILES_REACH and
/// NEIGHBORGRID_TILES_SHELL): counts exact, and density of one mass for every point (the cubic and
/// the quintic spline: the half shell's fixed point) within 1e-5 of a double brute force over the
/// images.
void expectStagedTilesOverImages(PeriodicCase c, std::initializer_list<const char*> variants)
{
  std::fill(c.particles.mass.begin(), c.particles.mass.end(), LoopReference::oneMass);
  const PeriodicReference ref(c, c.particles.xyz, true);
  const std::int64_t n = c.particles.size();
  for (const char* variant : variants)
  {
    const std::string reach(variant, 1), shell(variant + 2);
    SCOPED_TRACE(c.name + ", NEIGHBORGRID_TILES_REACH=" + reach + ", NEIGHBORGRID_TILES_SHELL=" + shell);
    const ScopedKnob reachKnob("NEIGHBORGRID_TILES_REACH", reach.c_str());
    const ScopedKnob shellKnob("NEIGHBORGRID_TILES_SHELL", shell.c_str());
    Engine engine;
    Request r = periodicRequest(c, Method::StagedTiles);
    expectCountsOverImages(engine, r, ref);
    for (const Kernel kernel : { Kernel::CubicSpline, Kernel::QuinticSpline })
    {
      SCOPED_TRACE(toString(kernel));
      r.operation = Operation::Density;
      r.kernel = kernel;
      r.mass = nullptr;
      r.constantMass = LoopReference::oneMass;
      std::vector<float> rho(n, -1.0f);
      r.density = rho.data();
      engine.run(r);
      expectClose(rho, ref.density(c, kernel), "periodic density of one mass");
    }
    if (::testing::Test::HasFailure())
    {
      return;
    }
  }
}

// Staged Tiles' half shell with periodic images (StagedTiles::takesHalfShell): each pair is tested
// once, a pair of a particle and an image possibly by the image, and adds to both points (an
// image's own result is never returned: StagedTiles.cu, isImage). Both shells and both reaches on
// every box of EnginePeriodic, R above half the box among them, and on a face-centred crystal
// that fills its periodic box with R on its first shell: its twelve pairs a point, images
// included, lie within rounding of R and are decided in double, from the particle's side or the
// image's, counted and listed (BandPairs).
TEST(EnginePeriodicBox, StagedTilesShellsMatchDoubleBruteForceOverImages)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  const std::initializer_list<const char*> variants = { "1 half", "1 full", "2 half", "2 full" };
  for (const char* box : { "small", "large", "oneAxis", "planar" })
  {
    expectStagedTilesOverImages(makePeriodicCase(box), variants);
    if (HasFailure())
    {
      return;
    }
  }
  PeriodicCase crystal;
  crystal.name = "face-centred crystal";
  crystal.particles = latticeOf("face-centred", 0.25, 8); // sites at 0.25 k, k = 0..15
  crystal.lengths[0] = crystal.lengths[1] = crystal.lengths[2] = 4.0;
  crystal.radius = 0.25 * std::sqrt(2.0);
  for (const char* band : { "counted", "listed" })
  {
    SCOPED_TRACE(std::string("NEIGHBORGRID_TILES_BAND=") + band);
    const ScopedKnob bandKnob("NEIGHBORGRID_TILES_BAND", band);
    expectStagedTilesOverImages(crystal, variants);
    if (HasFailure())
    {
      return;
    }
  }
}

// The half shell with periodic images on the path it takes by default: a uniform cloud of about
// 80 neighbors a point (cells of R / 2, the half shell's own tiles, some of over 256 own points in
// two blocks), 300,000 points in a periodic box, against the loop over every neighbor
// (NEIGHBORGRID_TILES_SHELL=full, exact against double brute forces over the images above):
// counts identical, density of one mass within 1e-5 (its sums run in another order). The half
// shell decides a pair within rounding of R once, the loop over every neighbor from both of its
// particles, so fewer pairs decided in double show that the default took the half shell.
TEST(EnginePeriodicBox, StagedTilesHalfShellMatchesEveryNeighborAtScale)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "Staged Tiles runs on the CUDA backend only";
  }
  PeriodicCase c;
  c.name = "uniform, periodic";
  c.particles = ngtest::makeCloud("uniform", 300000, 30.0, 83, false);
  c.lengths[0] = c.lengths[1] = c.lengths[2] = 30.0;
  c.radius = 1.2;
  const std::size_t n = static_cast<std::size_t>(c.particles.size());
  std::vector<std::int32_t> counts[2];
  std::vector<float> rho[2];
  std::int64_t decided[2] = { 0, 0 };
  for (int full = 0; full < 2; ++full)
  {
    std::unique_ptr<ScopedKnob> shellKnob;
    if (full)
    {
      shellKnob = std::make_unique<ScopedKnob>("NEIGHBORGRID_TILES_SHELL", "full");
    }
    Engine engine;
    Request r = periodicRequest(c, Method::StagedTiles);
    r.operation = Operation::NeighborCount;
    counts[full].assign(n, -7);
    r.neighborCount = counts[full].data();
    const Report report = engine.run(r);
    EXPECT_GT(report.periodicImages, 0);
    decided[full] = report.pairsDecidedInDouble;
    r.neighborCount = nullptr;
    r.operation = Operation::Density;
    r.constantMass = LoopReference::oneMass;
    rho[full].assign(n, -1.0f);
    r.density = rho[full].data();
    engine.run(r);
  }
  const double mean = std::accumulate(counts[1].begin(), counts[1].end(), 0.0) / double(n);
  EXPECT_GT(mean, 70.0) << "the cloud should give about 80 neighbors a point";
  EXPECT_LT(mean, 90.0) << "the cloud should give about 80 neighbors a point";
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i)
  {
    if (counts[0][i] != counts[1][i] && bad++ < 5)
    {
      ADD_FAILURE() << "point " << i << ": count " << counts[0][i] << " by default, " << counts[1][i] << " over every neighbor";
    }
  }
  EXPECT_EQ(bad, 0);
  expectClose(rho[0], std::vector<double>(rho[1].begin(), rho[1].end()), "density by default against every neighbor's");
  RecordProperty("pairs_decided_in_double", std::to_string(decided[0]) + " by default, " + std::to_string(decided[1]) + " over every neighbor");
  EXPECT_GT(decided[1], 0);
  EXPECT_LT(decided[0], decided[1]) << "the default should take the half shell";
}

/// R far beyond the box (hundreds of images per particle): every image within R counts, the
/// particles' results computed at the particles only (Periodic.h, imagesPerParticleForQueries),
/// float and double input, against a double brute force over the images.
TEST(EnginePeriodicBox, RadiusBeyondTheBoxCountsEveryImage)
{
  const int n = 300;
  const double box = 10.0, radius = 23.0;
  std::mt19937_64 random(77);
  std::uniform_real_distribution<double> uniform(-4.0, 14.0); // some points outside the box
  std::vector<double> xyz(3 * n);
  for (double& v : xyz)
  {
    v = uniform(random);
  }
  std::vector<std::int64_t> want(n, -1); // the point itself excluded
  const int k = static_cast<int>(std::ceil(radius / box)) + 2;
  for (int i = 0; i < n; ++i)
  {
    for (int j = 0; j < n; ++j)
    {
      for (int kx = -k; kx <= k; ++kx)
      {
        for (int ky = -k; ky <= k; ++ky)
        {
          for (int kz = -k; kz <= k; ++kz)
          {
            const double image[3] = { xyz[3 * j] + kx * box, xyz[3 * j + 1] + ky * box, xyz[3 * j + 2] + kz * box };
            want[i] += withinRadius(&xyz[3 * i], image, radius) ? 1 : 0;
          }
        }
      }
    }
  }
  std::vector<float> asFloat(xyz.begin(), xyz.end());
  for (bool useDouble : { true, false })
  {
    SCOPED_TRACE(useDouble ? "double" : "float");
    std::vector<double> reference = xyz;
    if (!useDouble)
    {
      reference.assign(asFloat.begin(), asFloat.end());
    }
    std::vector<std::int32_t> counts(n, -7);
    Request r;
    r.points = useDouble ? Points(xyz.data(), n) : Points(asFloat.data(), n);
    r.radius = radius;
    r.backend = backendUnderTest;
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts.data();
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = true;
      r.boxLengths[a] = box;
    }
    const Report report = Engine().run(r);
    int bad = 0;
    for (int i = 0; i < n; ++i)
    {
      if (useDouble && counts[i] != want[i] && bad++ < 5)
      {
        ADD_FAILURE() << "point " << i << ": count " << counts[i] << ", reference " << want[i];
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(report.periodicImages, 100 * n);
    EXPECT_EQ(report.neighborPairs, std::accumulate(counts.begin(), counts.end(), std::int64_t(0)));
    if (!useDouble)
    {
      // Float input: the same counts up to pairs within rounding of R (none expected at this
      // spacing, but only the double run is held to the brute force exactly).
      std::int64_t total = std::accumulate(want.begin(), want.end(), std::int64_t(0));
      EXPECT_NEAR(double(report.neighborPairs), double(total), 1e-4 * double(total));
    }
  }
}

/// One engine for periodic and open runs in turn, as a pipeline that toggles the box does: the
/// buffers of the images made on the device are kept across an open run and grow for a run with
/// more images, and every run gives what a fresh engine gives (to float summation order: a method
/// may add a cell's points in any order).
TEST(EnginePeriodicBox, PeriodicAndOpenRunsInTurnMatchFreshEngines)
{
  const int n = 20000;
  const double box = 10.0;
  std::mt19937_64 random(4242);
  std::uniform_real_distribution<double> uniform(-2.0, 12.0); // some points to wrap
  std::vector<float> xyz(3 * n);
  for (float& v : xyz)
  {
    v = static_cast<float>(uniform(random));
  }
  const auto densityOf = [&](Engine& engine, bool periodic, double radius, Report* report = nullptr) {
    Request r;
    r.points = Points(xyz.data(), n);
    r.radius = radius;
    r.backend = backendUnderTest;
    r.operation = Operation::Density;
    std::vector<float> rho(n, -1.0f);
    r.density = rho.data();
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = periodic;
      r.boxLengths[a] = box;
    }
    const Report done = engine.run(r);
    if (report)
    {
      *report = done;
    }
    return rho;
  };
  const std::vector<float> before = xyz;
  Engine shared;
  Report small, large;
  const std::vector<float> periodicSmall = densityOf(shared, true, 0.5, &small);
  const std::vector<float> open = densityOf(shared, false, 0.5);
  const std::vector<float> periodicLarge = densityOf(shared, true, 1.0, &large);
  const std::vector<float> periodicSmallAgain = densityOf(shared, true, 0.5);
  EXPECT_GT(large.periodicImages, small.periodicImages) << "the third run must need larger image buffers";
  const auto expectSame = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    expectClose(got, std::vector<double>(want.begin(), want.end()), what);
  };
  Engine fresh1, fresh2, fresh3;
  expectSame(periodicSmall, densityOf(fresh1, true, 0.5), "periodic, R = 0.5");
  expectSame(open, densityOf(fresh2, false, 0.5), "open after periodic");
  expectSame(periodicLarge, densityOf(fresh3, true, 1.0), "periodic after open, more images");
  expectSame(periodicSmallAgain, periodicSmall, "periodic, R = 0.5, again");
  EXPECT_EQ(xyz, before) << "the input coordinates changed";
}

TEST(EnginePeriodicBox, RejectsBadBoxes)
{
  std::vector<float> xyz = { 0.5f, 0.5f, 0.5f, 1.0f, 1.0f, 1.0f };
  std::vector<std::int32_t> counts(2);
  Request r;
  r.points = Points(xyz.data(), 2);
  r.radius = 0.5;
  r.backend = backendUnderTest;
  r.operation = Operation::NeighborCount;
  r.neighborCount = counts.data();
  r.periodic[1] = true;
  r.boxLengths[1] = 0.0;
  try
  {
    Engine().run(r);
    ADD_FAILURE() << "a periodic axis of length 0 was accepted";
  }
  catch (const Error& e)
  {
    EXPECT_NE(std::string(e.what()).find("axis y is periodic"), std::string::npos) << e.what();
  }
  r.boxLengths[1] = 2.0;
  r.boxOrigin[1] = std::nan("");
  EXPECT_THROW(Engine().run(r), Error);
}

/// SPH smoothing with the particle volumes V_j = m_j / rho_j given (a distributed run's halo)
/// equals SPH smoothing that computes rho_j itself: particles, probe points, periodic box.
TEST(EngineParticleVolumes, GivenVolumesMatchTheEnginesOwnDensity)
{
  const Cloud cloud = ngtest::makeCloud("clustered", 3000, 10.0, 31);
  const std::int64_t n = cloud.size();
  std::vector<float> mass(static_cast<std::size_t>(n)), values(static_cast<std::size_t>(2 * n));
  for (std::int64_t i = 0; i < n; ++i)
  {
    mass[i] = 0.5f + 0.001f * static_cast<float>(i % 700);
    values[2 * i] = std::sin(0.01f * static_cast<float>(i));
    values[2 * i + 1] = -1.0f + 0.002f * static_cast<float>(i % 1000);
  }
  const std::vector<float> probe = { 5.0f, 5.0f, 5.0f, 0.1f, 9.9f, 3.0f, 20.0f, 20.0f, 20.0f };
  for (bool periodic : { false, true })
  {
    for (bool separate : { false, true })
    {
      for (Method method : methodsFor(Scenario{ "clustered", 3000, 10.0, 0.9, true, 31 }))
      {
        SCOPED_TRACE(std::string(toString(method)) + (periodic ? " periodic" : " open") +
          (separate ? " probe" : " particles"));
        Request base = baseRequest(cloud, 0.9, method);
        for (int a = 0; a < 3 && periodic; ++a)
        {
          base.periodic[a] = true;
          base.boxLengths[a] = 10.0;
        }
        // rho_j at the particles.
        Request density = base;
        std::vector<float> rho(static_cast<std::size_t>(n));
        density.operation = Operation::Density;
        density.mass = mass.data();
        density.density = rho.data();
        Engine engine;
        engine.run(density);
        std::vector<float> volumes(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i)
        {
          volumes[i] = mass[i] / rho[i];
        }

        Request sph = base;
        sph.operation = Operation::Smoothing;
        sph.normalization = Normalization::SPH;
        sph.mass = mass.data();
        if (separate)
        {
          sph.source = sph.points;
          sph.points = Points(probe.data(), 3);
        }
        const std::int64_t results = separate ? 3 : n;
        std::vector<float> expected(static_cast<std::size_t>(2 * results)), given(expected.size(), -7.0f);
        sph.smoothed = { SmoothedArray{ values.data(), 2, expected.data(), "v" } };
        engine.run(sph);
        Request withVolumes = sph;
        withVolumes.mass = nullptr;
        withVolumes.particleVolumes = volumes.data();
        withVolumes.smoothed[0].output = given.data();
        engine.run(withVolumes);
        for (std::size_t k = 0; k < expected.size(); ++k)
        {
          ASSERT_NEAR(given[k], expected[k], 1e-6 * (1.0 + std::fabs(expected[k]))) << "entry " << k;
        }

        std::vector<float> densityOut(static_cast<std::size_t>(results));
        withVolumes.density = densityOut.data();
        EXPECT_THROW(engine.run(withVolumes), Error) << "density with given volumes was accepted";
      }
    }
  }
}

// --- Slabs (Engine::setMemoryLimit): a request larger than the memory a run may have is cut into
// slabs with halos; every result must equal the one-run result (counts exactly, float sums up to
// their order).

/// One request's outputs, compared entry by entry.
struct Outputs
{
  std::vector<std::int32_t> count;
  std::vector<float> density, shepard, sph;
  std::vector<std::uint8_t> valid;
};

enum class SlabQueries
{
  None,
  Points,
  Grid
};

/// Runs count, density, Shepard smoothing (3 components) and SPH smoothing (9 components, with
/// the density written) on `engine`; returns the outputs and the fewest slabs any run took.
Outputs runEveryOperation(Engine& engine, const Cloud& cloud, double radius, Method method, SlabQueries queries,
  const std::vector<float>& probe, const QueryGrid& grid, std::int64_t& fewestSlabs, std::int64_t& haloPoints)
{
  const std::int64_t n = cloud.size();
  const std::int64_t results = queries == SlabQueries::None ? n
    : queries == SlabQueries::Points                        ? std::int64_t(probe.size() / 3)
                                                            : grid.count();
  Outputs out;
  out.count.assign(results, -7);
  out.density.assign(results, -7.0f);
  out.shepard.assign(3 * results, -7.0f);
  out.sph.assign(9 * results, -7.0f);
  out.valid.assign(queries == SlabQueries::None ? 0 : results, 7);
  std::vector<float> sphDensity(results, -7.0f);
  fewestSlabs = std::numeric_limits<std::int64_t>::max();
  haloPoints = 0;
  auto request = [&](Operation operation) {
    Request r = baseRequest(cloud, radius, method);
    r.operation = operation;
    r.mass = cloud.mass.data();
    if (queries != SlabQueries::None)
    {
      r.source = r.points;
      r.points = queries == SlabQueries::Points ? Points(probe.data(), results) : Points();
      if (queries == SlabQueries::Grid)
      {
        r.queryGrid = grid;
      }
      r.valid = out.valid.data();
      r.nullValue = -1.5f;
    }
    return r;
  };
  auto run = [&](const Request& r) {
    const Report report = engine.run(r);
    fewestSlabs = std::min(fewestSlabs, report.slabs);
    haloPoints += report.slabHaloPoints;
  };
  Request count = request(Operation::NeighborCount);
  count.neighborCount = out.count.data();
  run(count);
  Request density = request(Operation::Density);
  density.density = out.density.data();
  run(density);
  Request shepard = request(Operation::Smoothing);
  shepard.smoothed = { SmoothedArray{ cloud.vector3.data(), 3, out.shepard.data(), "v" } };
  run(shepard);
  Request sph = request(Operation::Smoothing);
  sph.normalization = Normalization::SPH;
  sph.smoothed = { SmoothedArray{ cloud.tensor9.data(), 9, out.sph.data(), "t" } };
  sph.density = sphDensity.data();
  run(sph);
  for (std::int64_t i = 0; i < results; ++i)
  {
    EXPECT_EQ(sphDensity[i], sphDensity[i]); // written (not NaN poison)
  }
  // The SPH run's density must be the density.
  for (std::int64_t i = 0; i < results; ++i)
  {
    if (std::fabs(sphDensity[i] - out.density[i]) > 1e-5 * (std::fabs(out.density[i]) + 1e-3))
    {
      ADD_FAILURE() << "SPH's density at " << i << ": " << sphDensity[i] << ", Density: " << out.density[i];
      break;
    }
  }
  return out;
}

void expectSameResults(const std::vector<float>& got, const std::vector<float>& want, const char* what)
{
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t k = 0; k < got.size(); ++k)
  {
    // Float sums in another order, frame coordinates relative to another origin (each slab's
    // bounds), and for Auto perhaps another method (cells of R / 2 or R): each run within 1e-5
    // of the double reference for the extents of EngineAccuracy, a few times that here (boxes
    // of 80 to 160).
    if (!(std::fabs(got[k] - want[k]) <= 5e-5 * (std::fabs(want[k]) + 1.0)) && bad++ < 5)
    {
      ADD_FAILURE() << what << " entry " << k << ": in slabs " << got[k] << ", in one run " << want[k];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

/// Shepard smoothing of the slab test: entries of slabs and one run that differ by more than
/// expectSameResults allows must each lie within the entry's conditioning of the double reference.
/// A query whose neighbors all sit near R has weights (1 - r/R)^3 that move hundreds of times more
/// than r does, and r is rounded in frame coordinates (FENNS's coarse cells are up to 64 R wide:
/// about 4e-6 R); where the weights of values far apart move, the average moves.
void expectSameShepard(const std::vector<float>& got, const std::vector<float>& want, const Cloud& cloud,
  double radius, const std::function<void(std::int64_t, double*)>& queryPosition)
{
  const double rounding = 64.0 * radius * 0x1p-23;
  int bad = 0;
  for (std::size_t k = 0; k < got.size(); ++k)
  {
    if (std::fabs(got[k] - want[k]) <= 5e-5 * (std::fabs(want[k]) + 1.0))
    {
      continue;
    }
    const std::int64_t q = static_cast<std::int64_t>(k / 3);
    const int component = static_cast<int>(k % 3);
    double x[3];
    queryPosition(q, x);
    double sumW = 0, sumWf = 0;
    std::vector<std::pair<double, double>> slopeAndValue; // |dW/dr| and f of each neighbor
    for (std::int64_t j = 0; j < cloud.size(); ++j)
    {
      const double* y = cloud.xyz.data() + 3 * j;
      if (!ngtest::within(x, y, radius))
      {
        continue;
      }
      const double r = std::sqrt((x[0] - y[0]) * (x[0] - y[0]) + (x[1] - y[1]) * (x[1] - y[1]) + (x[2] - y[2]) * (x[2] - y[2]));
      const double w = kernelValue(Kernel::CubicSpline, 3, radius, r);
      const double slope = std::fabs(kernelDerivative(Kernel::CubicSpline, 3, radius, r));
      const double f = cloud.vector3[3 * j + component];
      sumW += w;
      sumWf += w * f;
      slopeAndValue.emplace_back(slope, f);
    }
    const double exact = sumW > 0 ? sumWf / sumW : 0.0;
    double conditioning = 0;
    for (const auto& [slope, f] : slopeAndValue)
    {
      conditioning += slope * rounding * std::fabs(f - exact);
    }
    const double allowed = 1e-5 * (std::fabs(exact) + 1.0) + (sumW > 0 ? conditioning / sumW : 0.0);
    for (const float value : { got[k], want[k] })
    {
      if (!(std::fabs(value - exact) <= allowed) && bad++ < 5)
      {
        ADD_FAILURE() << "Shepard smoothing entry " << k << ": in slabs " << got[k] << ", in one run " << want[k]
                      << ", double reference " << exact << " (conditioning allows " << allowed << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << "Shepard smoothing";
}

class EngineSlabs : public testing::TestWithParam<std::string>
{
};

TEST_P(EngineSlabs, EveryOperationMatchesOneRun)
{
  // The CUDA methods keep 16 to 32 MB of scratch per run, and a limit must leave room for more: a
  // larger cloud there (at the same density), so that a 96 MB limit still makes its run too large.
  const bool cuda = backendUnderTest == Backend::CUDA;
  const std::int64_t n = cuda ? 3000000 : 60000;
  // Clusters of width box / 40: a larger box and a smaller R keep them to a few hundred neighbors.
  const bool clustered = GetParam() == "clustered";
  const double box = (cuda ? 115.0 : 32.0) * (clustered ? 2.0 : 1.0);
  const double radius = clustered ? 0.8 : 1.3;
  const Cloud cloud = ngtest::makeCloud(GetParam(), n, box, 71);
  std::vector<float> probe;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> position(-0.1f * float(box), 1.1f * float(box));
  for (int k = 0; k < 3 * 20000; ++k)
  {
    probe.push_back(position(rng));
  }
  QueryGrid grid;
  for (int a = 0; a < 3; ++a)
  {
    grid.spacing[a] = box / 24.0;
    grid.origin[a] = -0.25 * box;
    grid.dimensions[a] = 30 + 4 * a;
  }
  grid.firstIndex[0] = 3;
  grid.firstIndex[1] = -2;
  grid.firstIndex[2] = 5;
  for (Method method : methodsFor(Scenario{ GetParam(), 60000, box, radius, true, 71 }))
  {
    if (method == Method::BruteForce)
    {
      continue; // fits in one run anyway
    }
    for (SlabQueries queries : { SlabQueries::None, SlabQueries::Points, SlabQueries::Grid })
    {
      SCOPED_TRACE(std::string(toString(method)) + (queries == SlabQueries::None ? " particles"
          : queries == SlabQueries::Points                                      ? " probe"
                                                                                : " grid"));
      Engine whole, sliced;
      sliced.setMemoryLimit(cuda ? (std::int64_t(96) << 20) : 100 * n / 4);
      std::int64_t oneRun = 0, slabs = 0, halo = 0, unused = 0;
      const Outputs want = runEveryOperation(whole, cloud, radius, method, queries, probe, grid, oneRun, unused);
      const Outputs got = runEveryOperation(sliced, cloud, radius, method, queries, probe, grid, slabs, halo);
      EXPECT_EQ(oneRun, 1);
      EXPECT_GE(slabs, 2) << "the memory limit did not cut the request";
      if (queries == SlabQueries::None)
      {
        EXPECT_GT(halo, 0);
      }
      int bad = 0;
      for (std::size_t i = 0; i < want.count.size(); ++i)
      {
        if (got.count[i] != want.count[i] && bad++ < 5)
        {
          ADD_FAILURE() << "count of " << i << ": in slabs " << got.count[i] << ", in one run " << want.count[i];
        }
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(got.valid, want.valid);
      expectSameResults(got.density, want.density, "density");
      expectSameShepard(got.shepard, want.shepard, cloud, radius, [&](std::int64_t q, double* x) {
        for (int a = 0; a < 3; ++a)
        {
          if (queries == SlabQueries::None)
          {
            x[a] = cloud.xyz[3 * q + a];
          }
          else if (queries == SlabQueries::Points)
          {
            x[a] = probe[3 * q + a];
          }
          else
          {
            const std::int64_t index[3] = { q % grid.dimensions[0], q / grid.dimensions[0] % grid.dimensions[1],
              q / (grid.dimensions[0] * grid.dimensions[1]) };
            x[a] = grid.origin[a] + double(grid.firstIndex[a] + index[a]) * grid.spacing[a];
          }
        }
      });
      expectSameResults(got.sph, want.sph, "SPH smoothing");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Clouds, EngineSlabs, testing::Values("uniform", "clustered"));

// The slab gather cuts the points into min(4 x threads, n / 65536) slices and hands them to the
// threads in equal runs: 10 slices on 7 threads leave the last thread none. It once read past
// the end of its offsets there (a crash on the GPU machine's 16 threads; CI has 2).
TEST(EngineSlabsThreads, MoreThreadsThanSlicesMatchOneRun)
{
  if (backendUnderTest == Backend::CUDA)
  {
    // The gather is the slab layer's host work, the same for every backend; the CUDA methods'
    // scratch would need a cloud of millions of points for a limit to cut it (EngineSlabs).
    GTEST_SKIP() << "host work of the slab layer: the CPU backend's run checks it";
  }
  const std::int64_t n = 10 * 65536 + 17;
  const Cloud cloud = ngtest::makeCloud("uniform", n, 40.0, 91);
  for (const bool asDouble : { false, true })
  {
    SCOPED_TRACE(asDouble ? "double coordinates" : "float coordinates");
    Request r = baseRequest(cloud, 0.9, Method::Auto);
    if (asDouble)
    {
      r.points = Points(cloud.xyz.data(), n);
    }
    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> want(n, -1), got(n, -1);
    Engine whole, sliced;
    sliced.setCpuThreads(7);
    sliced.setMemoryLimit(25 * n);
    r.neighborCount = want.data();
    EXPECT_EQ(whole.run(r).slabs, 1);
    r.neighborCount = got.data();
    EXPECT_GE(sliced.run(r).slabs, 2) << "the memory limit did not cut the request";
    EXPECT_EQ(got, want);
  }
}

// The CUDA backend's transfer ring (Kernels/src/cuda/TransferRing.h): worker threads copy through
// 48 pinned slots of 1 MiB, in pieces of 64 KiB where a transfer fits the ring and in whole
// slices where it does not. Shuffled lattices whose counts (6 inside, fewer on the faces) depend
// on where each point's coordinates landed, so a piece copied to the wrong place, twice, or not
// at all changes counts:
//  - 241^3 points: 168 MB of coordinates and 56 MB of counts, both past the ring (whole slices,
//    slots reused), neither a whole number of slices;
//  - 256 x 128 x 128 points: coordinates of exactly the ring's 48 MiB (pieces, no slot reused);
//  - 5 x 838,861 points: one point past the ring (whole slices, the last one 12 bytes), and 4
//    bytes of counts past 16 MiB (pieces, the last one 4 bytes).
// Within the ring a kernel copies each group of slices (1, 2, 4, then 8 up; one down), 16 bytes a
// thread and the rest by bytes:
//  - 97 x 101 x 103 points: 12.1 MB of coordinates (groups of 1, 2, 4 and part of 8 slices, 4
//    bytes past 16) and 4.04 MB of counts (5 slices, 12 bytes past 16);
//  - 7 x 11 x 13 and 2 x 3 x 5 points: less than one slice (12 and 8 bytes past 16 up; 4 and 8
//    down).
namespace
{
struct RingLattice
{
  int a, b, c;
};

void expectLatticeCountsThroughTheRing(const RingLattice& dims)
{
  const std::int64_t n = std::int64_t(dims.a) * dims.b * dims.c;
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(29));
  auto position = [&](std::int64_t cell, int& x, int& y, int& z) {
    x = int(cell % dims.a);
    y = int((cell / dims.a) % dims.b);
    z = int(cell / (std::int64_t(dims.a) * dims.b));
  };
  std::vector<float> xyz(3 * n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    int x, y, z;
    position(order[i], x, y, z);
    xyz[3 * i] = float(x);
    xyz[3 * i + 1] = float(y);
    xyz[3 * i + 2] = float(z);
  }
  Request r;
  r.points = Points(xyz.data(), n);
  r.radius = 1.05;
  r.backend = backendUnderTest;
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> counts(n, -7);
  r.neighborCount = counts.data();
  Engine engine;
  for (int run = 0; run < 2; ++run) // the second run reuses the ring and its workers
  {
    SCOPED_TRACE("run " + std::to_string(run));
    std::fill(counts.begin(), counts.end(), -7);
    engine.run(r);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      int x, y, z;
      position(order[i], x, y, z);
      const int expected = (x > 0) + (x < dims.a - 1) + (y > 0) + (y < dims.b - 1) + (z > 0) + (z < dims.c - 1);
      if (counts[i] != expected && bad++ < 5)
      {
        ADD_FAILURE() << "point " << i << " at (" << x << ", " << y << ", " << z << "): count " << counts[i]
                      << ", expected " << expected;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}
} // namespace

TEST(EngineTransfers, ArraysAroundTheRingsSizeArriveWhole)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "the transfer ring is the CUDA backend's";
  }
  const std::vector<RingLattice> lattices = { { 241, 241, 241 }, { 256, 128, 128 }, { 5, 838861, 1 }, { 97, 101, 103 },
    { 7, 11, 13 }, { 2, 3, 5 } };
  for (const RingLattice& dims : lattices)
  {
    const std::size_t bytes = 12 * std::size_t(dims.a) * dims.b * dims.c;
    SCOPED_TRACE(std::to_string(dims.a) + " x " + std::to_string(dims.b) + " x " + std::to_string(dims.c) + ": " +
      std::to_string(bytes) + " bytes of coordinates");
    expectLatticeCountsThroughTheRing(dims);
  }
}

// Result arrays in the engine's transfer memory (Engine::allocateTransferMemory, what the VTK
// filter gives a run on the GPU): the CUDA backend downloads into them with one DMA instead of
// the ring. A shuffled 101^3 lattice's counts and densities (every neighbor at distance 1, so
// W(0) + count W(1)), three runs, the arrays released and taken again between runs. Without a
// usable CUDA device there is no transfer memory.
TEST(EngineTransfers, ResultsInTransferMemoryArriveWhole)
{
  if (!Engine::cudaAvailable())
  {
    EXPECT_EQ(Engine::allocateTransferMemory(std::size_t(1) << 20), nullptr);
    Engine::releaseTransferMemory(nullptr);
    return;
  }
  const int side = 101;
  const std::int64_t n = std::int64_t(side) * side * side;
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(31));
  std::vector<float> xyz(3 * n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    xyz[3 * i] = float(order[i] % side);
    xyz[3 * i + 1] = float((order[i] / side) % side);
    xyz[3 * i + 2] = float(order[i] / (std::int64_t(side) * side));
  }
  Request r;
  r.points = Points(xyz.data(), n);
  r.radius = 1.05;
  r.backend = backendUnderTest;
  Engine engine;
  const double selfWeight = kernelValue(r.kernel, 3, r.radius, 0.0), neighborWeight = kernelValue(r.kernel, 3, r.radius, 1.0);
  for (int run = 0; run < 3; ++run)
  {
    SCOPED_TRACE("run " + std::to_string(run));
    auto* counts = static_cast<std::int32_t*>(Engine::allocateTransferMemory(n * sizeof(std::int32_t)));
    auto* density = static_cast<float*>(Engine::allocateTransferMemory(n * sizeof(float)));
    ASSERT_NE(counts, nullptr);
    ASSERT_NE(density, nullptr);
    std::fill(counts, counts + n, -7);
    std::fill(density, density + n, -1.0f);
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts;
    r.density = nullptr;
    engine.run(r);
    r.operation = Operation::Density;
    r.neighborCount = nullptr;
    r.density = density;
    engine.run(r);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      const int x = int(order[i] % side), y = int((order[i] / side) % side), z = int(order[i] / (std::int64_t(side) * side));
      const int expected = (x > 0) + (x < side - 1) + (y > 0) + (y < side - 1) + (z > 0) + (z < side - 1);
      const double rho = selfWeight + expected * neighborWeight;
      if ((counts[i] != expected || !(std::abs(density[i] - rho) <= 1e-5 * rho)) && bad++ < 5)
      {
        ADD_FAILURE() << "point " << i << ": count " << counts[i] << " (expected " << expected << "), density "
                      << density[i] << " (expected " << rho << ")";
      }
    }
    EXPECT_EQ(bad, 0);
    Engine::releaseTransferMemory(counts);
    Engine::releaseTransferMemory(density);
  }
  Engine::releaseTransferMemory(xyz.data()); // not transfer memory: ignored
}

// The CUDA backend takes the bounds of the coordinates from the ring's workers, which find them
// piece by piece while they copy (CoordinateCopy.h): a piece may start at any axis, and a value
// missed at a piece's edge would leave its point outside the grid. A lattice (neighbors: the six
// axis neighbors at distance 1, R = 1.05) holds pairs of points far outside it, each pair 0.5
// apart along one axis and nothing else within R. The outer point of each pair sets the bounds of
// its axis, and its extreme value is the first value of the array, the last, the first of a
// piece (the second, the third), the last of one, or the first of the second slice. Float and
// double, an array that fits the ring (pieces of 64 KiB) and one that does not (whole slices).
namespace
{
void expectOutliersBoundTheGrid(int side, bool asDouble)
{
  const std::int64_t lattice = std::int64_t(side) * side * side;
  const std::int64_t values = 3 * lattice;
  const std::int64_t perPiece = (std::int64_t(64) << 10) / (asDouble ? 8 : 4);
  const std::int64_t perSlice = (std::int64_t(1) << 20) / (asDouble ? 8 : 4);
  // The extreme value of outlier k sits at value index outerValues[k]: its point and axis.
  const std::vector<std::int64_t> outerValues = { 0, values - 1, perPiece, 2 * perPiece, 3 * perPiece - 1, perSlice };
  std::vector<double> xyz(values);
  std::vector<bool> occupied(lattice, true);
  for (std::int64_t i = 0; i < lattice; ++i)
  {
    xyz[3 * i] = double(i % side);
    xyz[3 * i + 1] = double((i / side) % side);
    xyz[3 * i + 2] = double(i / (std::int64_t(side) * side));
  }
  std::vector<std::int64_t> outer, inner;
  std::mt19937_64 rng(41);
  for (std::size_t k = 0; k < outerValues.size(); ++k)
  {
    const std::int64_t point = outerValues[k] / 3;
    const int axis = int(outerValues[k] % 3);
    std::int64_t partner = 0;
    do
    {
      partner = std::int64_t(rng() % std::uint64_t(lattice));
    } while (partner == point || !occupied[partner] || std::count(outerValues.begin(), outerValues.end(), 3 * partner + axis) ||
      partner == 0);
    occupied[point] = occupied[partner] = false;
    // Beyond the lattice by 40 + 10 k (below it for odd k), so that no two outliers are near.
    const double far = (k % 2 ? -1.0 : 1.0) * (40.0 + 10.0 * double(k)) + (k % 2 ? 0.0 : double(side - 1));
    xyz[3 * point + axis] = far;
    for (int a = 0; a < 3; ++a)
    {
      xyz[3 * partner + a] = xyz[3 * point + a];
    }
    xyz[3 * partner + axis] = far + (k % 2 ? 0.5 : -0.5);
    outer.push_back(point);
    inner.push_back(partner);
  }
  std::vector<float> xyzFloat(xyz.begin(), xyz.end());
  Request r;
  r.points = asDouble ? Points(xyz.data(), lattice) : Points(xyzFloat.data(), lattice);
  r.radius = 1.05;
  r.backend = backendUnderTest;
  r.operation = Operation::NeighborCount;
  std::vector<std::int32_t> counts(lattice, -7);
  r.neighborCount = counts.data();
  Engine engine;
  engine.run(r);
  std::int64_t bad = 0;
  auto expect = [&](std::int64_t i, int expected, const char* what) {
    if (counts[i] != expected && bad++ < 5)
    {
      ADD_FAILURE() << what << " point " << i << " at (" << xyz[3 * i] << ", " << xyz[3 * i + 1] << ", "
                    << xyz[3 * i + 2] << "): count " << counts[i] << ", expected " << expected;
    }
  };
  for (std::size_t k = 0; k < outer.size(); ++k)
  {
    expect(outer[k], 1, "outlier");
    expect(inner[k], 1, "outlier's partner");
  }
  for (std::int64_t i = 0; i < lattice; ++i)
  {
    if (!occupied[i])
    {
      continue;
    }
    const int x = int(i % side), y = int((i / side) % side), z = int(i / (std::int64_t(side) * side));
    const std::int64_t plane = std::int64_t(side) * side;
    const int expected = (x > 0 && occupied[i - 1]) + (x < side - 1 && occupied[i + 1]) +
      (y > 0 && occupied[i - side]) + (y < side - 1 && occupied[i + side]) + (z > 0 && occupied[i - plane]) +
      (z < side - 1 && occupied[i + plane]);
    expect(i, expected, "lattice");
  }
  EXPECT_EQ(bad, 0);
}
} // namespace

TEST(EngineTransfers, BoundsFoundInTheCopyReachEveryPiecesEdge)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "the transfer ring is the CUDA backend's";
  }
  for (bool asDouble : { false, true })
  {
    // 60^3: 2.6 or 5.2 MB, pieces of 64 KiB; 160^3: 49 or 98 MB, past the ring's 48 MiB.
    for (int side : { 60, 160 })
    {
      SCOPED_TRACE(std::string(asDouble ? "double" : "float") + ", " + std::to_string(side) + "^3 points");
      expectOutliersBoundTheGrid(side, asDouble);
    }
  }
}

// A non-finite coordinate found by the ring's workers is named by the host's pass: the first one
// in the array, whichever piece a worker copied first.
TEST(EngineTransfers, NamesTheFirstNonFiniteCoordinateOfAnyPiece)
{
  const std::int64_t n = 200000; // 2.4 MB of floats: 37 pieces
  const Cloud cloud = ngtest::makeCloud("uniform", n, 60.0, 17);
  // Point 5461's y is the first value of the second piece; point 87381's y the first of the
  // second slice; point 199999's z the last value of the array.
  for (const auto& bad : std::vector<std::vector<std::int64_t>>{ { 3 * 5461 + 1 }, { 3 * 87381 + 1, 3 * 5461 + 2 },
         { 3 * 199999 + 2 }, { 3 * 199999 + 2, 3 * 87381 } })
  {
    std::vector<float> xyz = cloud.xyzFloat;
    bool nan = true;
    for (std::int64_t v : bad)
    {
      xyz[v] = nan ? std::nanf("") : -INFINITY;
      nan = !nan;
    }
    const std::int64_t first = *std::min_element(bad.begin(), bad.end()) / 3;
    Request r = baseRequest(cloud, 1.0, Method::Auto);
    r.points = Points(xyz.data(), n);
    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> counts(n, -7);
    r.neighborCount = counts.data();
    Engine engine;
    try
    {
      engine.run(r);
      ADD_FAILURE() << "no error for a non-finite coordinate of point " << first;
    }
    catch (const Error& e)
    {
      const std::string expected = "point " + std::to_string(first) + " has a non-finite coordinate";
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::count(counts.begin(), counts.end(), -7), n) << "an output was written despite the error";
  }
}

TEST(EngineSlabsPeriodic, APeriodicBoxInSlabsMatchesOneRun)
{
  const bool cuda = backendUnderTest == Backend::CUDA;
  const std::int64_t n = cuda ? 3000000 : 60000;
  const double box = cuda ? 115.0 : 32.0;
  const Cloud cloud = ngtest::makeCloud("uniform", n, box, 72);
  for (Method method : { Method::Auto, Method::CountingSort })
  {
    SCOPED_TRACE(toString(method));
    std::vector<float> want(n), got(n), wantSph(3 * n), gotSph(3 * n);
    std::vector<std::int32_t> wantCount(n), gotCount(n);
    auto run = [&](Engine& engine, std::vector<float>& rho, std::vector<float>& sph, std::vector<std::int32_t>& count) {
      Request r = baseRequest(cloud, 1.3, method);
      for (int a = 0; a < 3; ++a)
      {
        r.periodic[a] = true;
        r.boxLengths[a] = box;
      }
      r.operation = Operation::NeighborCount;
      r.neighborCount = count.data();
      std::int64_t slabs = engine.run(r).slabs;
      r.operation = Operation::Density;
      r.mass = cloud.mass.data();
      r.density = rho.data();
      slabs = std::min(slabs, engine.run(r).slabs);
      r.operation = Operation::Smoothing;
      r.normalization = Normalization::SPH;
      r.density = nullptr;
      r.smoothed = { SmoothedArray{ cloud.vector3.data(), 3, sph.data(), "v" } };
      return std::min(slabs, engine.run(r).slabs);
    };
    Engine whole, sliced;
    sliced.setMemoryLimit(cuda ? (std::int64_t(96) << 20) : 100 * n / 4);
    EXPECT_EQ(run(whole, want, wantSph, wantCount), 1);
    EXPECT_GE(run(sliced, got, gotSph, gotCount), 2);
    EXPECT_EQ(gotCount, wantCount);
    expectSameResults(got, want, "periodic density");
    expectSameResults(gotSph, wantSph, "periodic SPH smoothing");
  }
}

// Found by the slab tests on the H100 (2026-11-23): FENNS and CLAWS missed neighbors of points in
// dense clusters inside a sparse box (3M points, five clusters of width 5.75 in a box of 230,
// R = 0.8): a neighbor cell's border section of more than 32767 points overflowed the 16-bit x
// steps of its run (Fenns.cuh, NeighborRuns). EngineClusterSweep draws many more such clouds.
TEST(EngineMethods, FennsAndClawsCountExactlyInDenseClustersOfASparseBox)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "FENNS and CLAWS run on CUDA only";
  }
  const Cloud cloud = ngtest::makeCloud("clustered", 3000000, 230.0, 71);
  std::vector<std::int32_t> exact(cloud.size()), counts(cloud.size());
  Engine engine;
  Request r = baseRequest(cloud, 0.8, Method::CountingSort);
  r.operation = Operation::NeighborCount;
  r.neighborCount = exact.data();
  engine.run(r);
  // Counting Sort itself, against a double brute force at a few points of the clusters.
  for (std::int64_t i : { 4, 9, 22, 25, 38 })
  {
    std::int64_t brute = 0;
    for (std::int64_t j = 0; j < cloud.size(); ++j)
    {
      const double a[3] = { cloud.xyzFloat[3 * i], cloud.xyzFloat[3 * i + 1], cloud.xyzFloat[3 * i + 2] };
      const double b[3] = { cloud.xyzFloat[3 * j], cloud.xyzFloat[3 * j + 1], cloud.xyzFloat[3 * j + 2] };
      brute += j != i && withinRadius(a, b, 0.8);
    }
    ASSERT_EQ(exact[i], brute) << "point " << i;
  }
  for (Method method : { Method::FENNS, Method::CLAWS, Method::Auto })
  {
    SCOPED_TRACE(toString(method));
    r.method = method;
    r.neighborCount = counts.data();
    engine.run(r);
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < counts.size(); ++i)
    {
      bad += counts[i] != exact[i];
    }
    EXPECT_EQ(bad, 0) << "points whose count differs from Counting Sort's";
  }
}

// A limit below what any run needs fails at once, with outputs untouched.
TEST(EngineSlabsErrors, ALimitTooSmallForAnySlabIsAClearError)
{
  const Cloud cloud = ngtest::makeCloud("uniform", 20000, 20.0, 73);
  std::vector<float> rho(cloud.size(), -1.0f);
  Engine engine;
  engine.setMemoryLimit(backendUnderTest == Backend::CUDA ? (std::int64_t(4) << 20) : 2000);
  Request r = baseRequest(cloud, 1.0, Method::Auto);
  r.operation = Operation::Density;
  r.density = rho.data();
  try
  {
    engine.run(r);
    ADD_FAILURE() << "ran within the limit";
  }
  catch (const Error& e)
  {
    const std::string what = e.what();
    EXPECT_NE(what.find("limit"), std::string::npos) << what;
    EXPECT_NE(what.find("Raise the memory limit"), std::string::npos) << what;
  }
  for (float v : rho)
  {
    ASSERT_EQ(v, -1.0f) << "an output was written despite the error";
  }
  engine.setMemoryLimit(0);
  engine.run(r);
  EXPECT_GT(rho[0], 0.0f);
}

// A grid with a first index other than 0 has exactly the points origin + (first + i) * spacing.
TEST(EngineQueriesGrid, FirstIndexGivesTheSamePointsAsTheirList)
{
  const Cloud cloud = ngtest::makeCloud("uniform", 20000, 10.0, 74);
  QueryGrid grid;
  const std::int64_t first[3] = { -7, 4, 11 };
  std::vector<double> points;
  for (int a = 0; a < 3; ++a)
  {
    grid.origin[a] = 0.3 + a;
    grid.spacing[a] = 0.1 * (a + 1);
    grid.dimensions[a] = 9 + a;
    grid.firstIndex[a] = first[a];
  }
  for (std::int64_t k = 0; k < grid.dimensions[2]; ++k)
  {
    for (std::int64_t j = 0; j < grid.dimensions[1]; ++j)
    {
      for (std::int64_t i = 0; i < grid.dimensions[0]; ++i)
      {
        const std::int64_t ijk[3] = { i, j, k };
        for (int a = 0; a < 3; ++a)
        {
          points.push_back(grid.origin[a] + double(first[a] + ijk[a]) * grid.spacing[a]);
        }
      }
    }
  }
  Scenario s{ "uniform", 20000, 10.0, 0.7, true, 74 };
  for (Method method : methodsFor(s))
  {
    SCOPED_TRACE(toString(method));
    std::vector<std::int32_t> fromGrid(grid.count()), fromList(grid.count());
    Engine engine;
    Request r = baseRequest(cloud, 0.7, method);
    r.source = r.points;
    r.points = Points();
    r.queryGrid = grid;
    r.operation = Operation::NeighborCount;
    r.neighborCount = fromGrid.data();
    engine.run(r);
    r.queryGrid = QueryGrid();
    r.points = Points(points.data(), grid.count());
    r.neighborCount = fromList.data();
    engine.run(r);
    EXPECT_EQ(fromGrid, fromList);
    std::int64_t total = 0;
    for (auto c : fromGrid)
    {
      total += c;
    }
    EXPECT_GT(total, 0);
  }
}

} // namespace

// --- Per-particle radii and gradients (Request::radii, Operation::Gradient) ---------------------

namespace
{

/// Clusters of three widths (sigma 0.05, 0.3, 1.5) in a sparse background of a box of 40: each
/// particle's radius is the distance to its 64th nearest other particle, a range of over 100x.
struct RadiiCloud
{
  Cloud cloud;
  std::vector<float> radii;
};

std::vector<float> radiiToNeighbor(const Cloud& c, int neighbor)
{
  const std::int64_t n = c.size();
  std::vector<float> radii(n);
  std::vector<double> d(n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    for (std::int64_t j = 0; j < n; ++j)
    {
      double s = 0;
      for (int a = 0; a < 3; ++a)
      {
        s += (c.xyz[3 * i + a] - c.xyz[3 * j + a]) * (c.xyz[3 * i + a] - c.xyz[3 * j + a]);
      }
      d[j] = std::sqrt(s);
    }
    // d[i] = 0 is the point itself: the 64th other point is the 65th smallest distance.
    std::nth_element(d.begin(), d.begin() + neighbor, d.end());
    radii[i] = static_cast<float>(d[neighbor]);
  }
  return radii;
}

const RadiiCloud& radiiCloud()
{
  static RadiiCloud rc = [] {
    RadiiCloud r;
    std::mt19937_64 rng(1201);
    Cloud& c = r.cloud;
    const std::int64_t n = 3000;
    c.name = "radii";
    c.asFloat = true;
    c.xyz.resize(3 * n);
    std::uniform_real_distribution<double> u(0.0, 40.0), center(12.0, 28.0);
    const double sigma[3] = { 0.05, 0.3, 1.5 };
    double centers[9];
    for (double& v : centers)
    {
      v = center(rng);
    }
    for (std::int64_t i = 0; i < n; ++i)
    {
      const int kind = static_cast<int>(i % 8) / 2; // 0-2: a cluster, 3: background
      std::normal_distribution<double> g(0.0, kind < 3 ? sigma[kind] : 1.0);
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = kind < 3 ? centers[3 * kind + a] + g(rng) : u(rng);
      }
    }
    ngtest::finishCloud(c, rng);
    r.radii = radiiToNeighbor(c, 64);
    return r;
  }();
  return rc;
}


} // namespace


// Per-particle radii in a periodic box: every mode, count, density, SPH smoothing and the gradient
// against the double brute force over the particles and their images (RadiiReference on the
// unrolled box); the SPH weights of images are their particle's (its periodic density).
TEST(EngineRadiiPeriodic, EveryModeMatchesDoubleBruteForceOverImages)
{
  constexpr double L = 10.0;
  const UnrolledBox b = unrolledBox(700, L, 2311);
  const Cloud& c = b.particles;
  const std::int64_t n = c.size();
  Engine engine;
  for (SmoothingLengthMode mode : { SmoothingLengthMode::Gather, SmoothingLengthMode::Scatter, SmoothingLengthMode::Symmetric })
  {
    SCOPED_TRACE(toString(mode));
    const RadiiReference ref(b.unrolled, b.unrolledRadii, mode, nullptr, n);
    std::vector<double> rhoScale;
    const std::vector<double> rho = ref.density(Kernel::WendlandC2, &rhoScale);
    std::vector<double> volumes(b.original.size());
    for (std::size_t j = 0; j < volumes.size(); ++j)
    {
      volumes[j] = c.mass[b.original[j]] / rho[b.original[j]];
    }
    Request r = baseRequest(c, 0.0, Method::Auto);
    r.radii = b.radii.data();
    r.smoothingLengthMode = mode;
    r.kernel = Kernel::WendlandC2;
    r.mass = c.mass.data();
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = true;
      r.boxLengths[a] = L;
    }
    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> count(n, -1);
    r.neighborCount = count.data();
    const Report report = engine.run(r);
    EXPECT_EQ(asDouble(count), ref.counts());
    EXPECT_GT(report.periodicImages, 0);
    r.neighborCount = nullptr;

    r.operation = Operation::Density;
    std::vector<float> density(n, -1.0f);
    r.density = density.data();
    engine.run(r);
    expectClose(density, rho, "density", &rhoScale);

    std::vector<double> sphScale, gradientScale;
    const std::vector<double> sph = ref.smooth(Kernel::WendlandC2, b.unrolled.scalar, 1, volumes, &sphScale);
    r.operation = Operation::Smoothing;
    r.normalization = Normalization::SPH;
    std::vector<float> sphOut(n, -1.0f);
    r.smoothed = { SmoothedArray{ c.scalar.data(), 1, sphOut.data(), "scalar" } };
    engine.run(r);
    expectClose(sphOut, sph, "SPH smoothing", &sphScale);

    const std::vector<double> gradient =
      ref.gradient(Kernel::WendlandC2, b.unrolled.vector3, 3, volumes, &gradientScale);
    r.operation = Operation::Gradient;
    std::vector<float> grad(9 * n, -1.0f);
    std::fill(density.begin(), density.end(), -1.0f);
    r.smoothed = { SmoothedArray{ c.vector3.data(), 3, grad.data(), "vector" } };
    engine.run(r);
    expectClose(grad, gradient, "gradient of a vector", &gradientScale);
    expectClose(density, rho, "density of the gradient", &rhoScale);
  }
}

// A probe in a periodic box with the particles' radii (Scatter, as the volume filter runs it):
// grid points near the faces see the images of particles across them.
TEST(EngineRadiiPeriodic, ProbeGridSeesImagesOfTheParticles)
{
  constexpr double L = 10.0;
  const UnrolledBox b = unrolledBox(500, L, 2312);
  const Cloud& c = b.particles;
  Request r = baseRequest(c, 0.0, Method::Auto);
  r.source = c.points();
  r.queryGrid.origin[0] = r.queryGrid.origin[1] = r.queryGrid.origin[2] = 0.0;
  r.queryGrid.spacing[0] = r.queryGrid.spacing[1] = r.queryGrid.spacing[2] = L / 12.0;
  r.queryGrid.dimensions[0] = r.queryGrid.dimensions[1] = r.queryGrid.dimensions[2] = 13; // both faces
  const std::int64_t m = r.queryGrid.count();
  std::vector<double> grid;
  for (std::int64_t q = 0; q < m; ++q)
  {
    const std::int64_t ijk[3] = { q % 13, (q / 13) % 13, q / 169 };
    for (int a = 0; a < 3; ++a)
    {
      grid.push_back(0.0 + double(ijk[a]) * (L / 12.0)); // origin + i * spacing, each rounded
    }
  }
  r.points = Points();
  r.radii = b.radii.data();
  r.smoothingLengthMode = SmoothingLengthMode::Scatter;
  r.mass = c.mass.data();
  r.operation = Operation::Density;
  for (int a = 0; a < 3; ++a)
  {
    r.periodic[a] = true;
    r.boxLengths[a] = L;
  }
  std::vector<float> density(m, -1.0f);
  r.density = density.data();
  Engine engine;
  engine.run(r);
  const RadiiReference ref(b.unrolled, b.unrolledRadii, SmoothingLengthMode::Scatter, &grid);
  std::vector<double> scale;
  const std::vector<double> want = ref.density(Kernel::CubicSpline, &scale);
  expectClose(density, want, "density on the grid", &scale);
  // The grid's faces are one periodic plane: equal values on opposite faces.
  EXPECT_NEAR(density[0], density[12], 1e-5 * density[0]) << "x = 0 and x = L are the same plane";
  EXPECT_GT(density[0], 0.0f) << "the corner sees particles across the faces";
}

TEST(EngineRadii, EveryModeOperationAndKernelMatchesDoubleBruteForce)
{
  const RadiiCloud& rc = radiiCloud();
  const Cloud& c = rc.cloud;
  const std::int64_t n = c.size();
  const auto range = std::minmax_element(rc.radii.begin(), rc.radii.end());
  std::cout << "radii from " << *range.first << " to " << *range.second << " (" << *range.second / *range.first
            << "x)\n";
  ASSERT_GE(*range.second / *range.first, 100.0) << "the cloud should span a 100x range of radii";
  Engine engine;
  for (SmoothingLengthMode mode : { SmoothingLengthMode::Gather, SmoothingLengthMode::Scatter, SmoothingLengthMode::Symmetric })
  {
    const RadiiReference ref(c, rc.radii, mode);
    for (Kernel kernel : { Kernel::CubicSpline, Kernel::QuarticSpline, Kernel::QuinticSpline, Kernel::WendlandC2 })
    {
      std::vector<double> rhoScale;
      const std::vector<double> rho = ref.density(kernel, &rhoScale);
      const std::vector<double> volumes = volumesFrom(c, rho);
      std::vector<double> shepardScale, sphScale, gradientScale, gradientScale3;
      const std::vector<double> shepard = ref.smooth(kernel, c.vector3, 3, {}, &shepardScale);
      const std::vector<double> sph = ref.smooth(kernel, c.scalar, 1, volumes, &sphScale);
      const std::vector<double> gradient = ref.gradient(kernel, c.scalar, 1, volumes, &gradientScale);
      const std::vector<double> gradient3 = ref.gradient(kernel, c.vector3, 3, volumes, &gradientScale3);
      for (Method method : particleMethodsFor(Scenario{ "radii", n, 40.0, 1.0, true, 0 }))
      {
        // The CPU's brute force is quadratic per search: one kernel is enough there.
        if (method == Method::BruteForce && backendUnderTest == Backend::CPU && kernel != Kernel::CubicSpline)
        {
          continue;
        }
        SCOPED_TRACE(std::string(toString(mode)) + ", " + toString(kernel) + ", " + toString(method));
        Request r = baseRequest(c, 0.0, method);
        r.radii = rc.radii.data();
        r.smoothingLengthMode = mode;
        r.kernel = kernel;
        r.mass = c.mass.data();
        if (kernel == Kernel::CubicSpline)
        {
          r.operation = Operation::NeighborCount;
          std::vector<std::int32_t> count(n, -1);
          r.neighborCount = count.data();
          const Report report = engine.run(r);
          EXPECT_EQ(asDouble(count), ref.counts());
          if (report.method == Method::RadiusTree)
          {
            // One search by the whole rule, over every radius at once.
            EXPECT_EQ(report.radiusLevels, 1);
            EXPECT_EQ(report.radiusSearches, 1);
          }
          else
          {
            EXPECT_GE(report.radiusLevels, 7);
            EXPECT_EQ(report.radiusSearches, report.radiusLevels * (mode == SmoothingLengthMode::Symmetric ? 2 : 1));
          }
          r.neighborCount = nullptr;
        }
        r.operation = Operation::Density;
        std::vector<float> density(n, -1.0f);
        r.density = density.data();
        engine.run(r);
        expectClose(density, rho, "density", &rhoScale);

        r.operation = Operation::Smoothing;
        r.normalization = Normalization::Shepard;
        std::vector<float> smoothed(3 * n, -1.0f);
        r.smoothed = { SmoothedArray{ c.vector3.data(), 3, smoothed.data(), "vector" } };
        engine.run(r);
        expectClose(smoothed, shepard, "Shepard smoothing", &shepardScale);

        r.normalization = Normalization::SPH;
        std::vector<float> sphOut(n, -1.0f);
        std::fill(density.begin(), density.end(), -1.0f);
        r.smoothed = { SmoothedArray{ c.scalar.data(), 1, sphOut.data(), "scalar" } };
        engine.run(r);
        expectClose(sphOut, sph, "SPH smoothing", &sphScale);
        expectClose(density, rho, "density of SPH smoothing", &rhoScale);

        r.operation = Operation::Gradient;
        std::vector<float> grad(3 * n, -1.0f), grad3(9 * n, -1.0f);
        std::fill(density.begin(), density.end(), -1.0f);
        r.smoothed = { SmoothedArray{ c.scalar.data(), 1, grad.data(), "scalar" },
          SmoothedArray{ c.vector3.data(), 3, grad3.data(), "vector" } };
        engine.run(r);
        expectClose(grad, gradient, "gradient of a scalar", &gradientScale);
        expectClose(grad3, gradient3, "gradient of a vector", &gradientScale3);
        expectClose(density, rho, "density of the gradient", &rhoScale);
      }
    }
  }
}

TEST(EngineRadii, AFixedRadiusGradientMatchesDoubleBruteForce)
{
  const Cloud c = ngtest::makeCloud("clustered", 3000, 20.0, 77);
  const std::vector<float> radii(c.size(), 1.25f);
  const RadiiReference ref(c, radii, SmoothingLengthMode::Gather);
  Engine engine;
  for (Kernel kernel : { Kernel::CubicSpline, Kernel::WendlandC2 })
  {
    std::vector<double> rhoScale, scale;
    const std::vector<double> rho = ref.density(kernel, &rhoScale);
    const std::vector<double> gradient = ref.gradient(kernel, c.tensor9, 9, volumesFrom(c, rho), &scale);
    for (Method method : particleMethodsFor(Scenario{ "clustered", c.size(), 20.0, 1.25, true, 0 }))
    {
      SCOPED_TRACE(std::string(toString(kernel)) + ", " + toString(method));
      Request r = baseRequest(c, 1.25, method);
      r.kernel = kernel;
      r.mass = c.mass.data();
      r.operation = Operation::Gradient;
      std::vector<float> grad(27 * c.size(), -1.0f), density(c.size(), -1.0f);
      r.smoothed = { SmoothedArray{ c.tensor9.data(), 9, grad.data(), "tensor" } };
      r.density = density.data();
      const Report report = engine.run(r);
      expectClose(grad, gradient, "gradient of 9 components", &scale);
      expectClose(density, rho, "density", &rhoScale);
      EXPECT_EQ(report.radiusLevels, 0);
      EXPECT_EQ(report.radiusSearches, 4); // the density, then 9 components in passes of 4, 4 and 1
    }
  }
}

// Spheres that hold a whole dense core: on the GPU the Radius Tree queues the nodes inside such a
// sphere as ranges and spreads them over all warps (RadiusTree.h, DeferredRanges). Also with every
// node of levels 2 and 3 queued (NEIGHBORGRID_TREE_WARP_BUDGET=0), and with the queues nearly full
// (NEIGHBORGRID_TREE_DEFER_CAPACITY), where the walk takes the rest itself. Each must give the
// double brute force's counts, densities and gradients in every mode.
TEST(EngineRadii, SpheresHoldingADenseCoreMatchDoubleBruteForce)
{
  Cloud c;
  c.name = "dense core in a background";
  c.asFloat = true;
  std::mt19937_64 rng(2311);
  // The core sits well inside one cell of the Morton curve's fourth level (cells of 0.625): its
  // points are consecutive in the tree, so whole nodes of 2048 lie in it.
  const double center[3] = { 2.8125, 6.5625, 4.6875 };
  std::normal_distribution<double> core(0.0, 0.05);
  std::uniform_real_distribution<double> background(0.0, 10.0);
  const std::int64_t coreCount = 6000, n = 7500;
  std::vector<float> radii(n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    for (int a = 0; a < 3; ++a)
    {
      c.xyz.push_back(i < coreCount ? center[a] + core(rng) : background(rng));
    }
    radii[i] = i < coreCount ? 0.03f : 2.0f; // a background sphere near the core holds all of it
  }
  ngtest::finishCloud(c, rng);
  const Method method = backendUnderTest == Backend::CUDA ? Method::RadiusTree : Method::Auto;
  for (const char* knobs : { "", "NEIGHBORGRID_TREE_WARP_BUDGET", "NEIGHBORGRID_TREE_DEFER_CAPACITY" })
  {
    const bool everyNode = std::strcmp(knobs, "NEIGHBORGRID_TREE_WARP_BUDGET") == 0;
    const bool fewRanges = std::strcmp(knobs, "NEIGHBORGRID_TREE_DEFER_CAPACITY") == 0;
    if (*knobs)
    {
      setenv(knobs, everyNode ? "0" : "3", 1);
    }
    setenv("NEIGHBORGRID_TREE_STATS", "1", 1);
    testing::internal::CaptureStderr();
    bool onGpu = false;
    for (SmoothingLengthMode mode : { SmoothingLengthMode::Gather, SmoothingLengthMode::Scatter, SmoothingLengthMode::Symmetric })
    {
      SCOPED_TRACE(std::string(toString(mode)) + (everyNode ? ", every node queued" : fewRanges ? ", room for 3 ranges" : ""));
      const RadiiReference ref(c, radii, mode);
      std::vector<double> rhoScale, gradientScale;
      const std::vector<double> rho = ref.density(Kernel::CubicSpline, &rhoScale);
      const std::vector<double> gradient = ref.gradient(Kernel::CubicSpline, c.vector3, 3, volumesFrom(c, rho), &gradientScale);
      Engine engine;
      Request r = baseRequest(c, 0.0, method);
      r.radii = radii.data();
      r.smoothingLengthMode = mode;
      r.mass = c.mass.data();
      r.operation = Operation::NeighborCount;
      std::vector<std::int32_t> count(n, -1);
      r.neighborCount = count.data();
      onGpu = engine.run(r).backend == Backend::CUDA;
      EXPECT_EQ(asDouble(count), ref.counts());
      r.neighborCount = nullptr;
      r.operation = Operation::Density;
      std::vector<float> density(n, -1.0f);
      r.density = density.data();
      engine.run(r);
      expectClose(density, rho, "density", &rhoScale);
      r.operation = Operation::Gradient;
      std::vector<float> grad3(9 * n, -1.0f);
      r.smoothed = { SmoothedArray{ c.vector3.data(), 3, grad3.data(), "vector" } };
      engine.run(r);
      expectClose(grad3, gradient, "gradient of a vector", &gradientScale);
    }
    const std::string stats = testing::internal::GetCapturedStderr();
    unsetenv("NEIGHBORGRID_TREE_STATS");
    unsetenv("NEIGHBORGRID_TREE_WARP_BUDGET");
    unsetenv("NEIGHBORGRID_TREE_DEFER_CAPACITY");
    if (onGpu)
    {
      // Gather and Symmetric queue ranges (every mode with every node queued); with room for 3,
      // more are asked for than fit.
      int deferred = 0, asked = 0, room = 0, most = 0, searches = 0, searchesDeferring = 0;
      bool overflowed = false;
      for (std::size_t at = stats.find("ranges deferred "); at != std::string::npos;
           at = stats.find("ranges deferred ", at + 1))
      {
        ASSERT_EQ(std::sscanf(stats.c_str() + at, "ranges deferred %d of %d asked (room for %d)", &deferred, &asked, &room), 3);
        most = std::max(most, deferred);
        overflowed = overflowed || asked > room;
        ++searches;
        searchesDeferring += deferred > 0;
      }
      EXPECT_GT(most, 0) << stats;
      EXPECT_EQ(overflowed, fewRanges) << stats;
      if (everyNode)
      {
        EXPECT_EQ(searchesDeferring, searches) << stats;
      }
    }
  }
}

/// `n` points in a box of 6, every fifth on the one before it, and radii of three values.
Cloud equalRadiiCloud(std::int64_t n, std::vector<float>& mixed)
{
  Cloud c;
  c.name = "equal radii and coincident points";
  c.asFloat = true;
  std::mt19937_64 rng(4421 + n);
  std::uniform_real_distribution<double> box(0.0, 6.0);
  const float choices[3] = { 0.35f, 0.7f, 1.4f };
  mixed.resize(n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    for (int a = 0; a < 3; ++a)
    {
      c.xyz.push_back(i % 5 == 4 ? c.xyz[3 * (i - 1) + a] : box(rng));
    }
    mixed[i] = choices[rng() % 3];
  }
  ngtest::finishCloud(c, rng);
  return c;
}

// Symmetric and Scatter count and density walk from one side on the GPU (RadiusTree.h,
// TreePairs): Symmetric takes each pair once, by the side of the larger radius, and adds its terms
// to both sides; Scatter walks from each source's own sphere and adds the terms to the particles it
// reaches. Radii of three values (many equal radii: the lower index takes those), one radius for
// all, and coincident points (pairs at distance 0, but never a point with itself twice), on clouds
// of 1 to 4000 points: every pair must still count exactly once a side.
TEST(EngineRadii, PairsWalkedFromOneSideMatchDoubleBruteForce)
{
  const Method method = backendUnderTest == Backend::CUDA ? Method::RadiusTree : Method::Auto;
  // One point, less than a cluster, a cluster and one more, and many clusters.
  for (std::int64_t n : { 1, 5, 33, 4000 })
  {
    std::vector<float> mixed;
    const Cloud c = equalRadiiCloud(n, mixed);
    const std::vector<float> equal(n, 0.7f);
    for (SmoothingLengthMode mode : { SmoothingLengthMode::Symmetric, SmoothingLengthMode::Scatter })
    {
      for (const std::vector<float>* radii : { static_cast<const std::vector<float>*>(&mixed), &equal })
      {
        SCOPED_TRACE(std::to_string(n) + " points, " + toString(mode) + (radii == &mixed ? ", three radii" : ", one radius"));
        const RadiiReference ref(c, *radii, mode);
        std::vector<double> rhoScale;
        const std::vector<double> rho = ref.density(Kernel::WendlandC2, &rhoScale);
        Engine engine;
        Request r = baseRequest(c, 0.0, method);
        r.radii = radii->data();
        r.smoothingLengthMode = mode;
        r.kernel = Kernel::WendlandC2;
        r.mass = c.mass.data();
        setenv("NEIGHBORGRID_TREE_STATS", "1", 1);
        testing::internal::CaptureStderr();
        r.operation = Operation::NeighborCount;
        std::vector<std::int32_t> count(n, -1);
        r.neighborCount = count.data();
        const bool onGpu = engine.run(r).backend == Backend::CUDA;
        r.neighborCount = nullptr;
        r.operation = Operation::Density;
        std::vector<float> density(n, -1.0f);
        r.density = density.data();
        engine.run(r);
        const std::string stats = testing::internal::GetCapturedStderr();
        unsetenv("NEIGHBORGRID_TREE_STATS");
        EXPECT_EQ(asDouble(count), ref.counts());
        expectClose(density, rho, "density", &rhoScale);
        if (onGpu)
        {
          // Both searches walked from one side.
          const std::string walk = mode == SmoothingLengthMode::Symmetric ? "pairs each once" : "pairs from the sources";
          std::size_t searches = 0;
          for (std::size_t at = stats.find(walk); at != std::string::npos; at = stats.find(walk, at + 1))
          {
            ++searches;
          }
          EXPECT_EQ(searches, 2u) << stats;
        }
      }
    }
  }
}

TEST(EngineRadii, ProbesTakeTheSourcesRadii)
{
  const RadiiCloud& rc = radiiCloud();
  const Cloud& c = rc.cloud;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.0, 40.0);
  std::vector<double> queries(3 * 1500);
  for (std::size_t k = 0; k < queries.size(); ++k)
  {
    // Half near the particles (inside the clusters), half anywhere.
    queries[k] = k % 2 ? u(rng) : c.xyz[(k / 3 * 7 % c.size()) * 3 + k % 3] + 0.01 * (u(rng) - 20.0);
  }
  const std::int64_t m = std::int64_t(queries.size() / 3);
  const RadiiReference ref(c, rc.radii, SmoothingLengthMode::Scatter, &queries);
  const RadiiReference own(c, rc.radii, SmoothingLengthMode::Scatter);
  Engine engine;
  const Kernel kernel = Kernel::QuinticSpline;
  std::vector<double> rhoScale;
  const std::vector<double> rho = ref.density(kernel, &rhoScale);
  std::vector<double> shepardScale, sphScale;
  const std::vector<double> shepard = ref.smooth(kernel, c.scalar, 1, {}, &shepardScale);
  const std::vector<double> sph = ref.smooth(kernel, c.scalar, 1, volumesFrom(c, own.density(kernel)), &sphScale);
  const std::vector<double> counts = ref.counts();
  for (Method method : methodsFor(Scenario{ "radii", c.size(), 40.0, 1.0, true, 0 }))
  {
    SCOPED_TRACE(toString(method));
    Request r = baseRequest(c, 0.0, method);
    r.source = c.points();
    r.points = Points(queries.data(), m);
    r.radii = rc.radii.data();
    r.smoothingLengthMode = SmoothingLengthMode::Scatter;
    r.kernel = kernel;
    r.mass = c.mass.data();
    std::vector<std::uint8_t> valid(m, 7);
    r.valid = valid.data();
    r.nullValue = -99.0f;

    r.operation = Operation::NeighborCount;
    std::vector<std::int32_t> count(m, -1);
    r.neighborCount = count.data();
    engine.run(r);
    EXPECT_EQ(asDouble(count), counts);
    for (std::int64_t q = 0; q < m; ++q)
    {
      ASSERT_EQ(valid[q], counts[q] > 0 ? 1 : 0) << "query " << q;
    }
    r.operation = Operation::Density;
    std::vector<float> density(m, -1.0f);
    r.density = density.data();
    engine.run(r);
    expectClose(density, rho, "density at queries", &rhoScale);

    r.operation = Operation::Smoothing;
    std::vector<float> out(m, -1.0f);
    r.smoothed = { SmoothedArray{ c.scalar.data(), 1, out.data(), "scalar" } };
    r.density = nullptr;
    engine.run(r);
    std::vector<double> want = shepard;
    for (std::int64_t q = 0; q < m; ++q)
    {
      if (counts[q] == 0)
      {
        want[q] = -99.0;
        shepardScale[q] = 1.0;
      }
    }
    expectClose(out, want, "Shepard smoothing at queries", &shepardScale);
    r.normalization = Normalization::SPH;
    engine.run(r);
    want = sph;
    for (std::int64_t q = 0; q < m; ++q)
    {
      if (counts[q] == 0)
      {
        want[q] = -99.0;
        sphScale[q] = 1.0;
      }
    }
    expectClose(out, want, "SPH smoothing at queries", &sphScale);
  }
}

/// A linear field's SPH gradient in the interior of a lattice of spacing 1 (exact, and with
/// +-0.15 jitter per axis), with radii from 2.2 to 3.0 across it: each mode, and a fixed radius
/// 2.6. SPH's difference form is exact for a linear field only where sum_j V_j (x_j - x_i) grad_i W
/// is the identity: on the lattice it is a multiple of it, off by about 1% (the kernel's
/// discrete second moment at h = R / 2), and jitter adds a few percent (measured on the CPU:
/// mean 4.1%, worst 11% in 3D and 19% in 2D). No correction matrix is applied.
TEST(EngineRadii, ALinearFieldsGradientIsCloseToTheTrueGradientInTheInterior)
{
  for (int dimension : { 3, 2 })
  {
    for (double jitterWidth : { 0.0, 0.15 })
    {
      const int side = dimension == 3 ? 22 : 70;
      std::mt19937_64 rng(9);
      std::uniform_real_distribution<double> jitter(-jitterWidth, jitterWidth);
      std::vector<float> xyz, radii, f, mass;
      for (int k = 0; k < (dimension == 3 ? side : 1); ++k)
      {
        for (int j = 0; j < side; ++j)
        {
          for (int i = 0; i < side; ++i)
          {
            const double x = i + jitter(rng), y = j + jitter(rng), z = dimension == 3 ? k + jitter(rng) : 0.0;
            xyz.insert(xyz.end(), { float(x), float(y), float(z) });
            radii.push_back(float(2.2 + 0.8 * i / side));
            f.push_back(float(2.0 * x - 3.0 * y + 0.5 * z));
            mass.push_back(1.0f);
          }
        }
      }
      const std::int64_t n = std::int64_t(radii.size());
      const double truth[3] = { 2.0, -3.0, dimension == 3 ? 0.5 : 0.0 };
      const double truthLength = std::sqrt(truth[0] * truth[0] + truth[1] * truth[1] + truth[2] * truth[2]);
      Engine engine;
      for (int variant = 0; variant < 4; ++variant)
      {
        Request r;
        r.points = Points(xyz.data(), n);
        r.backend = backendUnderTest;
        r.dimension = dimension;
        r.operation = Operation::Gradient;
        r.mass = mass.data();
        if (variant < 3)
        {
          r.radii = radii.data();
          r.smoothingLengthMode = static_cast<SmoothingLengthMode>(variant);
        }
        else
        {
          r.radius = 2.6;
        }
        std::vector<float> grad(3 * n);
        r.smoothed = { SmoothedArray{ f.data(), 1, grad.data(), "f" } };
        engine.run(r);
        double worst = 0, sum = 0;
        int interior = 0;
        for (std::int64_t i = 0; i < n; ++i)
        {
          bool inside = true;
          for (int a = 0; a < dimension; ++a)
          {
            inside = inside && xyz[3 * i + a] >= 6.5f && xyz[3 * i + a] <= float(side) - 7.5f;
          }
          if (!inside)
          {
            continue;
          }
          double e = 0;
          for (int a = 0; a < 3; ++a)
          {
            e += (grad[3 * i + a] - truth[a]) * (grad[3 * i + a] - truth[a]);
          }
          e = std::sqrt(e) / truthLength;
          worst = std::max(worst, e);
          sum += e;
          ++interior;
          if (dimension == 2)
          {
            ASSERT_EQ(grad[3 * i + 2], 0.0f) << "point " << i;
          }
        }
        ASSERT_GT(interior, 100);
        const std::string what = std::to_string(dimension) + "D, jitter " + std::to_string(jitterWidth) + ", " +
          (variant < 3 ? toString(SmoothingLengthMode(variant)) : "fixed radius");
        std::cout << what << ": interior gradient error mean " << sum / interior << ", worst " << worst << " ("
                  << interior << " points)\n";
        // The bound: every interior point within 3% of |grad f| on the lattice; with jitter within
        // 25%, and 5% on average.
        EXPECT_LE(worst, jitterWidth == 0.0 ? 0.03 : 0.25) << what;
        EXPECT_LE(sum / interior, jitterWidth == 0.0 ? 0.02 : 0.05) << what;
      }
    }
  }
}

TEST(EngineRadii, BadRadiiAndModesAreClearErrorsAndLeaveOutputsUntouched)
{
  const Cloud c = ngtest::makeCloud("uniform", 500, 10.0, 3);
  std::vector<float> radii(c.size(), 1.0f);
  std::vector<float> density(c.size(), -5.0f);
  Engine engine;
  Request r = baseRequest(c, 0.0, Method::Auto);
  r.operation = Operation::Density;
  r.density = density.data();
  r.radii = radii.data();
  auto expectError = [&](const std::string& fragment) {
    try
    {
      engine.run(r);
      ADD_FAILURE() << "no error; expected one saying '" << fragment << "'";
    }
    catch (const Error& e)
    {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    for (float v : density)
    {
      ASSERT_EQ(v, -5.0f);
    }
  };
  for (float bad : { 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity() })
  {
    radii[123] = bad;
    expectError("the radius of point 123 is");
    radii[123] = 1.0f;
  }
  // A non-finite coordinate (the GPU's Radius Tree checks the coordinates on the device).
  Cloud broken = c;
  broken.xyz[3 * 77 + 2] = std::numeric_limits<double>::infinity();
  if (broken.asFloat)
  {
    broken.xyzFloat[3 * 77 + 2] = std::numeric_limits<float>::infinity();
  }
  r.points = broken.points();
  expectError("point 77 has a non-finite coordinate");
  r.points = c.points();
  r.source = c.points();
  std::vector<double> q = { 1, 2, 3 };
  r.points = Points(q.data(), 1);
  r.smoothingLengthMode = SmoothingLengthMode::Gather;
  expectError("Scatter");
  r.smoothingLengthMode = SmoothingLengthMode::Symmetric;
  expectError("Scatter");
  r.smoothingLengthMode = SmoothingLengthMode::Scatter;
  r.operation = Operation::Gradient;
  std::vector<float> grad(3, 0.0f);
  r.smoothed = { SmoothedArray{ c.scalar.data(), 1, grad.data(), "s" } };
  expectError("Gradient is computed at the particles");
  r = baseRequest(c, 0.0, Method::Auto);
  r.operation = Operation::Density;
  r.density = density.data();
  r.radii = radii.data();
  r.periodic[0] = true;
  r.boxLengths[0] = 10.0;
  // In a periodic box (radii and boxes compose) a bad radius is named before any image is made.
  for (float bad : { std::numeric_limits<float>::infinity(), 0.0f })
  {
    radii[321] = bad;
    expectError("the radius of point 321 is");
  }
  radii[321] = 1.0f;
  // The Radius Tree computes at the particles only, on the GPU only.
  r = baseRequest(c, 0.0, Method::RadiusTree);
  r.operation = Operation::Density;
  r.density = density.data();
  r.radii = radii.data();
  if (backendUnderTest == Backend::CPU)
  {
    expectError("runs on the CUDA backend only");
  }
  r.source = c.points();
  r.points = Points(q.data(), 1);
  r.smoothingLengthMode = SmoothingLengthMode::Scatter;
  expectError(backendUnderTest == Backend::CPU ? "runs on the CUDA backend only" : "Radius Tree computes at the particles only");
}

int main(int argc, char** argv)
{
  for (int i = 1; i < argc; ++i)
  {
    if (std::strcmp(argv[i], "--backend=cuda") == 0)
    {
      backendUnderTest = Backend::CUDA;
    }
  }
  if (backendUnderTest == Backend::CUDA)
  {
    std::string why;
    if (!Engine::cudaAvailable(&why))
    {
      std::cout << "SKIPPED: the CUDA backend is not usable here: " << why << "\n";
      return 77;
    }
  }
  std::cout << "Backend under test: " << toString(backendUnderTest) << "\n";
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
