// vtkPointNeighborhoodFilter end to end: float coordinates in a host vtkPolyData, the Density
// array back on the host. Median wall time of Update() over --runs runs per method, for the
// 4,194,304-point row (scene 90, R = 1.5). This is the time a VTK pipeline or ParaView sees.
// --headline: Auto only, in turns with Engine::run on the same arrays (the engine's end to end
// for the same request), as figure,median_ms rows of the headline table (filter_4M_e2e,
// filter_engine_4M_e2e).
#include <NeighborGrid/NeighborGrid.h>
#include <vtkFieldData.h>
#include <vtkFloatArray.h>
#include <vtkNew.h>
#include <vtkPointData.h>
#include <vtkPointNeighborhoodFilter.h>
#include <vtkPoints.h>
#include <vtkPolyData.h>
#include <vtkStringArray.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace
{
double Median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MillisecondsOf(const std::function<void()>& f)
{
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

int Headline(vtkPolyData* cloud, vtkPoints* points, int runs)
{
  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetInputData(cloud);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  filter->SetRadius(1.5);
  neighborgrid::Engine engine;
  const vtkIdType n = points->GetNumberOfPoints();
  std::vector<float> density(static_cast<std::size_t>(n));
  neighborgrid::Request request;
  request.points = neighborgrid::Points(static_cast<const float*>(points->GetVoidPointer(0)), n);
  request.radius = 1.5;
  request.operation = neighborgrid::Operation::Density;
  request.density = density.data();
  filter->Update(); // warm-up: CUDA context, device buffers, pinned staging
  engine.run(request);
  std::vector<double> filterTimes, engineTimes;
  for (int k = 0; k < runs; ++k)
  {
    filter->Modified();
    filterTimes.push_back(MillisecondsOf([&] { filter->Update(); }));
    engineTimes.push_back(MillisecondsOf([&] { engine.run(request); }));
  }
  auto* output = vtkPolyData::SafeDownCast(filter->GetOutput());
  if (!output || !output->GetPointData()->GetArray("Density"))
  {
    std::fprintf(stderr, "no Density array in the output\n");
    return 1;
  }
  std::printf("figure,median_ms\nfilter_4M_e2e,%.4f\nfilter_engine_4M_e2e,%.4f\n", Median(filterTimes),
    Median(engineTimes));
  std::fprintf(stderr, "filter last run: %s\n", filter->GetLastRunInfo());
  return 0;
}
} // namespace

int main(int argc, char** argv)
{
  int runs = 21;
  vtkIdType n = 4194304;
  bool headline = false;
  for (int i = 1; i < argc; ++i)
  {
    const std::string a = argv[i];
    if (a.rfind("--runs=", 0) == 0)
    {
      runs = std::max(1, std::atoi(a.c_str() + 7));
    }
    else if (a == "--headline")
    {
      headline = true;
    }
    else if (a.rfind("--points=", 0) == 0)
    {
      n = std::max<vtkIdType>(1, std::atoll(a.c_str() + 9));
    }
  }
  vtkNew<vtkPoints> points;
  points->SetDataTypeToFloat();
  points->SetNumberOfPoints(n);
  auto* xyz = static_cast<float*>(points->GetVoidPointer(0));
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<float> u(0.0f, 90.0f);
  for (vtkIdType k = 0; k < 3 * n; ++k)
  {
    xyz[k] = u(rng);
  }
  vtkNew<vtkPolyData> cloud;
  cloud->SetPoints(points);

  if (headline)
  {
    return Headline(cloud, points, runs);
  }
  std::printf("method,points,median_update_ms\n");
  const struct
  {
    int method;
    const char* name;
  } methods[] = { { vtkPointNeighborhoodFilter::METHOD_AUTO, "Auto" },
    { vtkPointNeighborhoodFilter::METHOD_COUNTING_SORT, "Counting Sort" },
    { vtkPointNeighborhoodFilter::METHOD_RADIX_SORT, "Radix Sort" },
    { vtkPointNeighborhoodFilter::METHOD_FENNS, "FENNS" }, { vtkPointNeighborhoodFilter::METHOD_CLAWS, "CLAWS" },
    { vtkPointNeighborhoodFilter::METHOD_BAYRAKTAR, "Bayraktar" },
    { vtkPointNeighborhoodFilter::METHOD_STAGED_TILES, "Staged Tiles" } };
  for (const auto& m : methods)
  {
    vtkNew<vtkPointNeighborhoodFilter> filter;
    filter->SetInputData(cloud);
    filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
    filter->SetRadius(1.5);
    filter->SetMethod(m.method);
    filter->Update(); // warm-up: CUDA context, device buffers, pinned staging
    std::vector<double> times;
    for (int k = 0; k < runs; ++k)
    {
      filter->Modified();
      const auto start = std::chrono::steady_clock::now();
      filter->Update();
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      auto* output = vtkPolyData::SafeDownCast(filter->GetOutput());
      if (!output || !output->GetPointData()->GetArray("Density"))
      {
        std::fprintf(stderr, "%s: no Density array in the output\n", m.name);
        return 1;
      }
    }
    std::sort(times.begin(), times.end());
    std::printf("%s,%lld,%.3f\n", m.name, static_cast<long long>(n), times[times.size() / 2]);
    std::fprintf(stderr, "%s last run: %s\n", m.name, filter->GetLastRunInfo());
  }
  return 0;
}
