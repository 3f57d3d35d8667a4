// NeighborGrid benchmark: every method side by side, in one run, on the scenarios of the papers'
// tables (uniform random, unsorted points: the first step of a simulation, the worst case).
// For each scenario and method: the median of --runs runs of the device-resident time (the sort
// and search stages, timed with CUDA events; wall time on the CPU backend), the extra device
// memory the method holds, and the average neighbor count (measured, self excluded).
//   CSV (stdout, and --csv=FILE): device,table,n,scene,radius,operation,method,median_ms,
//                                 extra_device_bytes,avg_neighbors
//   stderr: the median of every stage, and the papers' "average neighbors" formula
//           n / (scene / (2 R))^3, which counts particles per cell of size 2R.
// Performance is measured here, never in tests.
#include "Roofline.h"

#include <NeighborGrid/NeighborGrid.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <chrono>
#include <vector>

using namespace neighborgrid;

namespace
{

struct Scenario
{
  std::string table;
  std::int64_t n;
  double scene;
  double radius;
  Operation operation;
  double baselineCellSize = 0; // FENNS Table 2: the baselines use the 18^3 grid of FENNS
  bool clawsAblation = false;  // also CLAWS with each idea switched off in turn
  bool floatOnly = false;      // also every method with the float pair test alone (exactness cost)
  bool outlier = false;        // n - 1 points in [0, scene]^3 and one at (1e6, 1e6, 1e6)
  int runs = 0;                // runs per method when not --runs (0: --runs)
  int smoothedComponents = 0;  // Smoothing: Shepard smoothing of an array of this many components
  float outlierAt = 1e6f;      // the outlier's coordinates (each axis)
  bool lattice = false;        // n = side^3 points on the integer lattice, row-major, in place of uniform ones
  bool faceCentred = false;    // with lattice: n = 4 side^3 points of a face-centred cubic lattice (nearest 2^0.5 apart)
};

/// The rows of FENNS Tables 1-3 and CLAWS Tables 1-2, plus the 4M density row of the issues.
std::vector<Scenario> scenarios(const std::string& table)
{
  const bool all = table == "all";
  std::vector<Scenario> rows;
  const std::int64_t fennsCounts[] = { 1024, 8192, 65536, 524288, 4194304 };
  if (all || table == "fenns1" || table == "fenns2")
  {
    for (const std::string t : { "FENNS-T1", "FENNS-T2" })
    {
      if (!all && ((t == "FENNS-T1") != (table == "fenns1")))
      {
        continue;
      }
      for (std::int64_t n : fennsCounts)
      {
        for (double r : { 0.2, 0.5, 0.8, 1.0 })
        {
          rows.push_back({ t, n, 180.0, r, Operation::Density, t == "FENNS-T2" ? 10.0 : 0.0 });
        }
      }
    }
  }
  if (all || table == "fenns3")
  {
    for (std::int64_t n : fennsCounts)
    {
      for (double r : { 0.3, 0.5, 0.8, 1.0 })
      {
        rows.push_back({ "FENNS-T3", n, 360.0, r, Operation::Density });
      }
    }
  }
  if (all || table == "claws1")
  {
    const std::int64_t m1 = 1048576, m8 = 8388608;
    const struct
    {
      double scene;
      std::int64_t n;
      double r;
    } claws1[] = { { 60, m1, 1.0 }, { 60, m8, 0.5 }, { 90, m1, 1.5 }, { 90, m8, 0.75 }, { 120, m8, 1.0 },
      { 150, m8, 1.25 }, { 180, m8, 1.5 } };
    for (const auto& row : claws1)
    {
      rows.push_back({ "CLAWS-T1", row.n, row.scene, row.r, Operation::Density });
    }
  }
  if (all || table == "claws2")
  {
    for (std::int64_t n : { 2097152, 4194304, 8388608 })
    {
      rows.push_back({ "CLAWS-T2", n, 90.0, 1.5, Operation::Density });
    }
  }
  if (all || table == "issue" || table == "issue2")
  {
    rows.push_back({ "4M-density", 4194304, 90.0, 1.5, Operation::Density, 0.0, true });
  }
  if (all || table == "operations")
  {
    // The 4M row for each operation: Neighbor Count, Density, Shepard smoothing of 1 and 3 components.
    rows.push_back({ "4M-count", 4194304, 90.0, 1.5, Operation::NeighborCount });
    rows.push_back({ "4M-density", 4194304, 90.0, 1.5, Operation::Density });
    for (int components : { 1, 3 })
    {
      Scenario row{ "4M-smoothing-" + std::to_string(components), 4194304, 90.0, 1.5, Operation::Smoothing };
      row.smoothedComponents = components;
      rows.push_back(row);
    }
  }
  if (table == "smoothing")
  {
    // Shepard smoothing of 1 to 4 components on the 4M row: one pass of the search each
    // (OperationPlan.h cuts wider arrays into passes of at most four); then the same with about
    // 24 and 190 neighbors (R = 1 and 2), where Staged Tiles' choice of loop is checked too.
    for (double radius : { 1.5, 1.0, 2.0 })
    {
      const std::string suffix = radius == 1.5 ? "" : radius == 1.0 ? "-R1" : "-R2";
      for (int components : { 1, 2, 3, 4 })
      {
        Scenario row{ "4M-smoothing-" + std::to_string(components) + suffix, 4194304, 90.0, radius, Operation::Smoothing };
        row.smoothedComponents = components;
        rows.push_back(row);
      }
    }
  }
  if (all || table == "exactness")
  {
    // What exact pair decisions cost: every method with and without the double-precision band.
    Scenario row{ "4M-density-exactness", 4194304, 90.0, 1.5, Operation::Density };
    row.floatOnly = true;
    rows.push_back(row);
    // A crystal with R on a neighbor shell: 160^3 lattice points, R = 2 lattice spacings, so that
    // every point has six pairs exactly R apart (32 neighbors), each decided in double; and what
    // those decisions cost there (the float test alone, which is not exact on this row).
    Scenario lattice{ "4M-lattice-count", 4096000, 160.0, 2.0, Operation::NeighborCount };
    lattice.lattice = true;
    lattice.floatOnly = true;
    rows.push_back(lattice);
    // A face-centred cubic crystal of 4 x 100^3 atoms (nearest neighbors 2^0.5 apart, the next
    // shell at 2): its coordination number with the cutoff on the first shell (12 pairs a point
    // within rounding of R) and between the shells, as a LAMMPS analysis takes it.
    Scenario fccShell{ "4M-fcc-shell-count", 4000000, 200.0, std::sqrt(2.0), Operation::NeighborCount };
    fccShell.lattice = fccShell.faceCentred = fccShell.floatOnly = true;
    rows.push_back(fccShell);
    // R 0.4% past the first shell: the same crystal and nearly the same candidates, no pair
    // within rounding of R (what the shell's decisions cost each method).
    Scenario fccPastShell{ "4M-fcc-past-shell", 4000000, 200.0, 1.42, Operation::NeighborCount };
    fccPastShell.lattice = fccPastShell.faceCentred = true;
    rows.push_back(fccPastShell);
    Scenario fccBetween{ "4M-fcc-coordination", 4000000, 200.0, 1.7, Operation::NeighborCount };
    fccBetween.lattice = fccBetween.faceCentred = true;
    rows.push_back(fccBetween);
  }
  if (all || table == "outlier")
  {
    // One far outlier: 1,000,000 points in a cube of side 1e-3 and one at (1e6, 1e6, 1e6).
    Scenario row{ "outlier-1M", 1000001, 1e-3, 1e-5, Operation::NeighborCount };
    row.outlier = true;
    rows.push_back(row);
    // Small sparse clouds (FENNS Table 1's box and R = 1) with one point 2,000 away: the bounds'
    // density (1e-6 and 8e-6 points per cell of R) is one that Auto gives CLAWS, whose first
    // coarse cells are then far too wide and must be corrected.
    for (std::int64_t n : { 8193, 65537 })
    {
      Scenario small{ n == 8193 ? "outlier-8K" : "outlier-64K", n, 180.0, 1.0, Operation::Density };
      small.outlier = true;
      small.outlierAt = 2000.0f;
      rows.push_back(small);
    }
  }
  if (table == "small")
  {
    // Small clouds from sparse to dense, R = 1 (not in the papers' tables, whose small clouds
    // are all sparse): where Auto's rule for clouds of up to 16,384 points stops taking CLAWS.
    for (std::int64_t n : { 1024, 4096, 8192, 16384 })
    {
      for (double perCellOfR : { 1e-3, 1e-2, 0.1, 0.3, 0.5, 1.0, 3.0 })
      {
        rows.push_back({ "small", n, std::cbrt(double(n) / perCellOfR), 1.0, Operation::Density });
      }
    }
  }
  if (table == "scale" || table == "billion")
  {
    // About 80 neighbors per point at every size: box side 90 (N / 4M)^(1/3), R = 1.5.
    std::vector<std::int64_t> sizes{ 1048576, 4194304, 16777216, 67108864, 268435456 };
    if (table == "billion")
    {
      sizes = { 1000000000 };
    }
    for (std::int64_t n : sizes)
    {
      Scenario row{ table == "billion" ? "billion" : "scale", n, 90.0 * std::cbrt(double(n) / 4194304.0), 1.5,
        Operation::Density };
      row.runs = n >= 268435456 ? 5 : 0;
      rows.push_back(row);
    }
  }
  if (table == "cpu")
  {
    // The CPU backend's target (issue 21): 1M points, about 80 neighbors each, count and density.
    const std::int64_t n = 1048576;
    const double scene = 90.0 * std::cbrt(double(n) / 4194304.0);
    rows.push_back({ "1M-count", n, scene, 1.5, Operation::NeighborCount });
    rows.push_back({ "1M-density", n, scene, 1.5, Operation::Density });
  }
  if (all || table == "sparser")
  {
    // Uniform points at 0.05 to 4 points per cell of R over the box (about 0.2 to 17
    // neighbors), density: where Auto's rules move from CLAWS to the baselines and to Staged
    // Tiles, and where Staged Tiles moves from a search by point to tiles (no row of the papers'
    // tables of a million points or more lies between 0.05 and 0.37 or between 1 and 4.85 points
    // per cell). 4M points at every density, 1M and 16M at seven.
    for (std::int64_t n : { std::int64_t(1048576), std::int64_t(4194304), std::int64_t(16777216) })
    {
      for (double perCell : { 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0 })
      {
        const bool everyDensity = n == 4194304;
        if (!everyDensity && perCell != 0.1 && perCell != 0.25 && perCell != 0.5 && perCell != 1.0 && perCell != 1.5 &&
          perCell != 2.0 && perCell != 3.0)
        {
          continue;
        }
        const double scene = 90.0 * std::cbrt(double(n) / 4194304.0);
        char name[48];
        std::snprintf(name, sizeof name, "%s-%g-per-cell", n == 1048576 ? "1M" : n == 4194304 ? "4M" : "16M", perCell);
        rows.push_back({ name, n, scene, scene * std::cbrt(perCell / double(n)), Operation::Density });
      }
    }
  }
  if (table == "smoke")
  {
    rows.push_back({ "smoke", 65536, 20.0, 1.0, Operation::Density });
  }
  return rows;
}

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.empty() ? 0.0 : (v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]));
}

bool isDeviceResident(const std::string& stage)
{
  return stage != "coordinates" && stage != "upload" && stage != "download" && stage != "copy to caller" &&
    stage != "periodic images" && stage != "radius sums" && stage.rfind("slabs", 0) != 0; // on the host
}

Method parseMethod(const std::string& name)
{
  if (name == "counting-sort") return Method::CountingSort;
  if (name == "radix-sort") return Method::RadixSort;
  if (name == "fenns") return Method::FENNS;
  if (name == "claws") return Method::CLAWS;
  if (name == "bayraktar") return Method::Bayraktar;
  if (name == "staged-tiles") return Method::StagedTiles;
  if (name == "brute-force") return Method::BruteForce;
  if (name == "auto") return Method::Auto;
  std::fprintf(stderr, "unknown method '%s'\n", name.c_str());
  std::exit(2);
}

/// --operations=N: every operation once on N uniform random points (about 80 neighbors, Auto):
/// Neighbor Count, Density, Shepard smoothing of a 3-component array, SPH smoothing of a scalar.
/// Prints the device-resident time, the engine's end-to-end time and the extra device bytes per
/// point of each, and checks that every result is finite and plausible.
int runEveryOperation(std::int64_t n, Backend backend)
{
  const double scene = 90.0 * std::cbrt(double(n) / 4194304.0);
  std::vector<float> xyz(3 * std::size_t(n));
  std::vector<float> scalar(static_cast<std::size_t>(n));
  std::vector<float> vector3(3 * std::size_t(n));
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
  {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(777 + t);
      std::uniform_real_distribution<float> u(0.0f, static_cast<float>(scene));
      for (std::int64_t i = n * t / threads; i < n * (t + 1) / threads; ++i)
      {
        for (int a = 0; a < 3; ++a)
        {
          xyz[3 * i + a] = u(rng);
        }
        scalar[i] = 1.0f + xyz[3 * i] / static_cast<float>(scene);
        for (int a = 0; a < 3; ++a)
        {
          vector3[3 * i + a] = xyz[3 * i + a];
        }
      }
    });
  }
  for (auto& thread : pool)
  {
    thread.join();
  }
  Engine engine;
  std::vector<std::int32_t> counts;
  std::vector<float> density, smoothed;
  const char* names[] = { "Neighbor Count", "Density", "Shepard smoothing, 3 components", "SPH smoothing, 1 component" };
  for (int k = 0; k < 4; ++k)
  {
    Request r;
    r.points = Points(xyz.data(), n);
    r.radius = 1.5;
    r.backend = backend;
    if (k == 0)
    {
      counts.assign(std::size_t(n), -1);
      r.operation = Operation::NeighborCount;
      r.neighborCount = counts.data();
    }
    else if (k == 1)
    {
      density.assign(std::size_t(n), -1.0f);
      r.operation = Operation::Density;
      r.density = density.data();
    }
    else
    {
      r.operation = Operation::Smoothing;
      r.normalization = k == 2 ? Normalization::Shepard : Normalization::SPH;
      smoothed.assign(std::size_t(n) * (k == 2 ? 3 : 1), NAN);
      r.smoothed = { { k == 2 ? vector3.data() : scalar.data(), k == 2 ? 3 : 1, smoothed.data(), "field" } };
      if (k == 3)
      {
        density.assign(std::size_t(n), -1.0f);
        r.density = density.data();
      }
    }
    try
    {
      const auto began = std::chrono::steady_clock::now();
      const Report report = engine.run(r);
      const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
      double resident = 0;
      for (const auto& stage : report.stages)
      {
        resident += isDeviceResident(stage.stage) ? stage.milliseconds : 0.0;
      }
      // Plausibility: counts near 80, densities positive, smoothed values inside the field's range.
      std::int64_t bad = 0;
      double mean = 0;
      for (std::int64_t i = 0; i < n; ++i)
      {
        const double v = k == 0 ? double(counts[i]) : (k == 1 ? double(density[i]) : double(smoothed[std::size_t(i) * (k == 2 ? 3 : 1)]));
        bad += !std::isfinite(v) || v < 0.0 || (k >= 2 && v > scene + 1.0);
        mean += v;
      }
      std::printf("%s, %lld points, %s: device-resident %.1f ms, end to end %.1f ms, %.1f extra device bytes/point, "
                  "mean %.3f, %lld implausible values\n",
        names[k], static_cast<long long>(n), toString(report.method), resident, wall,
        double(report.extraDeviceBytes) / double(n), mean / double(n), static_cast<long long>(bad));
    }
    catch (const Error& error)
    {
      std::printf("%s, %lld points: %s\n", names[k], static_cast<long long>(n), error.what());
    }
    std::fflush(stdout);
  }
  return 0;
}

/// `runs` runs of r: device-resident and wall milliseconds of each, the last report; false (and
/// the error printed) when the method fails.
bool timedRuns(Engine& engine, const Request& r, int runs, std::vector<double>& resident, std::vector<double>& wall,
  Report& report)
{
  try
  {
    for (int k = 0; k < runs; ++k)
    {
      const auto began = std::chrono::steady_clock::now();
      report = engine.run(r);
      wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
      double t = 0;
      for (const auto& stage : report.stages)
      {
        t += isDeviceResident(stage.stage) ? stage.milliseconds : 0.0;
      }
      resident.push_back(t);
    }
    return true;
  }
  catch (const Error& error)
  {
    std::fprintf(stderr, "%s: %s\n", toString(r.method), error.what());
    return false;
  }
}

/// --volume=N: density of 4M uniform random particles (box 90, R = 1.5, about 80 neighbors each)
/// on an N^3 grid over their bounds padded by R (SPH Volume Interpolator's use), every method of
/// --methods side by side: the median device-resident time (sort and query passes) and the
/// median end-to-end time of Engine::run with the result in host memory.
/// CSV: device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,extra_device_bytes,
///      valid_fraction
int runVolume(std::int64_t side, const std::vector<Method>& methods, Backend backend, int runs, std::ofstream& csv)
{
  const std::int64_t n = 4194304;
  const double scene = 90.0, radius = 1.5;
  std::vector<float> xyz(3 * std::size_t(n));
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<float> u(0.0f, static_cast<float>(scene));
  for (auto& v : xyz)
  {
    v = u(rng);
  }
  Request r;
  r.source = Points(xyz.data(), n);
  r.radius = radius;
  r.operation = Operation::Density;
  r.backend = backend;
  for (int a = 0; a < 3; ++a)
  {
    r.queryGrid.origin[a] = -radius;
    r.queryGrid.spacing[a] = (scene + 2 * radius) / double(side - 1);
    r.queryGrid.dimensions[a] = side;
  }
  const std::size_t cells = std::size_t(side) * side * side;
  std::vector<float> density(cells);
  std::vector<std::uint8_t> valid(cells);
  r.density = density.data();
  r.valid = valid.data();
  const char* header = "device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,extra_device_bytes,valid_fraction\n";
  std::printf("%s", header);
  if (csv)
  {
    csv << header;
  }
  Engine engine;
  for (Method method : methods)
  {
    r.method = method;
    std::vector<double> resident, wall;
    Report report;
    if (!timedRuns(engine, r, runs, resident, wall, report))
    {
      continue;
    }
    std::int64_t validCount = 0;
    for (std::uint8_t v : valid)
    {
      validCount += v;
    }
    std::ostringstream line;
    line << report.device << ",volume-" << side << "^3," << n << "," << scene << "," << radius << ",Density,"
         << toString(report.method) << (method == Method::Auto ? " (Auto)" : "") << "," << median(resident) << ","
         << median(wall) << "," << report.extraDeviceBytes << "," << double(validCount) / double(cells) << "\n";
    std::printf("%s", line.str().c_str());
    std::fflush(stdout);
    if (csv)
    {
      csv << line.str();
    }
    for (const auto& stage : report.stages)
    {
      std::fprintf(stderr, "  %s %s: %.2f ms\n", toString(report.method), stage.stage.c_str(), stage.milliseconds);
    }
  }
  return 0;
}

/// --periodic: density of 4M uniform random particles (box 90, R = 1.5, about 80 neighbors each)
/// in an open box and in the periodic box [0, 90)^3, every method of --methods side by side:
/// median device-resident time and end to end (the images are built on the host, in the
/// end-to-end time). CSV: device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,
///      extra_device_bytes,periodic_images
int runPeriodicTable(const std::vector<Method>& methods, Backend backend, int runs, std::ofstream& csv)
{
  const std::int64_t n = 4194304;
  const double scene = 90.0, radius = 1.5;
  std::vector<float> xyz(3 * std::size_t(n));
  std::mt19937_64 rng(4243);
  std::uniform_real_distribution<float> u(0.0f, static_cast<float>(scene));
  for (auto& v : xyz)
  {
    v = u(rng);
  }
  std::vector<float> density(static_cast<std::size_t>(n));
  const char* header =
    "device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,extra_device_bytes,periodic_images\n";
  std::printf("%s", header);
  if (csv)
  {
    csv << header;
  }
  Engine engine;
  for (bool periodic : { false, true })
  {
    Request r;
    r.points = Points(xyz.data(), n);
    r.radius = radius;
    r.operation = Operation::Density;
    r.backend = backend;
    r.density = density.data();
    for (int a = 0; a < 3; ++a)
    {
      r.periodic[a] = periodic;
      r.boxLengths[a] = scene;
    }
    for (Method method : methods)
    {
      r.method = method;
      std::vector<double> resident, wall;
      Report report;
      if (!timedRuns(engine, r, runs, resident, wall, report))
      {
        continue;
      }
      std::ostringstream line;
      line << report.device << "," << (periodic ? "periodic" : "open") << "," << n << "," << scene << "," << radius
           << ",Density," << toString(report.method) << (method == Method::Auto ? " (Auto)" : "") << ","
           << median(resident) << "," << median(wall) << "," << report.extraDeviceBytes << ","
           << report.periodicImages << "\n";
      std::printf("%s", line.str().c_str());
      std::fflush(stdout);
      if (csv)
      {
        csv << line.str();
      }
      for (const auto& stage : report.stages)
      {
        std::fprintf(stderr, "  %s %s %s: %.2f ms\n", periodic ? "periodic" : "open", toString(report.method),
          stage.stage.c_str(), stage.milliseconds);
      }
    }
  }
  return 0;
}

/// n uniform random float points in [0, scene)^3, drawn on all cores (a billion take seconds):
/// thread t draws its share with the seed seed + seedStride * t.
std::vector<float> uniformCloud(std::int64_t n, double scene, std::uint64_t seed, std::uint64_t seedStride = 7919)
{
  std::vector<float> xyz(3 * std::size_t(n));
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
  {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(seed + seedStride * t);
      std::uniform_real_distribution<float> u(0.0f, static_cast<float>(scene));
      for (std::int64_t k = 3 * n * t / threads; k < 3 * n * (t + 1) / threads; ++k)
      {
        xyz[k] = u(rng);
      }
    });
  }
  for (auto& thread : pool)
  {
    thread.join();
  }
  return xyz;
}

/// n = side^3 points on the integer lattice (spacing 1), row-major along x, then y, then z; or,
/// faceCentred, n = 4 side^3 points: cubes of side 2 with atoms at their corners and face
/// centres, each cube's four atoms together, cubes row-major.
std::vector<float> latticeCloud(std::int64_t n, bool faceCentred)
{
  const int sites = faceCentred ? 4 : 1;
  const std::int64_t side = std::llround(std::cbrt(double(n / sites)));
  if (side * side * side * sites != n)
  {
    std::fprintf(stderr, "a lattice row needs %s cube number of points, not %lld\n", faceCentred ? "four times a" : "a",
      static_cast<long long>(n));
    std::exit(2);
  }
  const int offsets[4][3] = { { 0, 0, 0 }, { 1, 1, 0 }, { 1, 0, 1 }, { 0, 1, 1 } };
  const int scale = faceCentred ? 2 : 1;
  std::vector<float> xyz(3 * std::size_t(n));
  for (std::int64_t i = 0; i < n; ++i)
  {
    const std::int64_t cube = i / sites;
    const int* offset = offsets[i % sites];
    xyz[3 * i] = static_cast<float>(scale * (cube % side) + offset[0]);
    xyz[3 * i + 1] = static_cast<float>(scale * ((cube / side) % side) + offset[1]);
    xyz[3 * i + 2] = static_cast<float>(scale * (cube / (side * side)) + offset[2]);
  }
  return xyz;
}

/// --slabs=N: density of N uniform random points (box 90 (N / 4M)^(1/3), R = 1.5, about 80
/// neighbors), Auto, in one Engine::run that cuts it into slabs where it does not fit (N above
/// 2^31 - 2, or --memory-limit=BYTES). On the GPU, N above 2^31 - 2 runs in resident slabs
/// (cut on the device) where they fit, and in the host's slabs under --memory-limit. Checked: every density written and positive, and the points
/// of three boxes of side 8 that straddle the slab cuts against a run on those boxes alone (with
/// their points within R), to 1e-5. CSV: device,table,n,scene,radius,operation,method,median_ms,
/// end_to_end_ms,slabs,slab_halo_points,checked_points,max_relative_difference
int runSlabs(std::int64_t n, std::int64_t memoryLimit, int runs, std::ofstream& csv)
{
  const double scene = 90.0 * std::cbrt(double(n) / 4194304.0), radius = 1.5;
  auto began = std::chrono::steady_clock::now();
  std::vector<float> xyz = uniformCloud(n, scene, 2026);
  std::fprintf(stderr, "slabs: %lld points drawn in %.1f s\n", static_cast<long long>(n),
    std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  std::vector<float> density(static_cast<std::size_t>(n), -1.0f);
  Engine engine;
  engine.setMemoryLimit(memoryLimit);
  Request r;
  r.points = Points(xyz.data(), n);
  r.radius = radius;
  r.operation = Operation::Density;
  r.density = density.data();
  std::vector<double> resident, wall;
  Report report;
  if (!timedRuns(engine, r, runs, resident, wall, report))
  {
    return 1;
  }
  // Every density written and positive; the points of boxes of side 8 at the centre of the
  // x = 1/3, 1/2, 2/3 planes (the cuts of 2 or 3 slabs along x), with the points within R of them,
  // run alone, and their inner points compared. One pass over the points, on all cores.
  const double at[3] = { 1.0 / 3.0, 0.5, 2.0 / 3.0 };
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  struct Found
  {
    std::int64_t bad = 0;
    std::vector<std::int64_t> near[3];
  };
  std::vector<Found> found(threads);
  {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
    {
      pool.emplace_back([&, t] {
        for (std::int64_t i = n * t / threads; i < n * (t + 1) / threads; ++i)
        {
          found[t].bad += !(density[i] > 0.0f);
          for (int b = 0; b < 3; ++b)
          {
            const double centre[3] = { at[b] * scene, 0.5 * scene, 0.5 * scene };
            bool near = true;
            for (int a = 0; a < 3; ++a)
            {
              near = near && std::fabs(double(xyz[3 * i + a]) - centre[a]) <= 4.0 + 1.01 * radius;
            }
            if (near)
            {
              found[t].near[b].push_back(i);
            }
          }
        }
      });
    }
    for (auto& thread : pool)
    {
      thread.join();
    }
  }
  std::int64_t bad = 0, checked = 0;
  double worst = 0.0;
  for (const Found& f : found)
  {
    bad += f.bad;
  }
  for (int b = 0; b < 3; ++b)
  {
    const double centre[3] = { at[b] * scene, 0.5 * scene, 0.5 * scene };
    std::vector<float> local;
    std::vector<std::int64_t> indices;
    for (const Found& f : found)
    {
      for (std::int64_t i : f.near[b])
      {
        local.insert(local.end(), &xyz[3 * i], &xyz[3 * i] + 3);
        indices.push_back(i);
      }
    }
    std::vector<float> localDensity(indices.size());
    Request check = r;
    check.points = Points(local.data(), static_cast<std::int64_t>(indices.size()));
    check.density = localDensity.data();
    Engine alone;
    alone.run(check);
    for (std::size_t k = 0; k < indices.size(); ++k)
    {
      bool inside = true;
      for (int a = 0; a < 3; ++a)
      {
        inside = inside && std::fabs(double(local[3 * k + a]) - centre[a]) <= 4.0;
      }
      if (inside)
      {
        const double want = localDensity[k], got = density[indices[k]];
        worst = std::max(worst, std::fabs(got - want) / std::fabs(want));
        ++checked;
      }
    }
  }
  std::ostringstream line;
  line << report.device << ",slabs," << n << "," << scene << "," << radius << ",Density," << toString(report.method)
       << " (Auto)," << median(resident) << "," << median(wall) << "," << report.slabs << ","
       << report.slabHaloPoints << "," << checked << "," << worst << "\n";
  const char* header = "device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,slabs,slab_halo_points,"
                       "checked_points,max_relative_difference\n";
  std::printf("%s%s", header, line.str().c_str());
  if (csv)
  {
    csv << header << line.str();
  }
  for (const auto& stage : report.stages)
  {
    std::fprintf(stderr, "  slabs %s: %.1f ms\n", stage.stage.c_str(), stage.milliseconds);
  }
  std::fprintf(stderr, "slabs: %lld densities not positive, %lld checked, worst relative difference %.3g\n",
    static_cast<long long>(bad), static_cast<long long>(checked), worst);
  return bad == 0 && worst <= 1e-5 && checked > 0 ? 0 : 1;
}

/// --ranks=P with --n=N: the distributed density row without MPI on the device machine: P threads
/// stand in for P ranks, each with its own Engine on its own GPU (setCudaDevice(p)) and its slab
/// of x with its halo (the points within R), as RedistributeDataSet and the exchange of
/// Filters/NeighborhoodDistributed.cxx leave it. Timed: the ranks' runs side by side (wall time of
/// all, and the slowest rank's device-resident time); not timed: building the slabs and halos on
/// the host, which a real run does in the MPI exchange. CSV: device,table,n,scene,radius,operation,
/// method,median_ms,end_to_end_ms,ranks,halo_points
int runRanks(std::int64_t n, int ranks, int runs, std::ofstream& csv)
{
  const double scene = 90.0 * std::cbrt(double(n) / 4194304.0), radius = 1.5;
  const std::vector<float> xyz = uniformCloud(n, scene, 2027);
  struct Rank
  {
    std::vector<float> xyz;
    std::vector<float> density;
    std::int64_t own = 0;
    Engine engine;
    Report report;
    double wallMs = 0;
  };
  std::vector<Rank> rank(ranks);
  std::int64_t halo = 0;
  for (int p = 0; p < ranks; ++p)
  {
    const double lo = scene * p / ranks, hi = scene * (p + 1) / ranks;
    Rank& k = rank[p];
    std::vector<float> near;
    for (std::int64_t i = 0; i < n; ++i)
    {
      const double x = xyz[3 * i];
      if ((x >= lo || p == 0) && (x < hi || p == ranks - 1))
      {
        k.xyz.insert(k.xyz.end(), &xyz[3 * i], &xyz[3 * i] + 3);
      }
      else if (x >= lo - radius && x <= hi + radius)
      {
        near.insert(near.end(), &xyz[3 * i], &xyz[3 * i] + 3);
      }
    }
    k.own = static_cast<std::int64_t>(k.xyz.size() / 3);
    k.xyz.insert(k.xyz.end(), near.begin(), near.end());
    halo += static_cast<std::int64_t>(near.size() / 3);
    k.density.resize(k.xyz.size() / 3);
    k.engine.setCudaDevice(p % std::max(1, Engine::cudaDeviceCount()));
  }
  auto runAll = [&] {
    std::vector<std::thread> pool;
    for (int p = 0; p < ranks; ++p)
    {
      pool.emplace_back([&, p] {
        Rank& k = rank[p];
        Request r;
        r.points = Points(k.xyz.data(), static_cast<std::int64_t>(k.xyz.size() / 3));
        r.radius = radius;
        r.operation = Operation::Density;
        r.backend = Backend::CUDA;
        r.density = k.density.data();
        const auto began = std::chrono::steady_clock::now();
        k.report = k.engine.run(r);
        k.wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
      });
    }
    for (auto& t : pool)
    {
      t.join();
    }
  };
  runAll(); // warm-up
  std::vector<double> resident, wall;
  for (int run = 0; run < runs; ++run)
  {
    const auto began = std::chrono::steady_clock::now();
    runAll();
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    double slowest = 0;
    for (const Rank& k : rank)
    {
      double t = 0;
      for (const auto& stage : k.report.stages)
      {
        t += isDeviceResident(stage.stage) ? stage.milliseconds : 0.0;
      }
      slowest = std::max(slowest, t);
    }
    resident.push_back(slowest);
  }
  for (int p = 0; p < ranks; ++p)
  {
    std::fprintf(stderr, "rank %d: %s, %lld own points, %lld with halo, %s\n", p, rank[p].report.device.c_str(),
      static_cast<long long>(rank[p].own), static_cast<long long>(rank[p].xyz.size() / 3),
      toString(rank[p].report.method));
  }
  std::ostringstream line;
  line << rank[0].report.device << ",ranks," << n << "," << scene << "," << radius << ",Density,"
       << toString(rank[0].report.method) << " (Auto)," << median(resident) << "," << median(wall) << "," << ranks
       << "," << halo << "\n";
  const char* header = "device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,ranks,halo_points\n";
  std::printf("%s%s", header, line.str().c_str());
  if (csv)
  {
    csv << header << line.str();
  }
  return 0;
}

/// One headline figure: a name of Testing/Benchmarks/headline-H100.csv and its runs.
struct HeadlineFigure
{
  std::string name;
  std::vector<double> milliseconds;
};

void writeHeadline(const std::vector<HeadlineFigure>& figures, std::ofstream& csv)
{
  for (const HeadlineFigure& f : figures)
  {
    std::ostringstream line;
    line << f.name << ',' << median(f.milliseconds) << '\n';
    std::printf("%s", line.str().c_str());
    if (csv)
    {
      csv << line.str();
    }
  }
  std::fflush(stdout);
  if (csv)
  {
    csv.flush();
  }
}

std::string methodSlug(Method m)
{
  std::string slug = toString(m);
  std::transform(slug.begin(), slug.end(), slug.begin(), [](char c) { return c == ' ' ? '_' : char(std::tolower(c)); });
  return slug;
}

/// Requests run in turns, run by run (drift of clocks or temperature touches them alike); per
/// request the device-resident and the end-to-end median become two figures.
struct HeadlineSeries
{
  std::string device, endToEnd; // figure names
  Request request;
  std::vector<double> resident, wall;
  std::vector<double> coordinatesMs, downloadMs; // the two transfer stages, run by run
};

double stageMs(const Report& report, const char* name)
{
  double ms = 0;
  for (const auto& stage : report.stages)
  {
    ms += stage.stage == name ? stage.milliseconds : 0.0;
  }
  return ms;
}

/// The achieved rates of a series' transfers (issue 21: "report the achieved upload and download
/// bandwidth"): the caller's coordinates to the device, whose stage also finds their bounds
/// there, and the results back (density, and the valid flags of a volume).
void printTransferRates(const HeadlineSeries& s)
{
  const Request& r = s.request;
  const Points& points = r.points.count > 0 ? r.points : r.source;
  const double up = 3.0 * double(points.count) * (points.type == ScalarType::Float32 ? 4.0 : 8.0);
  const QueryGrid& g = r.queryGrid;
  const double results = g.dimensions[0] > 0 ? double(g.dimensions[0]) * g.dimensions[1] * g.dimensions[2] : double(points.count);
  const double down = results * (4.0 + (r.valid ? 1.0 : 0.0));
  const double upMs = median(s.coordinatesMs), downMs = median(s.downloadMs);
  std::fprintf(stderr, "  %s transfers (medians): coordinates %.1f MB in %.3f ms, %.1f GB/s (the stage includes the bounds); results %.1f MB in %.3f ms, %.1f GB/s\n",
    s.endToEnd.c_str(), up / 1e6, upMs, up / (upMs * 1e6), down / 1e6, downMs, down / (downMs * 1e6));
}

bool runInTurns(Engine& engine, std::vector<HeadlineSeries>& series, int runs, std::vector<HeadlineFigure>& figures)
{
  for (HeadlineSeries& s : series)
  {
    Report report;
    std::vector<double> resident, wall;
    if (!timedRuns(engine, s.request, 1, resident, wall, report)) // warm-up: allocations, pinned ring
    {
      return false;
    }
    std::fprintf(stderr, "headline %s: %s on %s\n", s.endToEnd.c_str(), toString(report.method), report.device.c_str());
  }
  for (int k = 0; k < runs; ++k)
  {
    for (HeadlineSeries& s : series)
    {
      Report report;
      if (!timedRuns(engine, s.request, 1, s.resident, s.wall, report))
      {
        return false;
      }
      s.coordinatesMs.push_back(stageMs(report, "coordinates"));
      s.downloadMs.push_back(stageMs(report, "download"));
      if (k + 1 == runs)
      {
        std::fprintf(stderr, "  %s stages:", s.endToEnd.c_str());
        for (const auto& stage : report.stages)
        {
          std::fprintf(stderr, " %s %.3f", stage.stage.c_str(), stage.milliseconds);
        }
        std::fprintf(stderr, "\n");
      }
    }
  }
  for (HeadlineSeries& s : series)
  {
    figures.push_back({ s.device, s.resident });
    figures.push_back({ s.endToEnd, s.wall });
    printTransferRates(s);
  }
  return true;
}

/// --table=headline: every figure the headline table of RESULTS.md tracks, from one run, as
/// figure,median_ms (Testing/Benchmarks/headline-H100.csv has the committed ones;
/// compare_headline.py sets them side by side and marks regressions). Density, R = 1.5, uniform
/// random points in a box of 90 (4M) scaled to keep about 80 neighbors: the 4M row per method
/// and Auto, the same cloud in a periodic box, a 512^3 volume of it, 64M and 1e9 points (Auto).
/// The filter's Update() is NeighborGridFilterBenchmark --headline's.
int runHeadline(const std::vector<Method>& methods, int runs, std::ofstream& csv)
{
  const double radius = 1.5;
  std::vector<HeadlineFigure> figures;
  Engine engine;
  {
    const std::int64_t n = 4194304;
    const double scene = 90.0;
    const std::vector<float> xyz = uniformCloud(n, scene, 12345 + n * 31, 1);
    std::vector<float> density(static_cast<std::size_t>(n));
    Request base;
    base.points = Points(xyz.data(), n);
    base.radius = radius;
    base.operation = Operation::Density;
    base.density = density.data();
    std::vector<HeadlineSeries> series;
    for (Method m : methods)
    {
      HeadlineSeries s;
      const std::string prefix = m == Method::Auto ? "engine_4M" : "method_" + methodSlug(m) + "_4M";
      s.device = prefix + "_device";
      s.endToEnd = prefix + "_e2e";
      s.request = base;
      s.request.method = m;
      series.push_back(s);
    }
    HeadlineSeries periodic;
    periodic.device = "periodic_4M_device";
    periodic.endToEnd = "periodic_4M_e2e";
    periodic.request = base;
    for (int a = 0; a < 3; ++a)
    {
      periodic.request.periodic[a] = true;
      periodic.request.boxLengths[a] = scene;
    }
    series.push_back(periodic);
    if (!runInTurns(engine, series, runs, figures))
    {
      return 1;
    }
    writeHeadline(figures, csv);
    figures.clear();

    const std::int64_t side = 512;
    const std::size_t cells = std::size_t(side) * side * side;
    std::vector<float> gridDensity(cells);
    std::vector<std::uint8_t> valid(cells);
    HeadlineSeries volume;
    volume.device = "volume_512_device";
    volume.endToEnd = "volume_512_e2e";
    volume.request.source = Points(xyz.data(), n);
    volume.request.radius = radius;
    volume.request.operation = Operation::Density;
    volume.request.density = gridDensity.data();
    volume.request.valid = valid.data();
    for (int a = 0; a < 3; ++a)
    {
      volume.request.queryGrid.origin[a] = -radius;
      volume.request.queryGrid.spacing[a] = (scene + 2 * radius) / double(side - 1);
      volume.request.queryGrid.dimensions[a] = side;
    }
    std::vector<HeadlineSeries> volumes{ volume };
    if (!runInTurns(engine, volumes, std::max(5, runs / 2), figures))
    {
      return 1;
    }
    writeHeadline(figures, csv);
    figures.clear();
  }
  for (const auto& size : { std::make_pair(std::int64_t(67108864), std::string("64M")),
         std::make_pair(std::int64_t(1000000000), std::string("1e9")) })
  {
    const std::int64_t n = size.first;
    const double scene = 90.0 * std::cbrt(double(n) / 4194304.0);
    const std::vector<float> xyz = uniformCloud(n, scene, 12345 + n * 31, 1);
    std::vector<float> density(static_cast<std::size_t>(n));
    HeadlineSeries s;
    s.device = "engine_" + size.second + "_device";
    s.endToEnd = "engine_" + size.second + "_e2e";
    s.request.points = Points(xyz.data(), n);
    s.request.radius = radius;
    s.request.operation = Operation::Density;
    s.request.density = density.data();
    std::vector<HeadlineSeries> one{ s };
    if (!runInTurns(engine, one, n > 100000000 ? 3 : std::max(5, runs / 2), figures))
    {
      return 1;
    }
    writeHeadline(figures, csv);
    figures.clear();
  }
  return 0;
}

} // namespace

/// --radii=N: per-particle radii (issue 12). N clustered particles: five Gaussian clusters
/// (sigma 0.5, 1, 2, 4, 8; 15% of the points each) in a uniform background (25%) of a box of 200.
/// Each particle's radius holds about 64 neighbors: R = (3 * 64 / (4 pi n(x)))^(1/3) from the
/// mixture's known number density n(x), a range of over 1000x. Rows: density in each smoothing
/// length mode, the gradient of a 3-component array (Gather, Symmetric), and the same density and
/// gradient with one fixed radius (the median radius), Auto, median of `runs`: device-resident
/// (sort and search) and end to end. Checks every result is finite, densities > 0, and reports the
/// measured mean and median neighbor counts of each radius rule. CSV: device,table,n,scene,radius,
/// operation,method,median_ms,end_to_end_ms,levels,searches,mean_neighbors,median_neighbors
/// The clustered cloud of --radii (below): coordinates, each particle's radius for about 64
/// The report's stages on one line of stderr, after whatever the caller printed.
void printStages(const Report& report)
{
  for (const auto& stage : report.stages)
  {
    std::fprintf(stderr, " %s %.2f ms", stage.stage.c_str(), stage.milliseconds);
  }
  std::fprintf(stderr, "\n");
}

/// neighbors, and a 3-component field.
void makeClusteredCloud(std::int64_t n, std::vector<float>& xyz, std::vector<float>& radii, std::vector<float>& field)
{
  const double box = 200.0;
  const double sigma[5] = { 0.5, 1.0, 2.0, 4.0, 8.0 };
  const double centers[5][3] = { { 40, 50, 60 }, { 150, 40, 100 }, { 100, 150, 50 }, { 60, 120, 150 },
    { 140, 140, 140 } };
  const std::size_t count = static_cast<std::size_t>(n);
  xyz.assign(3 * count, 0.0f);
  radii.assign(count, 0.0f);
  field.assign(3 * count, 0.0f);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
  {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(4242 + t);
      std::uniform_real_distribution<double> u(0.0, box);
      std::normal_distribution<double> g(0.0, 1.0);
      for (std::int64_t i = n * t / threads; i < n * (t + 1) / threads; ++i)
      {
        const int kind = static_cast<int>(i % 20) / 3; // 0-4: a cluster (3 in 20 each), 5-6: background
        double x[3];
        for (int a = 0; a < 3; ++a)
        {
          x[a] = kind < 5 ? centers[kind][a] + sigma[kind] * g(rng) : u(rng);
          xyz[3 * i + a] = static_cast<float>(x[a]);
          field[3 * i + a] = static_cast<float>(std::sin(0.05 * x[a]) + x[(a + 1) % 3] * 0.01);
        }
        double density = 0.25 * double(n) / (box * box * box);
        for (int k = 0; k < 5; ++k)
        {
          double r2 = 0;
          for (int a = 0; a < 3; ++a)
          {
            r2 += (x[a] - centers[k][a]) * (x[a] - centers[k][a]);
          }
          density += 0.15 * double(n) * std::exp(-0.5 * r2 / (sigma[k] * sigma[k])) /
            std::pow(2.0 * 3.14159265358979323846 * sigma[k] * sigma[k], 1.5);
        }
        radii[i] = static_cast<float>(std::cbrt(3.0 * 64.0 / (4.0 * 3.14159265358979323846 * density)));
      }
    });
  }
  for (auto& thread : pool)
  {
    thread.join();
  }
}

int runRadii(std::int64_t n, int runs, std::ofstream& csv)
{
  const double box = 200.0;
  const std::size_t count = static_cast<std::size_t>(n);
  std::vector<float> xyz, radii, mass(count, 1.0f), field;
  makeClusteredCloud(n, xyz, radii, field);
  std::vector<float> sorted(radii);
  std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
  const double medianRadius = sorted[n / 2];
  const auto range = std::minmax_element(radii.begin(), radii.end());
  std::fprintf(stderr, "radii from %g to %g (%.0fx), median %g\n", *range.first, *range.second,
    *range.second / *range.first, medianRadius);
  const std::string header =
    "device,table,n,scene,radius,operation,method,median_ms,end_to_end_ms,levels,searches,mean_neighbors,median_neighbors\n";
  std::printf("%s", header.c_str());
  if (csv)
  {
    csv << header;
  }
  Engine engine;
  struct Row
  {
    const char* radius;
    SmoothingLengthMode mode;
    Operation operation;
  };
  const Row rows[] = { { "own", SmoothingLengthMode::Gather, Operation::Density },
    { "own", SmoothingLengthMode::Scatter, Operation::Density },
    { "own", SmoothingLengthMode::Symmetric, Operation::Density },
    { "own", SmoothingLengthMode::Gather, Operation::Gradient },
    { "own", SmoothingLengthMode::Symmetric, Operation::Gradient },
    { "fixed", SmoothingLengthMode::Gather, Operation::Density },
    { "fixed", SmoothingLengthMode::Gather, Operation::Gradient } };
  std::vector<float> density(count), gradient(9 * count);
  std::vector<std::int32_t> counts(count);
  for (const Row& row : rows)
  {
    const bool own = std::strcmp(row.radius, "own") == 0;
    Request r;
    r.points = Points(xyz.data(), n);
    r.radius = medianRadius;
    r.radii = own ? radii.data() : nullptr;
    r.smoothingLengthMode = row.mode;
    r.mass = mass.data();
    // Neighbor counts of this radius rule, once (not timed).
    r.operation = Operation::NeighborCount;
    r.neighborCount = counts.data();
    double meanNeighbors = 0, medianNeighbors = 0;
    try
    {
      engine.run(r);
      for (std::int32_t c : counts)
      {
        meanNeighbors += c;
      }
      meanNeighbors /= double(n);
      std::vector<std::int32_t> c(counts);
      std::nth_element(c.begin(), c.begin() + n / 2, c.end());
      medianNeighbors = c[n / 2];
    }
    catch (const Error& error)
    {
      std::fprintf(stderr, "neighbor count: %s\n", error.what());
    }
    r.neighborCount = nullptr;
    r.operation = row.operation;
    r.density = density.data();
    if (row.operation == Operation::Gradient)
    {
      r.smoothed = { SmoothedArray{ field.data(), 3, gradient.data(), "field" } };
    }
    std::vector<double> resident, wall;
    Report report;
    if (!timedRuns(engine, r, runs, resident, wall, report))
    {
      continue;
    }
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      bad += !(std::isfinite(density[i]) && density[i] > 0.0f);
      if (row.operation == Operation::Gradient)
      {
        for (int k = 0; k < 9; ++k)
        {
          bad += !std::isfinite(gradient[9 * i + k]);
        }
      }
    }
    std::ostringstream line;
    line << report.device << ",radii," << n << "," << box << "," << (own ? std::string(toString(row.mode)) : "fixed " + std::to_string(medianRadius))
         << "," << (row.operation == Operation::Gradient ? "Gradient 3 components" : "Density") << ","
         << toString(report.method) << "," << median(resident) << "," << median(wall) << "," << report.radiusLevels
         << "," << report.radiusSearches << "," << meanNeighbors << "," << medianNeighbors << "\n";
    std::printf("%s", line.str().c_str());
    if (csv)
    {
      csv << line.str();
    }
    std::fprintf(stderr, "  %lld implausible values; stages:", static_cast<long long>(bad));
    printStages(report);
    std::fflush(stdout);
  }
  return 0;
}

/// --radii-slabs=N [--memory-limit=BYTES]: --radii's clustered cloud of N particles in the
/// periodic box [0, 200)^3 with their radii (Gather), Auto: neighbor counts and density in one run,
/// then in slabs under the memory limit (default 1 GiB), `runs` each. Checked: every count of the
/// slab run equals the one-run count, densities to 1e-5 relative. CSV: device,table,n,scene,
/// operation,method,one_run_ms,slabs_ms,slabs,slab_halo_points,points_differing,max_relative_difference
/// (end to end, medians).
int runRadiiSlabs(std::int64_t n, std::int64_t memoryLimit, int runs, std::ofstream& csv)
{
  const double box = 200.0;
  const std::size_t count = static_cast<std::size_t>(n);
  std::vector<float> xyz, radii, mass(count, 1.0f), field;
  makeClusteredCloud(n, xyz, radii, field);
  const std::string header = "device,table,n,scene,operation,method,one_run_ms,slabs_ms,slabs,slab_halo_points,"
                             "points_differing,max_relative_difference\n";
  std::printf("%s", header.c_str());
  if (csv)
  {
    csv << header;
  }
  Request r;
  r.points = Points(xyz.data(), n);
  r.radii = radii.data();
  r.smoothingLengthMode = SmoothingLengthMode::Gather;
  r.mass = mass.data();
  for (int a = 0; a < 3; ++a)
  {
    r.periodic[a] = true;
    r.boxLengths[a] = box;
  }
  Engine whole, sliced;
  sliced.setMemoryLimit(memoryLimit > 0 ? memoryLimit : (std::int64_t(1) << 30));
  for (Operation operation : { Operation::NeighborCount, Operation::Density })
  {
    std::vector<std::int32_t> wantCount, gotCount;
    std::vector<float> wantRho, gotRho;
    auto outputsFor = [&](Request& q, std::vector<std::int32_t>& counts, std::vector<float>& rho) {
      q.operation = operation;
      counts.assign(operation == Operation::NeighborCount ? count : 0, -1);
      rho.assign(operation == Operation::Density ? count : 0, -1.0f);
      q.neighborCount = counts.empty() ? nullptr : counts.data();
      q.density = rho.empty() ? nullptr : rho.data();
    };
    Request one = r, cut = r;
    outputsFor(one, wantCount, wantRho);
    outputsFor(cut, gotCount, gotRho);
    std::vector<double> oneResident, oneWall, slabResident, slabWall;
    Report oneReport, slabReport;
    if (!timedRuns(whole, one, runs, oneResident, oneWall, oneReport) ||
      !timedRuns(sliced, cut, runs, slabResident, slabWall, slabReport))
    {
      return 1;
    }
    std::int64_t differing = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < count; ++i)
    {
      if (operation == Operation::NeighborCount)
      {
        differing += gotCount[i] != wantCount[i];
      }
      else
      {
        const double difference = std::fabs(double(gotRho[i]) - wantRho[i]) / std::fabs(double(wantRho[i]));
        differing += !(difference <= 1e-5);
        worst = std::max(worst, std::isfinite(difference) ? difference : 1e300);
      }
    }
    std::ostringstream line;
    line << slabReport.device << ",radii-slabs," << n << "," << box << ",periodic " << toString(operation)
         << " (Gather)," << toString(slabReport.method) << "," << median(oneWall) << "," << median(slabWall) << ","
         << slabReport.slabs << "," << slabReport.slabHaloPoints << "," << differing << "," << worst << "\n";
    std::printf("%s", line.str().c_str());
    if (csv)
    {
      csv << line.str();
    }
    std::fprintf(stderr, "  one run: slabs %lld, %lld periodic images; slabs: %lld, halo %lld points; stages:",
      static_cast<long long>(oneReport.slabs), static_cast<long long>(oneReport.periodicImages),
      static_cast<long long>(slabReport.slabs), static_cast<long long>(slabReport.slabHaloPoints));
    printStages(slabReport);
    std::fflush(stdout);
  }
  return 0;
}

/// --smoothing-length=N: Smoothing Length (k = 64) of N uniform random points (the 4M row's
/// density: box 90 at 4M, about 80 neighbors within 1.5) and of --radii's clustered cloud, Auto,
/// median of `runs`: device-resident (grids and searches) and end to end, with the levels searched
/// and the median and extremes of the result. With --memory-limit=BYTES the runs take slabs, and
/// one run without the limit checks them: the values that differ (0 expected). CSV: device,table,
/// n,cloud,k,median_ms,end_to_end_ms,levels,median_radius,min_radius,max_radius,slabs,differ
int runSmoothingLengthTable(std::int64_t n, std::int64_t memoryLimit, int runs, std::ofstream& csv)
{
  const std::string header =
    "device,table,n,cloud,k,median_ms,end_to_end_ms,levels,median_radius,min_radius,max_radius,slabs,differ\n";
  std::printf("%s", header.c_str());
  if (csv)
  {
    csv << header;
  }
  Engine engine;
  engine.setMemoryLimit(memoryLimit);
  for (const char* cloud : { "uniform", "clustered" })
  {
    std::vector<float> xyz, radii, field;
    if (std::strcmp(cloud, "clustered") == 0)
    {
      makeClusteredCloud(n, xyz, radii, field);
    }
    else
    {
      xyz.resize(3 * std::size_t(n));
      std::mt19937_64 rng(4242);
      std::uniform_real_distribution<float> u(0.0f, static_cast<float>(90.0 * std::cbrt(double(n) / 4194304.0)));
      for (auto& v : xyz)
      {
        v = u(rng);
      }
    }
    std::vector<float> support(static_cast<std::size_t>(n));
    Request r;
    r.points = Points(xyz.data(), n);
    r.operation = Operation::SmoothingLength;
    r.neighborTarget = 64;
    r.supportRadius = support.data();
    std::vector<double> resident, wall;
    Report report;
    if (!timedRuns(engine, r, runs, resident, wall, report))
    {
      continue;
    }
    std::int64_t differ = 0;
    if (memoryLimit > 0)
    {
      std::vector<float> inSlabs(support);
      Engine oneRun; // no limit
      oneRun.run(r);
      for (std::int64_t i = 0; i < n; ++i)
      {
        differ += inSlabs[i] != support[i];
      }
    }
    std::vector<float> sorted(support);
    std::sort(sorted.begin(), sorted.end());
    std::ostringstream line;
    line << report.device << ",smoothing-length," << n << "," << cloud << ",64," << median(resident) << ","
         << median(wall) << "," << report.radiusLevels << "," << sorted[n / 2] << "," << sorted.front() << ","
         << sorted.back() << "," << report.slabs << "," << differ << "\n";
    std::printf("%s", line.str().c_str());
    if (csv)
    {
      csv << line.str();
    }
    std::fprintf(stderr, "  stages:");
    printStages(report);
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv)
{
  std::string table = "issue";
  std::string csvPath;
  int runs = 21;
  Backend backend = Backend::Auto;
  std::vector<Method> methods{ Method::CountingSort, Method::RadixSort, Method::FENNS, Method::CLAWS, Method::Bayraktar,
    Method::StagedTiles, Method::Auto };
  bool roofline = false;
  std::int64_t volumeSide = 0;
  bool periodicTable = false;
  std::int64_t slabPoints = 0, memoryLimit = 0, pointCount = 67108864;
  int ranks = 0;
  std::int64_t radiiPoints = 0, radiiSlabPoints = 0;
  std::int64_t smoothingLengthPoints = 0;
  std::int64_t onlyCount = 0; // --only-n: the table's rows of this many points alone
  for (int i = 1; i < argc; ++i)
  {
    const std::string a = argv[i];
    if (a.rfind("--table=", 0) == 0)
    {
      table = a.substr(8);
    }
    else if (a.rfind("--runs=", 0) == 0)
    {
      runs = std::max(1, std::atoi(a.c_str() + 7));
    }
    else if (a.rfind("--csv=", 0) == 0)
    {
      csvPath = a.substr(6);
    }
    else if (a.rfind("--methods=", 0) == 0)
    {
      methods.clear();
      std::stringstream list(a.substr(10));
      for (std::string name; std::getline(list, name, ',');)
      {
        methods.push_back(parseMethod(name));
      }
    }
    else if (a == "--cpu")
    {
      backend = Backend::CPU;
      methods = { Method::CountingSort };
    }
    else if (a.rfind("--operations=", 0) == 0)
    {
      return runEveryOperation(std::atoll(a.c_str() + 13), Backend::Auto);
    }
    else if (a == "--periodic")
    {
      periodicTable = true;
    }
    else if (a.rfind("--volume=", 0) == 0)
    {
      volumeSide = std::max<std::int64_t>(2, std::atoll(a.c_str() + 9));
    }
    else if (a == "--roofline")
    {
      roofline = true;
    }
    else if (a.rfind("--slabs=", 0) == 0)
    {
      slabPoints = std::max<std::int64_t>(1000, std::atoll(a.c_str() + 8));
    }
    else if (a.rfind("--memory-limit=", 0) == 0)
    {
      memoryLimit = std::atoll(a.c_str() + 15);
    }
    else if (a.rfind("--ranks=", 0) == 0)
    {
      ranks = std::max(1, std::atoi(a.c_str() + 8));
    }
    else if (a.rfind("--smoothing-length=", 0) == 0)
    {
      smoothingLengthPoints = std::max<std::int64_t>(1000, std::atoll(a.c_str() + 19));
    }
    else if (a.rfind("--radii-slabs=", 0) == 0)
    {
      radiiSlabPoints = std::max<std::int64_t>(1000, std::atoll(a.c_str() + 14));
    }
    else if (a.rfind("--radii=", 0) == 0)
    {
      radiiPoints = std::max<std::int64_t>(1000, std::atoll(a.c_str() + 8));
    }
    else if (a.rfind("--only-n=", 0) == 0)
    {
      onlyCount = std::atoll(a.c_str() + 9);
    }
    else if (a.rfind("--n=", 0) == 0)
    {
      pointCount = std::max<std::int64_t>(1000, std::atoll(a.c_str() + 4));
    }
    else
    {
      std::fprintf(stderr,
        "usage: %s [--table=headline|issue|operations|smoothing|exactness|sparser|outlier|small|scale|billion|fenns1|fenns2|fenns3|claws1|claws2|cpu|all|smoke]\n"
        "          [--runs=N] [--csv=FILE] [--only-n=N] [--volume=N] [--periodic] [--operations=N]\n"
        "          [--slabs=N [--memory-limit=BYTES]] [--ranks=P [--n=N]] [--radii=N] [--radii-slabs=N]\n"
        "          [--smoothing-length=N [--memory-limit=BYTES]]\n"
        "          [--methods=counting-sort,radix-sort,fenns,claws,bayraktar,staged-tiles,brute-force,auto] [--cpu] [--roofline]\n",
        argv[0]);
      return 2;
    }
  }
  std::string why;
  if (backend == Backend::Auto && !Engine::cudaAvailable(&why))
  {
    std::fprintf(stderr, "note: %s; benchmarking the CPU backend\n", why.c_str());
    backend = Backend::CPU;
    methods = { Method::CountingSort };
  }
  if (roofline)
  {
    const RooflineMeasurement m = measureRoofline();
    std::fprintf(stderr, "roofline: %s\n", m.summary.c_str());
    std::printf("# roofline,device_copy_GBps=%.1f,fp32_GFLOPs=%.1f,pinned_upload_GBps=%.1f,pinned_download_GBps=%.1f\n",
      m.copyGigabytesPerSecond, m.fp32Gigaflops, m.pinnedUploadGigabytesPerSecond, m.pinnedDownloadGigabytesPerSecond);
  }

  std::ofstream csv;
  if (!csvPath.empty())
  {
    csv.open(csvPath);
  }
  if (table == "headline")
  {
    std::printf("figure,median_ms\n");
    if (csv)
    {
      csv << "figure,median_ms\n";
    }
    return runHeadline(methods, runs, csv);
  }
  if (slabPoints > 0)
  {
    return runSlabs(slabPoints, memoryLimit, runs, csv);
  }
  if (radiiSlabPoints > 0)
  {
    return runRadiiSlabs(radiiSlabPoints, memoryLimit, runs, csv);
  }
  if (radiiPoints > 0)
  {
    return runRadii(radiiPoints, runs, csv);
  }
  if (smoothingLengthPoints > 0)
  {
    return runSmoothingLengthTable(smoothingLengthPoints, memoryLimit, runs, csv);
  }
  if (ranks > 0)
  {
    return runRanks(pointCount, ranks, runs, csv);
  }
  if (periodicTable)
  {
    return runPeriodicTable(methods, backend, runs, csv);
  }
  if (volumeSide > 0)
  {
    return runVolume(volumeSide, methods, backend, runs, csv);
  }
  const char* header = "device,table,n,scene,radius,operation,method,median_ms,extra_device_bytes,avg_neighbors\n";
  std::printf("%s", header);
  if (csv)
  {
    csv << header;
  }
  Engine engine;
  for (const Scenario& s : scenarios(table))
  {
    if (onlyCount > 0 && s.n != onlyCount)
    {
      continue;
    }
    if (s.baselineCellSize > 0)
    {
      setenv("NEIGHBORGRID_BASELINE_CELL_SIZE", std::to_string(s.baselineCellSize).c_str(), 1);
    }
    else
    {
      unsetenv("NEIGHBORGRID_BASELINE_CELL_SIZE");
    }
    // Uniform random, unsorted points (or the lattice's, row-major).
    std::vector<float> xyz = s.lattice ? latticeCloud(s.n, s.faceCentred) : uniformCloud(s.n, s.scene, 12345 + s.n * 31, 1);
    if (s.outlier)
    {
      xyz[3 * (s.n - 1)] = xyz[3 * (s.n - 1) + 1] = xyz[3 * (s.n - 1) + 2] = s.outlierAt;
    }
    std::vector<float> density(s.n);
    std::vector<std::int32_t> counts(s.n);
    // Smoothing rows smooth the x (and y, z, then x again) coordinates: a smooth field of the
    // points' own.
    std::vector<float> field, smoothed;
    if (s.smoothedComponents > 0)
    {
      field.resize(std::size_t(s.n) * s.smoothedComponents);
      smoothed.resize(field.size());
      for (std::int64_t i = 0; i < s.n; ++i)
      {
        for (int c = 0; c < s.smoothedComponents; ++c)
        {
          field[std::size_t(i) * s.smoothedComponents + c] = xyz[3 * std::size_t(i) + c % 3];
        }
      }
    }

    Request base;
    base.points = Points(xyz.data(), s.n);
    base.radius = s.radius;
    base.backend = backend;

    Request countRequest = base;
    countRequest.operation = Operation::NeighborCount;
    countRequest.method = backend == Backend::CPU ? Method::CountingSort : Method::RadixSort;
    countRequest.neighborCount = counts.data();
    const Report countReport = engine.run(countRequest);
    const double averageNeighbors = double(countReport.neighborPairs) / double(s.n);
    const double paperNeighbors = double(s.n) / std::pow(s.scene / (2.0 * s.radius), 3.0);

    // Methods take turns run by run, so drift of clocks or temperature touches them alike; small
    // scenes, dominated by launch overheads, get more runs.
    struct Series
    {
      Method method;
      std::string clawsDisable; // NEIGHBORGRID_CLAWS_DISABLE for this series
      bool floatOnly = false;   // NEIGHBORGRID_BENCHMARK_FLOAT_ONLY for this series
      std::string label;
      Request request;
      std::vector<double> resident;
      std::vector<double> endToEnd;
      std::map<std::string, std::vector<double>> perStage;
      std::vector<std::string> stageOrder;
      Report report;
      void setKnobs() const
      {
        setenv("NEIGHBORGRID_CLAWS_DISABLE", clawsDisable.c_str(), 1);
        if (floatOnly)
        {
          setenv("NEIGHBORGRID_BENCHMARK_FLOAT_ONLY", "1", 1);
        }
        else
        {
          unsetenv("NEIGHBORGRID_BENCHMARK_FLOAT_ONLY");
        }
      }
    };
    std::vector<Series> series;
    for (Method method : methods)
    {
      if (method == Method::BruteForce && s.n > 600000)
      {
        continue; // quadratic: minutes per run at these sizes
      }
      if (s.n > 300000000 && method != Method::RadixSort && method != Method::Auto)
      {
        continue; // a billion points: the default method, which is the one that must fit
      }
      std::vector<std::pair<std::string, bool>> variants{ { "", false } };
      if (method == Method::CLAWS && s.clawsAblation)
      {
        for (const char* idea : { "symmetric", "reorder", "merged", "warps" })
        {
          variants.push_back({ idea, false });
        }
      }
      if (s.floatOnly && method != Method::Auto)
      {
        variants.push_back({ "", true });
      }
      for (const auto& variant : variants)
      {
        Series entry;
        entry.method = method;
        entry.clawsDisable = variant.first;
        entry.floatOnly = variant.second;
        entry.label = variant.second ? " (float test only)" : (variant.first.empty() ? "" : " without " + variant.first);
        entry.request = base;
        entry.request.operation = s.operation;
        entry.request.method = method;
        entry.request.density = density.data();
        entry.request.neighborCount = counts.data();
        if (s.smoothedComponents > 0)
        {
          entry.request.normalization = Normalization::Shepard;
          entry.request.smoothed = { { field.data(), s.smoothedComponents, smoothed.data(), "field" } };
        }
        entry.setKnobs();
        try
        {
          engine.run(entry.request); // warm-up: allocations, module load
        }
        catch (const Error& error)
        {
          // Say what did not run and why (a method that does not fit the device, say), and go on.
          std::fprintf(stderr, "%s n=%lld %s%s: not run: %s\n", s.table.c_str(), static_cast<long long>(s.n),
            toString(method), entry.label.c_str(), error.what());
          continue;
        }
        series.push_back(std::move(entry));
      }
    }
    const int rowRuns = s.runs > 0 ? s.runs : (s.n <= 100000 ? std::max(runs, 101) : runs);
    for (int k = 0; k < rowRuns; ++k)
    {
      for (Series& entry : series)
      {
        entry.setKnobs();
        const auto began = std::chrono::steady_clock::now();
        entry.report = engine.run(entry.request);
        entry.endToEnd.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
        double device = 0;
        for (const auto& stage : entry.report.stages)
        {
          if (isDeviceResident(stage.stage))
          {
            device += stage.milliseconds;
          }
          if (!entry.perStage.count(stage.stage))
          {
            entry.stageOrder.push_back(stage.stage);
          }
          entry.perStage[stage.stage].push_back(stage.milliseconds);
        }
        entry.resident.push_back(device);
      }
    }
    for (Series& entry : series)
    {
      const Report& report = entry.report;
      const Method method = entry.method;
      std::ostringstream line;
      line << '"' << report.device << "\"," << s.table << ',' << s.n << ',' << s.scene << ',' << s.radius << ','
           << toString(s.operation) << ',' << toString(method == Method::Auto ? Method::Auto : report.method)
           << entry.label << ',' << median(entry.resident) << ',' << report.extraDeviceBytes << ',' << averageNeighbors << '\n';
      std::printf("%s", line.str().c_str());
      std::fflush(stdout);
      if (csv)
      {
        csv << line.str();
        csv.flush();
      }
      std::fprintf(stderr, "%s n=%lld scene=%g R=%g %s%s%s (paper-formula neighbors %.2f):", s.table.c_str(),
        static_cast<long long>(s.n), s.scene, s.radius, (toString(method) + entry.label).c_str(),
        method == Method::Auto ? " -> " : "",
        method == Method::Auto ? toString(report.method) : "", paperNeighbors);
      for (const auto& name : entry.stageOrder)
      {
        std::fprintf(stderr, " %s %.3f", name.c_str(), median(entry.perStage[name]));
      }
      std::fprintf(stderr, " | engine end to end %.3f ms, %.1f extra device bytes/point, %lld pairs decided in double\n",
        median(entry.endToEnd), double(report.extraDeviceBytes) / double(s.n),
        static_cast<long long>(report.pairsDecidedInDouble));
    }
  }
  unsetenv("NEIGHBORGRID_CLAWS_DISABLE");
  unsetenv("NEIGHBORGRID_BENCHMARK_FLOAT_ONLY");
  return 0;
}
