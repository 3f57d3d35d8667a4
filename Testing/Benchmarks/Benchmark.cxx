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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
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
  return stage != "coordinates" && stage != "upload" && stage != "download" && stage != "copy to caller";
}

Method parseMethod(const std::string& name)
{
  if (name == "counting-sort") return Method::CountingSort;
  if (name == "radix-sort") return Method::RadixSort;
  if (name == "fenns") return Method::FENNS;
  if (name == "claws") return Method::CLAWS;
  if (name == "brute-force") return Method::BruteForce;
  if (name == "auto") return Method::Auto;
  std::fprintf(stderr, "unknown method '%s'\n", name.c_str());
  std::exit(2);
}

} // namespace

int main(int argc, char** argv)
{
  std::string table = "issue";
  std::string csvPath;
  int runs = 21;
  Backend backend = Backend::Auto;
  std::vector<Method> methods{ Method::CountingSort, Method::RadixSort, Method::FENNS, Method::CLAWS, Method::Auto };
  bool roofline = false;
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
    else if (a == "--roofline")
    {
      roofline = true;
    }
    else
    {
      std::fprintf(stderr,
        "usage: %s [--table=issue|fenns1|fenns2|fenns3|claws1|claws2|all|smoke] [--runs=N] [--csv=FILE]\n"
        "          [--methods=counting-sort,radix-sort,fenns,claws,brute-force,auto] [--cpu] [--roofline]\n",
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
    std::printf("# roofline,device_copy_GBps=%.1f,fp32_GFLOPs=%.1f\n", m.copyGigabytesPerSecond, m.fp32Gigaflops);
  }

  std::ofstream csv;
  if (!csvPath.empty())
  {
    csv.open(csvPath);
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
    if (s.baselineCellSize > 0)
    {
      setenv("NEIGHBORGRID_BASELINE_CELL_SIZE", std::to_string(s.baselineCellSize).c_str(), 1);
    }
    else
    {
      unsetenv("NEIGHBORGRID_BASELINE_CELL_SIZE");
    }
    std::vector<float> xyz(3 * s.n);
    std::mt19937_64 rng(12345 + s.n);
    std::uniform_real_distribution<float> u(0.0f, static_cast<float>(s.scene));
    for (auto& v : xyz)
    {
      v = u(rng);
    }
    std::vector<float> density(s.n);
    std::vector<std::int32_t> counts(s.n);

    Request base;
    base.points = Points(xyz.data(), s.n);
    base.radius = s.radius;
    base.backend = backend;

    Request countRequest = base;
    countRequest.operation = Operation::NeighborCount;
    countRequest.method = Method::CountingSort;
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
      std::string label;
      Request request;
      std::vector<double> resident;
      std::map<std::string, std::vector<double>> perStage;
      std::vector<std::string> stageOrder;
      Report report;
    };
    std::vector<Series> series;
    for (Method method : methods)
    {
      if (method == Method::BruteForce && s.n > 600000)
      {
        continue; // quadratic: minutes per run at these sizes
      }
      std::vector<std::string> variants{ "" };
      if (method == Method::CLAWS && s.clawsAblation)
      {
        variants.insert(variants.end(), { "symmetric", "reorder", "merged", "warps" });
      }
      for (const std::string& variant : variants)
      {
        Series entry;
        entry.method = method;
        entry.clawsDisable = variant;
        entry.label = variant.empty() ? "" : " without " + variant;
        entry.request = base;
        entry.request.operation = s.operation;
        entry.request.method = method;
        entry.request.density = density.data();
        entry.request.neighborCount = counts.data();
        setenv("NEIGHBORGRID_CLAWS_DISABLE", variant.c_str(), 1);
        engine.run(entry.request); // warm-up: allocations, module load
        series.push_back(std::move(entry));
      }
    }
    const int rowRuns = s.n <= 100000 ? std::max(runs, 101) : runs;
    for (int k = 0; k < rowRuns; ++k)
    {
      for (Series& entry : series)
      {
        setenv("NEIGHBORGRID_CLAWS_DISABLE", entry.clawsDisable.c_str(), 1);
        entry.report = engine.run(entry.request);
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
      std::fprintf(stderr, "\n");
    }
  }
  unsetenv("NEIGHBORGRID_CLAWS_DISABLE");
  return 0;
}
