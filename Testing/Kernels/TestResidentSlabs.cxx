// Resident slabs (Kernels/src/cuda/ResidentSlabs.h): requests of more points than a run takes,
// cut and gathered on the device. The testing knob NEIGHBORGRID_TEST_POINTS_PER_RUN lowers the
// points a run takes, so that a cloud of a few hundred thousand points takes the path of billions.
//  - SlabCuts.*: the cuts chosen from a histogram (host code, every backend): every slab with its
//    halo, counted exactly by the slab rule, holds no more than its bound and the capacity.
//  - EngineResidentSlabs.*: the CUDA backend's runs against one run of the same engine: count,
//    density, Shepard and SPH smoothing; what it does not take (a probe, a cloud it cannot cut)
//    in the host's slabs; a non-finite coordinate.
#include "Clouds.h"
#include "SlabCuts.h"

#include "NeighborGrid/NeighborGrid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace neighborgrid;
using ngtest::backendUnderTest;

namespace
{

/// The bins the device would give (ResidentSlabs.cu's histogram).
detail::AxisHistogram histogramOf(const std::vector<double>& x, double lo, double hi, int bins)
{
  detail::AxisHistogram h;
  h.lo = lo;
  h.width = (hi - lo) / bins;
  h.counts.assign(std::size_t(bins), 0);
  for (double v : x)
  {
    const double at = (v - lo) * (1.0 / h.width);
    const int b = at <= 0.0 ? 0 : (at >= double(bins - 1) ? bins - 1 : int(at));
    ++h.counts[std::size_t(b)];
  }
  return h;
}

/// Each slab's own and halo points by the device's rule (ResidentSlabs.cu's slabKind), and that
/// every point is owned exactly once.
std::vector<std::uint64_t> slabSizes(const std::vector<double>& x, const detail::SlabCuts& cuts, double halo)
{
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::uint64_t> sizes(std::size_t(cuts.slabs()), 0);
  std::vector<int> owners(x.size(), 0);
  for (int s = 0; s < cuts.slabs(); ++s)
  {
    const double lower = s == 0 ? -inf : cuts.cuts[s - 1];
    const double upper = s + 1 == cuts.slabs() ? inf : cuts.cuts[s];
    for (std::size_t i = 0; i < x.size(); ++i)
    {
      const bool own = x[i] >= lower && x[i] < upper;
      owners[i] += own;
      sizes[std::size_t(s)] += own || (x[i] >= lower - halo && x[i] <= upper + halo);
    }
  }
  EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), std::int64_t(x.size())) << "a point owned twice or never";
  return sizes;
}

} // namespace

TEST(SlabCuts, EverySlabWithItsHaloWithinItsBoundAndTheCapacity)
{
  std::mt19937_64 rng(17);
  int cut = 0;
  for (int trial = 0; trial < 60; ++trial)
  {
    const int kind = trial % 3; // uniform, clusters, one dense spike among uniform points
    const std::size_t n = 20000 + trial * 997;
    std::vector<double> x(n);
    std::uniform_real_distribution<double> u(-50.0, 50.0);
    std::normal_distribution<double> g(0.0, 0.5 + trial % 7);
    for (std::size_t i = 0; i < n; ++i)
    {
      x[i] = kind == 0 ? u(rng) : (kind == 1 ? 20.0 * double(i % 4) - 30.0 + g(rng) : (i % 5 ? u(rng) : 3.0));
    }
    const double lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
    const int bins = 64 << (trial % 5);
    const double halo = 0.01 + 0.4 * (trial % 6);
    const std::uint64_t capacity = n / (2 + trial % 9) + 1000;
    SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(bins) + " bins, halo " + std::to_string(halo));
    const detail::SlabCuts cuts = detail::cutSlabs(histogramOf(x, lo, hi, bins), halo, capacity, 1024);
    if (cuts.cuts.empty())
    {
      continue; // a spike: the host's slabs take it (checked below that this happens, and rarely)
    }
    ++cut;
    ASSERT_GE(cuts.slabs(), 2);
    ASSERT_EQ(cuts.most.size(), std::size_t(cuts.slabs()));
    EXPECT_TRUE(std::is_sorted(cuts.cuts.begin(), cuts.cuts.end()));
    const std::vector<std::uint64_t> sizes = slabSizes(x, cuts, halo);
    for (int s = 0; s < cuts.slabs(); ++s)
    {
      EXPECT_LE(sizes[s], cuts.most[s]) << "slab " << s;
      EXPECT_LE(cuts.most[s], capacity) << "slab " << s;
    }
  }
  EXPECT_GE(cut, 40) << "most clouds should be cut";
}

TEST(SlabCuts, NoCutsWhereOneBinHoldsMoreThanARun)
{
  std::vector<double> x(10000, 1.0);
  for (int i = 0; i < 100; ++i)
  {
    x[std::size_t(i)] = double(i); // a few points spread out, most on one plane
  }
  const detail::SlabCuts cuts = detail::cutSlabs(histogramOf(x, 0.0, 99.0, 256), 0.5, 5000, 1024);
  EXPECT_TRUE(cuts.cuts.empty());
  // And where a run takes them all but one slab is not allowed, still two slabs.
  const detail::SlabCuts two = detail::cutSlabs(histogramOf(x, 0.0, 99.0, 256), 0.5, 20000, 1024);
  EXPECT_EQ(two.slabs(), 2);
}

namespace
{

/// Sets NEIGHBORGRID_TEST_POINTS_PER_RUN for the scope.
struct PointsPerRun
{
  explicit PointsPerRun(std::int64_t points) { setenv("NEIGHBORGRID_TEST_POINTS_PER_RUN", std::to_string(points).c_str(), 1); }
  ~PointsPerRun() { unsetenv("NEIGHBORGRID_TEST_POINTS_PER_RUN"); }
};

bool hasStage(const Report& report, const std::string& prefix)
{
  return std::any_of(report.stages.begin(), report.stages.end(),
    [&](const StageTime& s) { return s.stage.rfind(prefix, 0) == 0; });
}

struct SlabOutcome
{
  Report report;
  std::vector<std::int32_t> counts;
  std::vector<float> density;
  std::vector<double> progress;
};

SlabOutcome runCountAndDensity(const ngtest::Cloud& cloud, double radius, bool masses, std::int64_t perRun)
{
  SlabOutcome out;
  const std::int64_t n = cloud.size();
  Request r;
  r.points = cloud.points();
  r.radius = radius;
  r.backend = backendUnderTest;
  r.progress = [&out](double fraction, const char*) {
    out.progress.push_back(fraction);
    return true;
  };
  std::unique_ptr<PointsPerRun> knob(perRun > 0 ? new PointsPerRun(perRun) : nullptr);
  Engine engine;
  out.counts.assign(std::size_t(n), -1);
  r.operation = Operation::NeighborCount;
  r.neighborCount = out.counts.data();
  const Report counted = engine.run(r);
  EXPECT_EQ(counted.slabs, engine.run(r).slabs) << "a second request on the same engine";
  r.neighborCount = nullptr;
  out.density.assign(std::size_t(n), -1.0f);
  r.operation = Operation::Density;
  r.density = out.density.data();
  r.mass = masses ? cloud.mass.data() : nullptr;
  out.progress.clear(); // the density run's alone
  out.report = engine.run(r);
  EXPECT_EQ(counted.slabs, out.report.slabs);
  return out;
}

} // namespace

TEST(EngineResidentSlabs, CountsAndDensitiesMatchOneRun)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "resident slabs are the CUDA backend's";
  }
  struct Case
  {
    const char* cloud;
    bool asFloat;
    bool masses;
    double radius;
  };
  for (const Case& c : { Case{ "uniform", true, false, 1.0 }, Case{ "clustered", true, true, 0.6 },
         Case{ "uniform", false, true, 1.0 }, Case{ "stacked", true, false, 0.8 } })
  {
    const std::int64_t n = 300000;
    const ngtest::Cloud cloud = ngtest::makeCloud(c.cloud, n, 40.0, 23, c.asFloat);
    SCOPED_TRACE(cloud.name + (c.masses ? ", masses" : ", unit mass"));
    const SlabOutcome one = runCountAndDensity(cloud, c.radius, c.masses, 0);
    const SlabOutcome cut = runCountAndDensity(cloud, c.radius, c.masses, n / 4);
    ASSERT_EQ(one.report.slabs, 1);
    EXPECT_GE(cut.report.slabs, 5) << "a run takes a quarter of the points, with its halo";
    EXPECT_TRUE(hasStage(cut.report, "slab gathers")) << "the resident slabs did not run";
    EXPECT_FALSE(hasStage(cut.report, "slabs: host")) << "the host's slabs ran";
    EXPECT_GT(cut.report.slabHaloPoints, 0);
    EXPECT_EQ(cut.counts, one.counts);
    std::int64_t far = 0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      const double want = one.density[i], got = cut.density[i];
      far += !(std::fabs(got - want) <= 1e-5 * std::fabs(want));
    }
    EXPECT_EQ(far, 0) << "densities beyond 1e-5 of one run's";
    EXPECT_TRUE(std::is_sorted(cut.progress.begin(), cut.progress.end())) << "progress went back";
    EXPECT_EQ(cut.progress.back(), 1.0);
  }
}

TEST(EngineResidentSlabs, SmoothingMatchesOneRun)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "resident slabs are the CUDA backend's";
  }
  const std::int64_t n = 250000;
  for (const bool sph : { false, true })
  {
    const ngtest::Cloud cloud = ngtest::makeCloud(sph ? "clustered" : "uniform", n, 40.0, 31, !sph);
    SCOPED_TRACE(cloud.name + (sph ? ", SPH (a density pass, then the sums with volumes)" : ", Shepard"));
    Request r;
    r.points = cloud.points();
    r.radius = sph ? 0.7 : 1.1;
    r.backend = backendUnderTest;
    r.operation = Operation::Smoothing;
    r.normalization = sph ? Normalization::SPH : Normalization::Shepard;
    r.mass = sph ? cloud.mass.data() : nullptr;
    std::vector<float> want3(3 * n, -1.0f), want1(n, -1.0f), got3(3 * n, -2.0f), got1(n, -2.0f);
    r.smoothed = { SmoothedArray{ cloud.vector3.data(), 3, want3.data() }, SmoothedArray{ cloud.scalar.data(), 1, want1.data() } };
    Engine engine;
    ASSERT_EQ(engine.run(r).slabs, 1);
    r.smoothed[0].output = got3.data();
    r.smoothed[1].output = got1.data();
    PointsPerRun knob(n / 3);
    const Report report = engine.run(r);
    EXPECT_GE(report.slabs, 4);
    EXPECT_TRUE(hasStage(report, "slab gathers")) << "the resident slabs did not run";
    EXPECT_FALSE(hasStage(report, "slabs: host gather")) << "the host's slabs gathered";
    std::int64_t far = 0;
    for (std::int64_t k = 0; k < 3 * n; ++k)
    {
      far += !(std::fabs(got3[k] - want3[k]) <= 1e-5 * std::max(1.0f, std::fabs(want3[k])));
    }
    for (std::int64_t k = 0; k < n; ++k)
    {
      far += !(std::fabs(got1[k] - want1[k]) <= 1e-5 * std::max(1.0f, std::fabs(want1[k])));
    }
    EXPECT_EQ(far, 0) << "smoothed values beyond 1e-5 of one run's";
  }
}

TEST(EngineResidentSlabs, WhatItCannotTakeRunsInTheHostsSlabs)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "resident slabs are the CUDA backend's";
  }
  const std::int64_t n = 200000;
  // Most points on one plane across the longest axis: no cut along it leaves a run small enough.
  ngtest::Cloud plane = ngtest::makeCloud("uniform", n, 40.0, 5);
  for (std::int64_t i = 0; i < n; i += 4)
  {
    if (i % 8)
    {
      plane.xyz[3 * i] = 20.0;
      plane.xyzFloat[3 * i] = 20.0f;
    }
  }
  for (std::int64_t i = 0; i < n; ++i) // x the longest axis
  {
    plane.xyz[3 * i] *= 2.0;
    plane.xyzFloat[3 * i] *= 2.0f;
  }
  const ngtest::Cloud uniform = ngtest::makeCloud("uniform", n, 40.0, 6);
  for (int which = 0; which < 2; ++which)
  {
    const ngtest::Cloud& cloud = which == 0 ? plane : uniform;
    SCOPED_TRACE(which == 0 ? "a dense plane, count" : "density at query points (a probe)");
    Request r;
    r.points = cloud.points();
    r.radius = 1.0;
    r.backend = backendUnderTest;
    std::vector<std::int32_t> counts(n, -1), wantCounts(n, -2);
    std::vector<float> density(n, -1.0f), wantDensity(n, -2.0f);
    std::vector<float> queries(cloud.xyzFloat.begin(), cloud.xyzFloat.end());
    for (float& q : queries)
    {
      q += 0.25f; // the probe's points beside the particles
    }
    if (which == 0)
    {
      r.operation = Operation::NeighborCount;
      r.neighborCount = wantCounts.data();
    }
    else
    {
      r.operation = Operation::Density;
      r.source = cloud.points();
      r.points = Points(queries.data(), n);
      r.density = wantDensity.data();
    }
    Engine engine;
    ASSERT_EQ(engine.run(r).slabs, 1);
    PointsPerRun knob(n / 8);
    if (which == 0)
    {
      r.neighborCount = counts.data();
    }
    else
    {
      r.density = density.data();
    }
    std::vector<double> progress;
    r.progress = [&progress](double fraction, const char*) {
      progress.push_back(fraction);
      return true;
    };
    const Report report = engine.run(r);
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()))
      << "progress went back (where resident slabs declined after their upload)";
    EXPECT_GE(report.slabs, 2);
    EXPECT_FALSE(hasStage(report, "slab gathers")) << "resident slabs ran";
    EXPECT_TRUE(hasStage(report, "slabs: host")) << "the host's slabs did not run";
    if (which == 0)
    {
      EXPECT_EQ(counts, wantCounts);
    }
    else
    {
      std::int64_t far = 0;
      for (std::int64_t k = 0; k < n; ++k)
      {
        far += !(std::fabs(density[k] - wantDensity[k]) <= 1e-5 * std::fabs(wantDensity[k]));
      }
      EXPECT_EQ(far, 0);
    }
  }
}

TEST(EngineResidentSlabs, NamesANonFiniteCoordinateAndWritesNothing)
{
  if (backendUnderTest != Backend::CUDA)
  {
    GTEST_SKIP() << "resident slabs are the CUDA backend's";
  }
  const std::int64_t n = 100000;
  ngtest::Cloud cloud = ngtest::makeCloud("uniform", n, 30.0, 8);
  const std::int64_t bad = n - 3;
  cloud.xyzFloat[3 * bad + 1] = std::numeric_limits<float>::quiet_NaN();
  PointsPerRun knob(n / 3);
  Request r;
  r.points = cloud.points();
  r.radius = 1.0;
  r.backend = backendUnderTest;
  r.operation = Operation::Density;
  std::vector<float> density(n, -7.0f);
  r.density = density.data();
  Engine engine;
  try
  {
    engine.run(r);
    ADD_FAILURE() << "a NaN coordinate was accepted";
  }
  catch (const Error& e)
  {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::count(density.begin(), density.end(), -7.0f), n) << "an output was written";
  // The engine works on afterwards, on good points.
  cloud.xyzFloat[3 * bad + 1] = 1.0f;
  EXPECT_GE(engine.run(r).slabs, 3);
  EXPECT_EQ(std::count_if(density.begin(), density.end(), [](float d) { return !(d > 0.0f); }), 0);
}

// Every backend: slabs map their runs' progress into the whole request's, and the caller sees it
// never go back (a probe in the host's slabs went back by a rounding at a seam before
// Engine::run kept it monotone).
TEST(EngineSlabsProgress, NeverGoesBack)
{
  const std::int64_t n = 200000;
  const ngtest::Cloud cloud = ngtest::makeCloud("uniform", n, 40.0, 12);
  std::vector<float> queries(cloud.xyzFloat.begin(), cloud.xyzFloat.end());
  for (float& q : queries)
  {
    q += 0.25f;
  }
  Request r;
  r.source = cloud.points();
  r.points = Points(queries.data(), n);
  r.radius = 1.0;
  r.backend = backendUnderTest;
  r.operation = Operation::Density;
  std::vector<float> density(n, -1.0f);
  r.density = density.data();
  std::vector<double> progress;
  r.progress = [&progress](double fraction, const char*) {
    progress.push_back(fraction);
    return true;
  };
  PointsPerRun knob(n / 8);
  Engine engine;
  EXPECT_GE(engine.run(r).slabs, 8);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end())) << "progress went back";
  EXPECT_EQ(progress.back(), 1.0);
  EXPECT_EQ(std::count_if(density.begin(), density.end(), [](float d) { return !(d >= 0.0f); }), 0);
}
