// vtkPointNeighborhoodFilter end to end: float coordinates in a host vtkPolyData, the Density
// array back on the host. Median wall time of Update() over --runs runs per method, for the
// 4,194,304-point row (scene 90, R = 1.5). This is the time a VTK pipeline or ParaView sees.
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
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
  int runs = 21;
  vtkIdType n = 4194304;
  for (int i = 1; i < argc; ++i)
  {
    const std::string a = argv[i];
    if (a.rfind("--runs=", 0) == 0)
    {
      runs = std::max(1, std::atoi(a.c_str() + 7));
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
