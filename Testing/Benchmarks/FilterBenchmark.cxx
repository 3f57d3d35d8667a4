// vtkPointNeighborhoodFilter end to end: float coordinates in a host vtkPolyData, the Density
// array back on the host. Median wall time of Update() over --runs runs per method, for the
// 4,194,304-point row (scene 90, R = 1.5). This is the time a VTK pipeline or ParaView sees.
// --headline: Auto only, in turns with Engine::run on the same arrays (the engine's end to end
// for the same request), as figure,median_ms rows of the headline table (filter_4M_e2e,
// filter_engine_4M_e2e).
#include <NeighborGrid/NeighborGrid.h>
#include <vtkAlgorithm.h>
#include <vtkCallbackCommand.h>
#include <vtkCommand.h>
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
#include <map>
#include <random>
#include <sstream>
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

/// The sum of the engine's stage.*_ms entries in a filter's LastRunInfo.
double EngineStagesMilliseconds(const char* runInfo)
{
  std::istringstream lines(runInfo ? runInfo : "");
  double sum = 0.0;
  for (std::string line; std::getline(lines, line);)
  {
    const auto equals = line.find('=');
    if (line.rfind("stage.", 0) == 0 && equals != std::string::npos && line.find("_ms") < equals)
    {
      sum += std::atof(line.c_str() + equals + 1);
    }
  }
  return sum;
}

/// The engine's progress reports of a run, and over all runs the time from each report to the
/// next, by the stage the next one reports.
struct ProgressIntervals
{
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<std::string, Clock::time_point>> reports; // the current run's
  std::map<std::string, std::vector<double>> untilReport;

  void Record(const std::string& stage, Clock::time_point when) { reports.emplace_back(stage, when); }
  void EndRun()
  {
    for (std::size_t k = 1; k < reports.size(); ++k)
    {
      untilReport[reports[k].first].push_back(
        std::chrono::duration<double, std::milli>(reports[k].second - reports[k - 1].second).count());
    }
    reports.clear();
  }
};

/// Where an Update() of the filter spends its time: the executive before RequestData; the
/// filter's own work before the engine starts, the engine (its first progress report to its
/// last), the filter's own work after it; the executive after RequestData. The executive fires
/// StartEvent and EndEvent around RequestData; the engine reports progress as "prepare" when it
/// starts and "done" when its results are in place.
struct UpdatePhases
{
  using Clock = ProgressIntervals::Clock;
  Clock::time_point begin, start, engineStart, engineEnd, end;
  std::vector<double> before, filterBefore, engine, engineStages, filterAfter, after;
  ProgressIntervals progress;

  static void Record(vtkObject* caller, unsigned long event, void* clientData, void*)
  {
    auto* self = static_cast<UpdatePhases*>(clientData);
    const Clock::time_point now = Clock::now();
    if (event == vtkCommand::StartEvent)
    {
      self->start = now;
    }
    else if (event == vtkCommand::EndEvent)
    {
      self->end = now;
    }
    else if (event == vtkCommand::ProgressEvent)
    {
      // The executive reports 0 and 1 around RequestData too, with no text.
      const char* text = static_cast<vtkAlgorithm*>(caller)->GetProgressText();
      if (text && *text)
      {
        const std::string stage = text;
        if (stage == "prepare")
        {
          self->engineStart = now;
        }
        else if (stage == "done")
        {
          self->engineEnd = now;
        }
        self->progress.Record(stage, now);
      }
    }
  }
  void Add(const char* runInfo)
  {
    const Clock::time_point finished = Clock::now();
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    before.push_back(ms(begin, start));
    filterBefore.push_back(ms(start, engineStart));
    engine.push_back(ms(engineStart, engineEnd));
    engineStages.push_back(EngineStagesMilliseconds(runInfo));
    filterAfter.push_back(ms(engineEnd, end));
    after.push_back(ms(end, finished));
    progress.EndRun();
  }
};

int Headline(vtkPolyData* cloud, vtkPoints* points, int runs)
{
  vtkNew<vtkPointNeighborhoodFilter> filter;
  filter->SetInputData(cloud);
  filter->SetOperation(vtkPointNeighborhoodFilter::DENSITY);
  filter->SetRadius(1.5);
  UpdatePhases phases;
  vtkNew<vtkCallbackCommand> observer;
  observer->SetCallback(&UpdatePhases::Record);
  observer->SetClientData(&phases);
  filter->AddObserver(vtkCommand::StartEvent, observer);
  filter->AddObserver(vtkCommand::EndEvent, observer);
  filter->AddObserver(vtkCommand::ProgressEvent, observer);
  neighborgrid::Engine engine;
  const vtkIdType n = points->GetNumberOfPoints();
  std::vector<float> density(static_cast<std::size_t>(n));
  neighborgrid::Request request;
  request.points = neighborgrid::Points(static_cast<const float*>(points->GetVoidPointer(0)), n);
  request.radius = 1.5;
  request.operation = neighborgrid::Operation::Density;
  request.density = density.data();
  // The engine into a new array at every run, as the filter writes one (the previous one freed).
  vtkSmartPointer<vtkFloatArray> freshArray;
  const auto runIntoFreshArray = [&] {
    auto array = vtkSmartPointer<vtkFloatArray>::New();
    array->SetNumberOfTuples(n);
    neighborgrid::Request fresh = request;
    fresh.density = array->GetPointer(0);
    fresh.progress = nullptr; // not one of the kept array's progress reports
    engine.run(fresh);
    freshArray = array;
  };
  filter->Update(); // warm-up: CUDA context, device buffers, pinned staging
  engine.run(request);
  runIntoFreshArray();
  // The engine alone, the same progress reports timed.
  ProgressIntervals engineAlone;
  request.progress = [&engineAlone](double, const char* stage) {
    engineAlone.Record(stage, ProgressIntervals::Clock::now());
    return true;
  };
  std::vector<double> filterTimes, engineTimes, freshTimes, engineStageSums;
  for (int k = 0; k < runs; ++k)
  {
    filter->Modified();
    phases.progress.reports.clear(); // the warm-up's
    phases.begin = UpdatePhases::Clock::now();
    filter->Update();
    phases.Add(filter->GetLastRunInfo());
    filterTimes.push_back(std::chrono::duration<double, std::milli>(UpdatePhases::Clock::now() - phases.begin).count());
    neighborgrid::Report report;
    engineTimes.push_back(MillisecondsOf([&] { report = engine.run(request); }));
    double stages = 0.0;
    for (const auto& stage : report.stages)
    {
      stages += stage.milliseconds;
    }
    engineStageSums.push_back(stages);
    engineAlone.EndRun();
    freshTimes.push_back(MillisecondsOf(runIntoFreshArray));
  }
  auto* output = vtkPolyData::SafeDownCast(filter->GetOutput());
  if (!output || !output->GetPointData()->GetArray("Density"))
  {
    std::fprintf(stderr, "no Density array in the output\n");
    return 1;
  }
  std::printf("figure,median_ms\nfilter_4M_e2e,%.4f\nfilter_engine_4M_e2e,%.4f\n", Median(filterTimes),
    Median(engineTimes));
  std::fprintf(stderr,
    "filter Update() (medians, ms): %.3f = executive before RequestData %.3f + filter before the engine %.3f + "
    "engine %.3f (its stages %.3f) + filter after the engine %.3f + executive after %.3f; the engine into a new "
    "vtkFloatArray each run %.3f, into one kept array %.3f\n",
    Median(filterTimes), Median(phases.before), Median(phases.filterBefore), Median(phases.engine),
    Median(phases.engineStages), Median(phases.filterAfter), Median(phases.after), Median(freshTimes),
    Median(engineTimes));
  std::fprintf(stderr, "the engine's progress reports (medians, ms from the report before):");
  for (const auto& entry : phases.progress.untilReport)
  {
    std::fprintf(stderr, " %s %.3f", entry.first.c_str(), Median(entry.second));
  }
  std::fprintf(stderr, "\nthe engine alone into its kept array: %.3f ms (its stages %.3f); progress reports:",
    Median(engineTimes), Median(engineStageSums));
  for (const auto& entry : engineAlone.untilReport)
  {
    std::fprintf(stderr, " %s %.3f", entry.first.c_str(), Median(entry.second));
  }
  std::fprintf(stderr, "\n");
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
