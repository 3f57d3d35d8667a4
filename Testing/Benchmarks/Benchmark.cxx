// NeighborGrid benchmark: methods side by side on uniform random, unsorted clouds (the first step
// of a simulation, the papers' worst case). For each scenario and method: the median of --runs
// runs of device-resident time (sort + search stages, timed with CUDA events; wall time on the
// CPU backend), extra device memory, and the average neighbor count. Prints CSV:
//   device,table,n,scene,radius,operation,method,median_ms,extra_device_bytes,avg_neighbors
// Performance is measured here, never in tests.
#include <NeighborGrid/NeighborGrid.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
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
};

std::vector<Scenario> scenarios(const std::string& table)
{
  std::vector<Scenario> rows;
  if (table == "issue2" || table == "all")
  {
    rows.push_back({ "density-4M", 4194304, 90.0, 1.5, Operation::Density });
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
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

bool isDeviceResident(const std::string& stage)
{
  return stage != "prepare" && stage != "upload" && stage != "download" && stage != "copy to caller";
}

} // namespace

int main(int argc, char** argv)
{
  std::string table = "issue2";
  int runs = 21;
  Backend backend = Backend::Auto;
  std::vector<Method> methods{ Method::CountingSort, Method::RadixSort, Method::FENNS, Method::Auto };
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
    else if (a == "--cpu")
    {
      backend = Backend::CPU;
      methods = { Method::CountingSort };
    }
    else if (a == "--with-brute-force")
    {
      methods.push_back(Method::BruteForce);
    }
    else
    {
      std::fprintf(stderr, "usage: %s [--table=issue2|smoke|all] [--runs=N] [--cpu] [--with-brute-force]\n", argv[0]);
      return 2;
    }
  }
  std::string why;
  if (backend == Backend::Auto && !Engine::cudaAvailable(&why))
  {
    std::fprintf(stderr, "note: %s; benchmarking the CPU backend\n", why.c_str());
  }

  Engine engine;
  std::printf("device,table,n,scene,radius,operation,method,median_ms,extra_device_bytes,avg_neighbors,median_end_to_end_ms\n");
  for (const Scenario& s : scenarios(table))
  {
    std::vector<float> xyz(3 * s.n);
    std::mt19937_64 rng(12345);
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

    // Average neighbor count, once per scenario.
    Request countRequest = base;
    countRequest.operation = Operation::NeighborCount;
    countRequest.method = Method::CountingSort;
    countRequest.neighborCount = counts.data();
    const Report countReport = engine.run(countRequest);
    const double averageNeighbors = double(countReport.neighborPairs) / double(s.n);

    for (Method method : methods)
    {
      if (method == Method::BruteForce && s.n > 600000)
      {
        continue; // quadratic: minutes per run at these sizes
      }
      Request r = base;
      r.operation = s.operation;
      r.method = method;
      r.density = density.data();
      r.neighborCount = counts.data();
      engine.run(r); // warm-up: allocations, module load
      std::vector<double> resident, endToEnd;
      std::vector<std::vector<double>> perStage;
      Report report;
      for (int k = 0; k < runs; ++k)
      {
        report = engine.run(r);
        double device = 0, total = 0;
        for (const auto& stage : report.stages)
        {
          total += stage.milliseconds;
          if (isDeviceResident(stage.stage))
          {
            device += stage.milliseconds;
          }
        }
        resident.push_back(device);
        endToEnd.push_back(total);
        perStage.resize(report.stages.size());
        for (std::size_t k = 0; k < report.stages.size(); ++k)
        {
          perStage[k].push_back(report.stages[k].milliseconds);
        }
      }
      std::fprintf(stderr, "%s n=%lld R=%g %s:", s.table.c_str(), static_cast<long long>(s.n), s.radius,
        toString(report.method));
      for (std::size_t k = 0; k < report.stages.size(); ++k)
      {
        std::fprintf(stderr, " %s %.3f", report.stages[k].stage.c_str(), median(perStage[k]));
      }
      std::fprintf(stderr, "\n");
      std::printf("\"%s\",%s,%lld,%g,%g,%s,%s,%.4f,%lld,%.2f,%.4f\n", report.device.c_str(), s.table.c_str(),
        static_cast<long long>(s.n), s.scene, s.radius, toString(s.operation), toString(report.method),
        median(resident), static_cast<long long>(report.extraDeviceBytes), averageNeighbors, median(endToEnd));
      std::fflush(stdout);
    }
  }
  return 0;
}
