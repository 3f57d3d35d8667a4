// Smoothing Length (Operation::SmoothingLength): the distance to each point's k-th nearest other
// point, bit for bit against a double brute force (its square root rounded up to float), on
// open and periodic clouds that stress the search's levels: clusters next to empty space, lattices
// full of equal distances, duplicates, outliers.
#include "Clouds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace neighborgrid;
using ngtest::backendUnderTest;
using ngtest::Cloud;

namespace
{

double exactSquared(const double* a, const double* b)
{
  const double dx = a[0] - b[0], dy = a[1] - b[1], dz = a[2] - b[2];
  return (dx * dx + dy * dy) + dz * dz;
}

/// The smallest float whose square is at least `squared` (a float's square is exact in double).
float roundedUpRoot(double squared)
{
  float r = static_cast<float>(std::sqrt(squared));
  while (double(r) * double(r) < squared)
  {
    r = std::nextafter(r, HUGE_VALF);
  }
  while (r > 0.0f && double(std::nextafter(r, 0.0f)) * double(std::nextafter(r, 0.0f)) >= squared)
  {
    r = std::nextafter(r, 0.0f);
  }
  return r;
}

/// The k-th smallest of the squared distances, rounded as the engine returns it.
float kthOf(std::vector<double>& squared, int k)
{
  std::nth_element(squared.begin(), squared.begin() + (k - 1), squared.end());
  return roundedUpRoot(squared[k - 1]);
}

std::vector<float> bruteForce(const std::vector<double>& xyz, int k)
{
  const std::int64_t n = static_cast<std::int64_t>(xyz.size() / 3);
  std::vector<float> out(n);
  std::vector<double> squared;
  for (std::int64_t i = 0; i < n; ++i)
  {
    squared.clear();
    for (std::int64_t j = 0; j < n; ++j)
    {
      if (j != i)
      {
        squared.push_back(exactSquared(&xyz[3 * i], &xyz[3 * j]));
      }
    }
    out[i] = kthOf(squared, k);
  }
  return out;
}

/// Over every image of a box [0, L)^3 periodic on `periodic` axes (points inside the box): shells
/// of images grow until the k-th lies nearer than the next shell.
std::vector<float> periodicBruteForce(const std::vector<double>& xyz, int k, const bool periodic[3], const double L[3])
{
  const std::int64_t n = static_cast<std::int64_t>(xyz.size() / 3);
  std::vector<float> out(n);
  std::vector<double> squared;
  double shortest = 1e300;
  for (int a = 0; a < 3; ++a)
  {
    shortest = periodic[a] ? std::min(shortest, L[a]) : shortest;
  }
  for (std::int64_t i = 0; i < n; ++i)
  {
    for (int shell = 1;; ++shell)
    {
      squared.clear();
      const int reach[3] = { periodic[0] ? shell : 0, periodic[1] ? shell : 0, periodic[2] ? shell : 0 };
      for (std::int64_t j = 0; j < n; ++j)
      {
        for (int kz = -reach[2]; kz <= reach[2]; ++kz)
          for (int ky = -reach[1]; ky <= reach[1]; ++ky)
            for (int kx = -reach[0]; kx <= reach[0]; ++kx)
            {
              if (j == i && kx == 0 && ky == 0 && kz == 0)
              {
                continue;
              }
              const int m[3] = { kx, ky, kz };
              double y[3];
              for (int a = 0; a < 3; ++a)
              {
                y[a] = m[a] == 0 ? xyz[3 * j + a] : xyz[3 * j + a] + double(m[a]) * L[a];
              }
              squared.push_back(exactSquared(&xyz[3 * i], y));
            }
      }
      if (static_cast<int>(squared.size()) < k)
      {
        continue;
      }
      std::nth_element(squared.begin(), squared.begin() + (k - 1), squared.end());
      // Images beyond this shell lie at least shell * L away along some axis.
      if (std::sqrt(squared[k - 1]) < double(shell) * shortest * 0.999)
      {
        out[i] = roundedUpRoot(squared[k - 1]);
        break;
      }
    }
  }
  return out;
}

Request smoothingLengthRequest(const Cloud& c, int k, std::vector<float>& out)
{
  out.assign(static_cast<std::size_t>(c.size()), -1.0f);
  Request r;
  r.points = c.points();
  r.operation = Operation::SmoothingLength;
  r.neighborTarget = k;
  r.supportRadius = out.data();
  r.backend = backendUnderTest;
  return r;
}

void expectExact(const std::vector<float>& got, const std::vector<float>& want, const std::string& what)
{
  ASSERT_EQ(got.size(), want.size());
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i)
  {
    if (!(got[i] == want[i]))
    {
      first = wrong++ == 0 ? static_cast<std::int64_t>(i) : first;
    }
  }
  EXPECT_EQ(wrong, 0) << what << ": first wrong point " << first << ": "
                      << (first >= 0 ? got[first] : 0.0f) << " instead of " << (first >= 0 ? want[first] : 0.0f);
}

Cloud fromCoordinates(const std::string& name, std::vector<double> xyz, bool asFloat)
{
  Cloud c;
  c.name = name;
  c.asFloat = asFloat;
  c.xyz = std::move(xyz);
  std::mt19937_64 rng(7);
  ngtest::finishCloud(c, rng);
  return c;
}

/// A dense ball next to empty space and a thin background: 1000x the background's density.
Cloud clusterNextToEmpty(std::int64_t inBall, std::int64_t background, bool asFloat)
{
  std::mt19937_64 rng(11);
  std::normal_distribution<double> g(0.0, 0.01);
  std::uniform_real_distribution<double> u(0.0, 10.0);
  std::vector<double> xyz;
  for (std::int64_t i = 0; i < inBall; ++i)
  {
    xyz.push_back(2.0 + g(rng)), xyz.push_back(2.0 + g(rng)), xyz.push_back(2.0 + g(rng));
  }
  for (std::int64_t i = 0; i < background; ++i)
  {
    xyz.push_back(u(rng)), xyz.push_back(u(rng)), xyz.push_back(u(rng));
  }
  xyz.push_back(1e3), xyz.push_back(-5e2), xyz.push_back(7.0); // a far outlier
  return fromCoordinates("cluster-next-to-empty", std::move(xyz), asFloat);
}

} // namespace

TEST(SmoothingLength, MatchesBruteForceOnEveryCloud)
{
  for (const char* kind : { "uniform", "clustered", "duplicates", "stacked", "planar", "outliers", "far" })
  {
    for (bool asFloat : { true, false })
    {
      const Cloud c = ngtest::makeCloud(kind, 2500, 10.0, 301, asFloat);
      for (int k : { 1, 7, 64 })
      {
        std::vector<float> out;
        Engine engine;
        try
        {
          const Report report = engine.run(smoothingLengthRequest(c, k, out));
          EXPECT_EQ(report.backend, backendUnderTest);
          expectExact(out, bruteForce(c.xyz, k), c.name + ", k = " + std::to_string(k));
        }
        catch (const Error& e)
        {
          ADD_FAILURE() << c.name << ", k = " << k << ": " << e.what();
        }
      }
    }
  }
}

TEST(SmoothingLength, DenseClusterNextToEmptySpaceTakesSeveralLevels)
{
  const Cloud c = clusterNextToEmpty(6000, 1500, true);
  std::vector<float> out;
  Engine engine;
  const Report report = engine.run(smoothingLengthRequest(c, 32, out));
  EXPECT_GE(report.radiusLevels, 2);
  expectExact(out, bruteForce(c.xyz, 32), c.name);
}

// A background point beside a cluster core finds its k nearest in the core's near side: the GPU
// descends into a crowded cell's sub-cells nearest first (cuda/KthNeighbor.cu, KthMorton) instead
// of testing every point of the core. NEIGHBORGRID_KTH_STATS says on stderr whether it did.
TEST(SmoothingLength, QueriesBesideACrowdedCoreDescendIntoIt)
{
  std::mt19937_64 rng(29);
  std::normal_distribution<double> core(0.0, 0.01);
  std::uniform_real_distribution<double> u(0.0, 10.0);
  std::vector<double> xyz;
  for (int i = 0; i < 12000; ++i)
  {
    xyz.push_back(2.0 + core(rng)), xyz.push_back(2.0 + core(rng)), xyz.push_back(2.0 + core(rng));
  }
  for (int i = 0; i < 1500; ++i)
  {
    xyz.push_back(u(rng)), xyz.push_back(u(rng)), xyz.push_back(u(rng));
  }
  for (bool asFloat : { true, false })
  {
    const Cloud c = fromCoordinates("crowded core", xyz, asFloat);
    std::vector<float> out;
    Engine engine;
    setenv("NEIGHBORGRID_KTH_STATS", "1", 1);
    testing::internal::CaptureStderr();
    const Report report = engine.run(smoothingLengthRequest(c, 32, out));
    const std::string stats = testing::internal::GetCapturedStderr();
    unsetenv("NEIGHBORGRID_KTH_STATS");
    if (report.backend == Backend::CUDA)
    {
      EXPECT_NE(stats.find("descended"), std::string::npos) << stats;
    }
    expectExact(out, bruteForce(c.xyz, 32), c.name + (asFloat ? " f32" : " f64"));
  }
}

// Every cell of more than one point descended (NEIGHBORGRID_KTH_CROWDED=1): the sub-cell walk
// alone must give the exact k-th on every kind of cloud, open and periodic.
TEST(SmoothingLength, EveryCellDescendedMatchesBruteForce)
{
  setenv("NEIGHBORGRID_KTH_CROWDED", "1", 1);
  // On the GPU a crowded cell is walked in two ways: in a grid built from the Morton order (its
  // cells are runs of it: queries finer than level 0) or in a grid sorted before the Morton order
  // existed (a crowded cell met at a coarser level). The clouds below take both; stats say which.
  setenv("NEIGHBORGRID_KTH_STATS", "1", 1);
  std::string stats;
  bool onGpu = false;
  for (const char* kind : { "uniform", "clustered", "duplicates", "stacked", "outliers", "far" })
  {
    const Cloud c = ngtest::makeCloud(kind, 2000, 10.0, 303, true);
    for (int k : { 1, 7, 64 })
    {
      std::vector<float> out;
      Engine engine;
      try
      {
        testing::internal::CaptureStderr();
        const Report report = engine.run(smoothingLengthRequest(c, k, out));
        stats += testing::internal::GetCapturedStderr();
        onGpu = report.backend == Backend::CUDA;
        expectExact(out, bruteForce(c.xyz, k), c.name + ", k = " + std::to_string(k));
      }
      catch (const Error& e)
      {
        stats += testing::internal::GetCapturedStderr();
        ADD_FAILURE() << c.name << ", k = " << k << ": " << e.what();
      }
    }
  }
  unsetenv("NEIGHBORGRID_KTH_STATS");
  if (onGpu)
  {
    EXPECT_NE(stats.find("queries finer than level 0"), std::string::npos) << stats;
    EXPECT_NE(stats.find("a crowded cell at this level"), std::string::npos) << stats;
  }
  const Cloud dense = clusterNextToEmpty(3000, 800, false);
  std::vector<float> out;
  Engine engine;
  engine.run(smoothingLengthRequest(dense, 16, out));
  expectExact(out, bruteForce(dense.xyz, 16), dense.name);
  const bool periodic[3] = { true, true, true };
  const double L[3] = { 10.0, 10.0, 10.0 };
  std::vector<double> inBox;
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<double> u(0.0, 10.0), corner(0.0, 0.3);
  for (int i = 0; i < 1200; ++i)
  {
    for (int a = 0; a < 3; ++a)
    {
      inBox.push_back(i % 2 ? corner(rng) : u(rng));
    }
  }
  const Cloud box = fromCoordinates("corner cluster in a periodic box", inBox, false);
  Request r = smoothingLengthRequest(box, 24, out);
  for (int a = 0; a < 3; ++a)
  {
    r.periodic[a] = true;
    r.boxLengths[a] = L[a];
  }
  engine.run(r);
  expectExact(out, periodicBruteForce(box.xyz, 24, periodic, L), box.name);
  unsetenv("NEIGHBORGRID_KTH_CROWDED");
}

// Points that do not fit one run (here a Memory Limit) run in slabs: each slab alone, then the
// points whose k-th may lie past their slab over every point within their bound. The results
// are those of one run, bit for bit, open and periodic; and exact against the brute force.
TEST(SmoothingLength, InSlabsMatchesOneRun)
{
  const bool cuda = backendUnderTest == Backend::CUDA;
  const std::int64_t n = cuda ? 3000000 : 60000;
  // The GPU search plans about 33 MB besides its points, the CPU search 48 bytes a point: two or
  // three slabs, each much wider than a k-th distance (as slabs of real data are).
  const std::int64_t limit = cuda ? (std::int64_t(192) << 20) : 48 * n * 2 / 5;
  struct Case
  {
    const char* kind;
    bool periodic;
    int k;
  };
  for (const Case& tc : { Case{ "clustered", false, 64 }, Case{ "duplicates", false, 16 }, Case{ "uniform", true, 32 } })
  {
    Cloud c = ngtest::makeCloud(tc.kind, n, 10.0, 41, true);
    double L[3] = { 0, 0, 0 };
    if (tc.periodic)
    {
      for (int a = 0; a < 3; ++a)
      {
        double lo = HUGE_VAL, hi = -HUGE_VAL;
        for (std::int64_t i = 0; i < n; ++i)
        {
          lo = std::min(lo, c.xyz[3 * i + a]), hi = std::max(hi, c.xyz[3 * i + a]);
        }
        L[a] = hi - lo + 0.5;
      }
    }
    auto runWith = [&](std::int64_t memoryLimit, Report& report) {
      std::vector<float> out;
      Request r = smoothingLengthRequest(c, tc.k, out);
      for (int a = 0; a < 3 && tc.periodic; ++a)
      {
        r.periodic[a] = true;
        r.boxOrigin[a] = -L[a] / 2;
        r.boxLengths[a] = L[a];
      }
      Engine engine;
      engine.setMemoryLimit(memoryLimit);
      report = engine.run(r);
      return out;
    };
    Report whole, sliced;
    const std::vector<float> one = runWith(0, whole);
    const std::vector<float> slabs = runWith(limit, sliced);
    EXPECT_EQ(whole.slabs, 1) << tc.kind;
    EXPECT_GE(sliced.slabs, 2) << tc.kind;
    expectExact(slabs, one, std::string(tc.kind) + (tc.periodic ? ", periodic" : "") + ", in slabs");
  }
  if (!cuda)
  {
    const Cloud c = ngtest::makeCloud("clustered", 5000, 10.0, 43, false);
    std::vector<float> out;
    Engine engine;
    engine.setMemoryLimit(48 * c.size() / 3);
    const Report report = engine.run(smoothingLengthRequest(c, 32, out));
    EXPECT_GE(report.slabs, 2);
    expectExact(out, bruteForce(c.xyz, 32), c.name + ", in slabs");
  }
}

// A few points far from a dense cluster: each one's k-th lies in the cluster, and the box around
// it holds more points than one run takes. It is found on the host, exact (no error, no cap).
TEST(SmoothingLength, InSlabsFarPointsTakeTheHost)
{
  const bool cuda = backendUnderTest == Backend::CUDA;
  const std::int64_t clusterPoints = cuda ? 3000000 : 40000;
  const int farPoints = 8, k = 16;
  Cloud c;
  c.name = "a cluster and far points";
  c.asFloat = false;
  std::mt19937_64 rng(47);
  std::normal_distribution<double> gauss(0.0, 0.1);
  for (std::int64_t i = 0; i < 3 * clusterPoints; ++i)
  {
    c.xyz.push_back(gauss(rng));
  }
  for (int f = 0; f < farPoints; ++f)
  {
    const double far[3] = { 40.0 + 3.0 * f, 20.0 - 6.0 * f, f % 2 ? 30.0 : -30.0 };
    c.xyz.insert(c.xyz.end(), far, far + 3);
  }
  std::vector<float> out;
  Engine engine;
  engine.setMemoryLimit(cuda ? (std::int64_t(192) << 20) : 48 * c.size() * 2 / 5);
  const Report report = engine.run(smoothingLengthRequest(c, k, out));
  EXPECT_GE(report.slabs, 2);
  EXPECT_TRUE(std::any_of(report.stages.begin(), report.stages.end(),
    [](const StageTime& s) { return s.stage.find("on the host") != std::string::npos; }));
  // The far points and a sample of the cluster against the brute force.
  std::vector<std::int64_t> checked;
  for (std::int64_t i = 0; i < c.size(); i = i + 9973 < clusterPoints ? i + 9973 : std::max(i + 1, clusterPoints))
  {
    checked.push_back(i);
  }
  ASSERT_EQ(checked.back(), c.size() - 1);
  std::vector<double> squared;
  for (std::int64_t i : checked)
  {
    squared.clear();
    for (std::int64_t j = 0; j < c.size(); ++j)
    {
      if (j != i)
      {
        squared.push_back(exactSquared(&c.xyz[3 * i], &c.xyz[3 * j]));
      }
    }
    EXPECT_EQ(out[i], kthOf(squared, k)) << "point " << i;
  }
}

TEST(SmoothingLength, LatticeOfEqualDistances)
{
  // A cubic lattice: 6 neighbors at 1, 12 at sqrt 2, 8 at sqrt 3, 6 at 2; far from the origin, so
  // that float coordinates are not exact multiples.
  std::vector<double> xyz;
  for (int z = 0; z < 14; ++z)
    for (int y = 0; y < 14; ++y)
      for (int x = 0; x < 14; ++x)
      {
        xyz.push_back(1000.0 + 0.1 * x), xyz.push_back(-300.0 + 0.1 * y), xyz.push_back(0.1 * z);
      }
  for (bool asFloat : { true, false })
  {
    const Cloud c = fromCoordinates("lattice", xyz, asFloat);
    for (int k : { 6, 7, 18, 19, 26, 32, 100 })
    {
      std::vector<float> out;
      Engine engine;
      engine.run(smoothingLengthRequest(c, k, out));
      expectExact(out, bruteForce(c.xyz, k), "lattice" + std::string(asFloat ? " f32" : " f64") + ", k = " +
          std::to_string(k));
    }
  }
}

TEST(SmoothingLength, AllPointsAtOnePosition)
{
  const Cloud c = fromCoordinates("one position", std::vector<double>(3 * 200, 1.5), true);
  std::vector<float> out;
  Engine engine;
  engine.run(smoothingLengthRequest(c, 64, out));
  expectExact(out, std::vector<float>(200, 0.0f), c.name);
}

TEST(SmoothingLength, PeriodicBoxes)
{
  struct Case
  {
    const char* name;
    std::int64_t n;
    bool periodic[3];
    double L[3];
    int k;
  };
  const Case cases[] = {
    { "cube", 2000, { true, true, true }, { 4.0, 4.0, 4.0 }, 32 },
    { "one axis", 1500, { false, true, false }, { 3.0, 2.0, 5.0 }, 20 },
    { "few points, many images", 6, { true, true, true }, { 1.0, 2.0, 1.5 }, 64 },
    { "flat box", 800, { true, true, false }, { 6.0, 6.0, 0.2 }, 48 },
  };
  for (const Case& pc : cases)
  {
    std::mt19937_64 rng(17);
    std::vector<double> xyz;
    for (std::int64_t i = 0; i < pc.n; ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        // Inside the box, some points clustered near a corner so that their neighbors wrap.
        std::uniform_real_distribution<double> u(0.0, i % 3 == 0 ? 0.05 * pc.L[a] : pc.L[a]);
        xyz.push_back(u(rng));
      }
    }
    const Cloud c = fromCoordinates(pc.name, xyz, false);
    std::vector<float> out;
    Request r = smoothingLengthRequest(c, pc.k, out);
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = pc.periodic[a];
      r.boxLengths[a] = pc.L[a];
    }
    Engine engine;
    const Report report = engine.run(r);
    EXPECT_GT(report.periodicImages, 0) << pc.name;
    expectExact(out, periodicBruteForce(c.xyz, pc.k, pc.periodic, pc.L), pc.name);
  }
}

// A distributed run puts a rank's own points first and asks for their results only; the points
// after them stay neighbors. Open and periodic, the first q results must be those of the full run.
TEST(SmoothingLength, ResultsForTheFirstPointsOnly)
{
  // The clustered cloud moved into the positive octant, the box just around it.
  std::vector<double> xyz = ngtest::makeCloud("clustered", 3000, 1.0, 23, false).xyz;
  double L[3];
  for (int a = 0; a < 3; ++a)
  {
    double lo = xyz[a], hi = xyz[a];
    for (std::size_t i = a; i < xyz.size(); i += 3)
    {
      lo = std::min(lo, xyz[i]), hi = std::max(hi, xyz[i]);
    }
    for (std::size_t i = a; i < xyz.size(); i += 3)
    {
      xyz[i] -= lo;
    }
    L[a] = hi - lo + 1e-3;
  }
  const Cloud c = fromCoordinates("clustered in a box", xyz, false);
  const std::vector<float> full = bruteForce(c.xyz, 24);
  const bool periodic[3] = { true, true, true };
  const std::vector<float> fullPeriodic = periodicBruteForce(c.xyz, 24, periodic, L);
  for (const std::int64_t q : { std::int64_t(0), std::int64_t(1), std::int64_t(777), c.size() })
  {
    for (const bool inBox : { false, true })
    {
      std::vector<float> out;
      Request r = smoothingLengthRequest(c, 24, out);
      out.assign(static_cast<std::size_t>(q) + 1, -7.0f); // one sentinel past the queries
      r.supportRadius = out.data();
      r.smoothingLengthQueries = q;
      for (int a = 0; a < 3 && inBox; ++a)
      {
        r.periodic[a] = true;
        r.boxLengths[a] = L[a];
      }
      Engine engine;
      engine.run(r);
      const std::vector<float>& want = inBox ? fullPeriodic : full;
      const std::string what = std::string(inBox ? "periodic" : "open") + ", first " + std::to_string(q);
      expectExact(std::vector<float>(out.begin(), out.begin() + q), std::vector<float>(want.begin(), want.begin() + q),
        what);
      EXPECT_EQ(out[static_cast<std::size_t>(q)], -7.0f) << what << ": a point past the queries was written";
    }
  }
}

TEST(SmoothingLength, BadRequestsAreClearErrorsAndLeaveTheOutput)
{
  const Cloud c = ngtest::makeCloud("uniform", 100, 1.0, 5, true);
  auto expectError = [&](Request r, const std::string& part) {
    std::vector<float> before(r.supportRadius ? r.supportRadius : nullptr,
      r.supportRadius ? r.supportRadius + c.size() : nullptr);
    Engine engine;
    try
    {
      engine.run(r);
      ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
    }
    catch (const Error& e)
    {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    if (r.supportRadius)
    {
      EXPECT_TRUE(std::equal(before.begin(), before.end(), r.supportRadius)) << "output touched: " << part;
    }
  };
  std::vector<float> out;
  Request r = smoothingLengthRequest(c, 64, out);
  r.neighborTarget = 0;
  expectError(r, "[1, 1024]");
  r.neighborTarget = maxNeighborTarget + 1;
  expectError(r, "[1, 1024]");
  r.neighborTarget = 100;
  expectError(r, "k = 100 other points");
  r.neighborTarget = 8;
  r.smoothingLengthQueries = c.size() + 1;
  expectError(r, "smoothingLengthQueries");
  r.smoothingLengthQueries = -2;
  expectError(r, "smoothingLengthQueries");
  r.smoothingLengthQueries = -1;
  r.method = Method::FENNS;
  expectError(r, "leave the method at Auto");
  r.method = Method::Auto;
  r.source = c.points();
  expectError(r, "without a source");
  r.source = Points();
  std::vector<float> radii(c.size(), 0.1f);
  r.radii = radii.data();
  expectError(r, "takes none");
  r.radii = nullptr;
  r.supportRadius = nullptr;
  expectError(r, "Request::supportRadius");
  r.supportRadius = out.data();
  std::vector<float> bad(c.xyzFloat);
  bad[3 * 17 + 1] = NAN;
  r.points = Points(bad.data(), c.size());
  expectError(r, "point 17");
  r.periodic[0] = true;
  r.boxLengths[0] = 1.0;
  expectError(r, "point 17");
}

TEST(SmoothingLength, FeedsPerParticleRadii)
{
  // The workflow it exists for: Smoothing Length, then density with those radii (Gather): every
  // point then has k neighbors or more (more where distances tie): the radius is rounded up.
  const Cloud c = ngtest::makeCloud("clustered", 3000, 10.0, 77, true);
  std::vector<float> radius;
  Engine engine;
  engine.run(smoothingLengthRequest(c, 16, radius));
  std::vector<std::int32_t> count(c.size());
  Request r;
  r.points = c.points();
  r.radii = radius.data();
  r.operation = Operation::NeighborCount;
  r.neighborCount = count.data();
  r.backend = backendUnderTest;
  engine.run(r);
  std::int64_t fewer = 0;
  for (std::int32_t n : count)
  {
    fewer += n < 16 ? 1 : 0;
  }
  EXPECT_EQ(fewer, 0);
}
