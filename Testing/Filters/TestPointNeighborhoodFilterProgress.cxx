// vtkPointNeighborhoodFilter progress and abort: the engine's progress reaches VTK's
// ProgressEvent (monotonic, in [0, 1], with the stage as progress text); an abort requested from a
// progress observer stops the run without an error and leaves the output empty; the next update
// runs normally.
#include "NeighborGridFilterTesting.h"

#include <vtkCallbackCommand.h>

namespace
{

const char* const TestName = "TestPointNeighborhoodFilterProgress";

struct ProgressLog
{
  std::vector<double> values;
  std::vector<std::string> stages;
  bool abortAtFirstStage = false;
  bool aborted = false;
};

void OnProgress(vtkObject* caller, unsigned long, void* clientData, void* callData)
{
  auto* filter = static_cast<vtkPointNeighborhoodFilter*>(caller);
  auto* log = static_cast<ProgressLog*>(clientData);
  log->values.push_back(*static_cast<double*>(callData));
  const char* stage = filter->GetProgressText();
  if (stage && *stage)
  {
    log->stages.emplace_back(stage);
    if (log->abortAtFirstStage && !log->aborted)
    {
      // What a GUI's cancel button does.
      filter->SetAbortExecute(1);
      log->aborted = true;
    }
  }
}

} // namespace

int main()
{
  auto cloud = ngtest::MakeCloud(ngtest::RandomCoordinates(20000, 20.0, 9), VTK_FLOAT);
  const ngtest::Snapshot before = ngtest::Snapshot::Of(cloud);

  vtkNew<vtkPointNeighborhoodFilter> filter;
  vtkNew<ngtest::MessageCollector> messages;
  messages->Watch(filter);
  ProgressLog log;
  vtkNew<vtkCallbackCommand> progress;
  progress->SetCallback(&OnProgress);
  progress->SetClientData(&log);
  filter->AddObserver(vtkCommand::ProgressEvent, progress);
  filter->SetBackend(vtkPointNeighborhoodFilter::BACKEND_CPU);
  filter->SetRadius(0.9);
  filter->SetInputData(cloud);

  // --- Progress ----------------------------------------------------------------------------
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "progress run: " << messages->AllErrors());
  NG_CHECK(log.stages.size() >= 2, "only " << log.stages.size() << " progress reports with a stage");
  bool monotonic = true, inRange = true;
  for (size_t i = 0; i < log.values.size(); ++i)
  {
    inRange = inRange && log.values[i] >= 0.0 && log.values[i] <= 1.0;
    monotonic = monotonic && (i == 0 || log.values[i] >= log.values[i - 1]);
  }
  NG_CHECK(inRange, "progress outside [0, 1]");
  NG_CHECK(monotonic, "progress goes backwards");
  NG_CHECK(!log.values.empty() && log.values.back() == 1.0, "progress does not end at 1");
  NG_CHECK(!filter->GetProgressText() || !*filter->GetProgressText(),
    "the progress text outlives the run: " << filter->GetProgressText());
  NG_CHECK(filter->GetPolyDataOutput()->GetPointData()->GetArray("Density"), "progress run: no Density");

  // --- Abort -------------------------------------------------------------------------------
  log = ProgressLog();
  log.abortAtFirstStage = true;
  filter->Modified();
  filter->Update();
  NG_CHECK(log.aborted, "the abort was never requested (no progress report with a stage)");
  NG_CHECK(messages->Errors.empty(), "an abort must not be an error: " << messages->AllErrors());
  auto* output = vtkPointSet::SafeDownCast(filter->GetOutput());
  NG_CHECK(output->GetNumberOfPoints() == 0 && !output->GetPointData()->GetArray("Density"),
    "aborted run: the output is not empty (" << output->GetNumberOfPoints() << " points)");
  NG_CHECK(std::string(filter->GetLastRunInfo()).find("aborted") != std::string::npos,
    "aborted run: GetLastRunInfo() does not say so: " << filter->GetLastRunInfo());
  NG_CHECK(ngtest::Snapshot::Of(cloud) == before, "aborted run: the input was modified");

  // --- The next update runs normally --------------------------------------------------------
  log = ProgressLog();
  filter->SetAbortExecute(0);
  filter->Modified();
  filter->Update();
  NG_CHECK(messages->Errors.empty(), "run after abort: " << messages->AllErrors());
  NG_CHECK(filter->GetPolyDataOutput()->GetNumberOfPoints() == 20000 &&
      filter->GetPolyDataOutput()->GetPointData()->GetArray("Density"),
    "run after abort: no result");
  NG_CHECK(ngtest::Snapshot::Of(cloud) == before, "the input was modified");
  return ngtest::ExitCode(TestName);
}
