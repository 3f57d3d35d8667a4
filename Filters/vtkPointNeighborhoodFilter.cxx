// vtkPointNeighborhoodFilter: hands the points and arrays of a vtkPointSet to the NeighborGrid
// engine and writes its results back as point arrays. The request is checked and built by
// RequestBuilder (NeighborhoodRequestBuilder.h), which the probe and volume filters share; the
// MPI layer is RunDistributed (NeighborhoodDistributed.h).
//
// Behaviour worth knowing (DESIGN.md has the conventions and formulas):
// - The input is never modified: the output is a shallow copy of it with new arrays added, and its
//   field data is a new container (the input's field-data arrays are shared, not its container).
// - On an error the filter reports it with vtkErrorMacro, leaves its output EMPTY (Initialize()),
//   and returns 0. An empty output rather than an unmodified pass-through, so that neither a view
//   nor a script can mistake a failed run for a successful one.
// - A point set with zero points is an error, except for a block of a composite dataset: an empty
//   block is passed through with empty (zero-tuple) result arrays, so that every block carries the
//   same arrays and one empty block does not flag the whole composite as failed.
// - Composite datasets run through the composite pipeline, block by block. The filter watches its
//   own Start/End events to know whether a RequestData() call is one block of a composite
//   execution (the executive swaps the composite input for the block and says so nowhere else).
// - An abort (AbortExecute, or an upstream abort through CheckAbort where VTK has it) stops the
//   engine at its next progress report; the output is left empty and RequestData() returns 1, as
//   VTK filters do when they are aborted (an abort is not an error).
#include "vtkPointNeighborhoodFilter.h"

#include "vtkCallbackCommand.h"
#include "vtkCommand.h"
#include "vtkCompositeDataIterator.h"
#include "vtkCompositeDataSet.h"
#include "vtkDataArray.h"
#include "vtkDataObject.h"
#include "vtkInformation.h"
#include "vtkInformationVector.h"
#include "vtkMultiProcessController.h"
#include "vtkNew.h"
#include "vtkObjectFactory.h"
#include "vtkPointData.h"
#include "vtkPointSet.h"
#include "vtkSmartPointer.h"
#include "vtkWeakPointer.h"

#include "NeighborhoodDistributed.h"
#include "NeighborhoodRequestBuilder.h"

#include <NeighborGrid/NeighborGrid.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>
#include <type_traits>

vtkStandardNewMacro(vtkPointNeighborhoodFilter);

using neighborgrid_filters::Quoted;
using neighborgrid_filters::ToText;

namespace
{

/// CheckAbort() (VTK 9.2.20221xxx and later: also sees aborts of upstream and container
/// algorithms, and makes the executive mark the output ABORTED); plain AbortExecute otherwise.
template <typename T, typename = void>
struct HasCheckAbort : std::false_type
{
};
template <typename T>
struct HasCheckAbort<T, std::void_t<decltype(std::declval<T&>().CheckAbort())>> : std::true_type
{
};
template <typename Algorithm>
bool AbortRequested(Algorithm* algorithm)
{
  if constexpr (HasCheckAbort<Algorithm>::value)
  {
    return algorithm->CheckAbort();
  }
  else
  {
    return algorithm->GetAbortExecute() != 0;
  }
}

/// Progress between stages and slices of work drives VTK's progress events and abort checks.
/// The engine reports from the thread that called run(); should a report ever come from another
/// thread, it only reads the abort flag: VTK's events and observers are not thread-safe. The
/// last stage is shared by the copies of the callback (the distributed run copies the request).
neighborgrid::ProgressCallback ProgressReporter(vtkAlgorithm* filter)
{
  auto lastStage = std::make_shared<const char*>(nullptr);
  const std::thread::id callingThread = std::this_thread::get_id();
  return [filter, lastStage, callingThread](double fraction, const char* stage) {
    if (std::this_thread::get_id() != callingThread)
    {
      return filter->GetAbortExecute() == 0;
    }
    if (stage && stage != *lastStage && (!*lastStage || std::strcmp(stage, *lastStage) != 0))
    {
      filter->SetProgressText(stage);
      *lastStage = stage;
    }
    filter->UpdateProgress(fraction);
    return !AbortRequested(filter);
  };
}

/// Adds the result arrays to `output`'s point data, and NeighborGridInfo to `fieldSource`'s field
/// data as `output`'s own.
void AddResults(vtkDataSet* output, const std::vector<vtkSmartPointer<vtkAbstractArray>>& arrays,
  vtkDataObject* fieldSource, const std::vector<std::string>& info)
{
  for (const auto& array : arrays)
  {
    output->GetPointData()->AddArray(array);
  }
  neighborgrid_filters::AttachRunInfo(fieldSource, output, info);
}

} // namespace

//------------------------------------------------------------------------------
struct vtkPointNeighborhoodFilter::Internals
{
  /// One engine for the filter's lifetime: its device buffers and CPU thread pool are reused
  /// across updates (and across the blocks of a composite dataset).
  neighborgrid::Engine Engine;

  /// The processes the particles are spread over; the global controller unless set.
  vtkSmartPointer<vtkMultiProcessController> Controller = vtkMultiProcessController::GetGlobalController();
  int Ranks() const { return this->Controller ? std::max(1, this->Controller->GetNumberOfProcesses()) : 1; }

  /// Observes this filter's StartEvent/EndEvent. The executive fires them once around a whole
  /// composite execution (while its input is still the composite dataset) and once around each
  /// block, so they tell whether RequestData() is processing one block of a composite.
  vtkNew<vtkCallbackCommand> ExecutionObserver;
  bool InCompositeExecution = false;
  vtkWeakPointer<vtkCompositeDataSet> CompositeInput;
  std::vector<std::string> CompositeRunInfo; // LastRunInfo collected over the blocks
  std::string Block; // the block being processed (DescribeBlock), "" outside a composite execution

  /// "In block 3 'particles': " before a message about the block being processed.
  std::string Where() const { return this->Block.empty() ? std::string() : "In " + this->Block + ": "; }

  static void OnExecutionEvent(vtkObject*, unsigned long eventId, void* clientData, void*)
  {
    auto* self = static_cast<vtkPointNeighborhoodFilter*>(clientData);
    Internals& internal = *self->Internal;
    if (!self->ProcessesBlocksSeparately())
    {
      return;
    }
    auto* composite = vtkCompositeDataSet::SafeDownCast(self->GetInputDataObject(0, 0));
    if (!composite)
    {
      return; // a plain point set, or one block of a composite execution
    }
    if (eventId == vtkCommand::StartEvent)
    {
      internal.InCompositeExecution = true;
      internal.CompositeInput = composite;
      internal.CompositeRunInfo.clear();
    }
    else if (eventId == vtkCommand::EndEvent)
    {
      internal.InCompositeExecution = false;
      internal.CompositeInput = nullptr;
      std::string info;
      for (const std::string& line : internal.CompositeRunInfo)
      {
        info += line + "\n";
      }
      self->LastRunInfo = info;
      internal.CompositeRunInfo.clear();
    }
  }

  /// "block 3 'particles'" for the block being processed, "" outside a composite execution.
  std::string DescribeBlock(vtkDataObject* block) const
  {
    if (!this->InCompositeExecution || !this->CompositeInput)
    {
      return std::string();
    }
    vtkSmartPointer<vtkCompositeDataIterator> iterator;
    iterator.TakeReference(this->CompositeInput->NewIterator());
    for (iterator->InitTraversal(); !iterator->IsDoneWithTraversal(); iterator->GoToNextItem())
    {
      if (iterator->GetCurrentDataObject() == block)
      {
        std::string text = "block " + ToText(iterator->GetCurrentFlatIndex());
        if (iterator->HasCurrentMetaData() &&
          iterator->GetCurrentMetaData()->Has(vtkCompositeDataSet::NAME()))
        {
          text += " " + Quoted(iterator->GetCurrentMetaData()->Get(vtkCompositeDataSet::NAME()));
        }
        return text;
      }
    }
    return "a block";
  }
};

//------------------------------------------------------------------------------
vtkPointNeighborhoodFilter::vtkPointNeighborhoodFilter()
  : Internal(new Internals)
{
  this->Internal->ExecutionObserver->SetCallback(&Internals::OnExecutionEvent);
  this->Internal->ExecutionObserver->SetClientData(this);
  this->AddObserver(vtkCommand::StartEvent, this->Internal->ExecutionObserver);
  this->AddObserver(vtkCommand::EndEvent, this->Internal->ExecutionObserver);
}

//------------------------------------------------------------------------------
vtkPointNeighborhoodFilter::~vtkPointNeighborhoodFilter()
{
  this->RemoveObserver(this->Internal->ExecutionObserver);
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::SetController(vtkMultiProcessController* controller)
{
  if (this->Internal->Controller != controller)
  {
    this->Internal->Controller = controller;
    this->Modified();
  }
}

vtkMultiProcessController* vtkPointNeighborhoodFilter::GetController()
{
  return this->Internal->Controller;
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::AddSmoothedArray(const char* name)
{
  if (!name || !*name)
  {
    vtkWarningMacro("AddSmoothedArray: ignoring an empty array name");
    return;
  }
  if (std::find(this->SmoothedArrays.begin(), this->SmoothedArrays.end(), name) !=
    this->SmoothedArrays.end())
  {
    return; // already selected: smoothing it twice would only write the same array twice
  }
  this->SmoothedArrays.emplace_back(name);
  this->Modified();
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::ClearSmoothedArrays()
{
  if (!this->SmoothedArrays.empty())
  {
    this->SmoothedArrays.clear();
    this->Modified();
  }
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::GetNumberOfSmoothedArrays() const
{
  return static_cast<int>(this->SmoothedArrays.size());
}

//------------------------------------------------------------------------------
const char* vtkPointNeighborhoodFilter::GetSmoothedArray(int index) const
{
  if (index < 0 || index >= static_cast<int>(this->SmoothedArrays.size()))
  {
    return nullptr;
  }
  return this->SmoothedArrays[static_cast<size_t>(index)].c_str();
}

//------------------------------------------------------------------------------
const char* vtkPointNeighborhoodFilter::GetLastRunInfo() const
{
  return this->LastRunInfo.c_str();
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::FillInputPortInformation(int port, vtkInformation* info)
{
  if (port != 0)
  {
    return 0;
  }
  // Point sets only; the composite pipeline iterates over the blocks of composite datasets.
  info->Set(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkPointSet");
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::RequestData(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  vtkPointSet* input = vtkPointSet::GetData(inputVector[0]);
  vtkPointSet* output = vtkPointSet::GetData(outputVector);
  if (!input || !output)
  {
    vtkErrorMacro("The input and the output must be vtkPointSets.");
    return 0;
  }
  // Inside a composite execution, messages and LastRunInfo say which block they concern.
  this->Internal->Block = this->Internal->DescribeBlock(input);

  const bool readsRadius = this->Operation != SMOOTHING_LENGTH && !this->RadiusArraySelected();
  if (readsRadius && !(std::isfinite(this->Radius) && this->Radius > 0.0))
  {
    return this->ReportError(output, "The radius must be a finite number > 0 (got " + ToText(this->Radius) + ").");
  }
  const std::string propertiesError = RequestBuilder::PropertiesError(this, true);
  if (!propertiesError.empty())
  {
    return this->ReportError(output, propertiesError);
  }
  const bool distributed = this->Internal->Ranks() > 1;
  if (distributed && this->Internal->InCompositeExecution)
  {
    return this->ReportError(output, "With several processes (MPI) the blocks of a composite dataset would each need "
                                     "their own collective run: merge the blocks first (Merge Blocks).");
  }
  // Empty input: an error on its own, passed through as a composite block. Under MPI a process
  // without points still takes part: the others may send it nothing, but they wait for it.
  if (input->GetNumberOfPoints() == 0 && !distributed)
  {
    if (!this->Internal->InCompositeExecution)
    {
      return this->ReportError(output, "The input has no points.");
    }
    output->ShallowCopy(input);
    const std::vector<std::string> info = { "points=0", "skipped=the block has no points" };
    AddResults(output, RequestBuilder::EmptyBlockArrays(this, input), input, info);
    this->SetLastRunInfo(info);
    return 1;
  }
  // The output: a shallow copy of the input plus the results.
  return this->ComputeInto(input, QuerySpec{}, input, output, [&] { output->ShallowCopy(input); });
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::ComputeNeighborhood(
  vtkPointSet* particles, const QuerySpec& queries, ComputeResult& result)
{
  RequestBuilder builder(this, particles, queries);
  builder.SetTransferMemory(this->Internal->Ranks() == 1);
  if (!builder.Build())
  {
    // The other processes wait for this one in the run: tell them it will not come.
    neighborgrid_filters::ReportFailureToOtherRanks(this->Internal->Controller, builder.Error());
    result.Error = builder.Error();
    return 0;
  }
  neighborgrid::Request& request = builder.Request();
  request.progress = ProgressReporter(this);

  // From here on the run is collective: a failure is every process's (RunDistributed says so).
  neighborgrid::Report report;
  neighborgrid_filters::DistributedSummary distributed;
  int status = 1;
  try
  {
    this->Internal->Engine.setMemoryLimit(static_cast<std::int64_t>(this->MemoryLimit * 1048576.0));
    report = neighborgrid_filters::RunDistributed(this->Internal->Engine, request,
      queries.Kind == QuerySpec::PARTICLES, builder.GhostFlags(), this->Internal->Controller, distributed);
  }
  catch (const neighborgrid::Aborted& aborted)
  {
    status = 2;
    result.AbortMessage = aborted.what();
  }
  catch (const neighborgrid::Error& error)
  {
    status = 0;
    result.Error = error.what();
  }
  catch (const std::exception& error)
  {
    // std::bad_alloc and the like: still a message, never an exception through the pipeline.
    status = 0;
    result.Error = std::string("NeighborGrid failed: ") + error.what();
  }
  this->SetProgressText(nullptr);
  if (status == 1)
  {
    result.Arrays = builder.ResultArrays();
    result.Info = builder.RunInfo(report, distributed);
  }
  return status;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::ComputeInto(vtkPointSet* particles, const QuerySpec& queries,
  vtkDataObject* fieldSource, vtkDataSet* output, const std::function<void()>& shapeOutput)
{
  ComputeResult result;
  const int status = this->ComputeNeighborhood(particles, queries, result);
  if (status == 2)
  {
    vtkDebugMacro(<< this->Internal->Where() << result.AbortMessage);
    output->Initialize();
    this->SetLastRunInfo({ "aborted=" + result.AbortMessage });
    return 1;
  }
  if (status == 0)
  {
    return this->ReportError(output, result.Error);
  }
  shapeOutput();
  AddResults(output, result.Arrays, fieldSource, result.Info);
  this->SetLastRunInfo(result.Info);
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::ReportError(vtkDataObject* output, const std::string& message)
{
  // The output is left EMPTY (see the top of this file).
  vtkErrorMacro(<< this->Internal->Where() << message);
  if (output)
  {
    output->Initialize();
  }
  this->SetLastRunInfo({ "error=" + message });
  return 0;
}

//------------------------------------------------------------------------------
bool vtkPointNeighborhoodFilter::RadiusArraySelected()
{
  return neighborgrid_filters::ArraySelected(this, RADIUS_ARRAY);
}

//------------------------------------------------------------------------------
double vtkPointNeighborhoodFilter::LargestRadius(vtkPointSet* particles)
{
  if (!this->RadiusArraySelected())
  {
    return this->Radius;
  }
  vtkDataArray* radii = nullptr;
  std::string error;
  if (!particles ||
    !neighborgrid_filters::SelectedPointArray(
      this, RADIUS_ARRAY, particles, "radius", "the constant Radius", radii, error) ||
    !radii)
  {
    return 0.0;
  }
  double largest = 0.0;
  for (vtkIdType i = 0; i < radii->GetNumberOfTuples(); ++i)
  {
    const double r = radii->GetComponent(i, 0);
    if (std::isfinite(r) && r > largest)
    {
      largest = r;
    }
  }
  return largest;
}

//------------------------------------------------------------------------------
vtkSmartPointer<vtkPointSet> vtkPointNeighborhoodFilter::GatherParticles(vtkDataObject* input, std::string& error)
{
  return neighborgrid_filters::ParticlesOf(input, error);
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::AttachInfo(
  vtkDataObject* source, vtkDataObject* output, const std::vector<std::string>& info)
{
  neighborgrid_filters::AttachRunInfo(source, output, info);
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::SetLastRunInfo(const std::vector<std::string>& info)
{
  const std::string& block = this->Internal->Block;
  std::string text = block.empty() ? std::string() : "[" + block + "]\n";
  for (const std::string& entry : info)
  {
    text += entry + "\n";
  }
  if (this->Internal->InCompositeExecution)
  {
    this->Internal->CompositeRunInfo.push_back(text);
  }
  else
  {
    this->LastRunInfo = text;
  }
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::PrintSelf(ostream& os, vtkIndent indent)
{
  using namespace neighborgrid_filters; // the Engine* names of the enumerations
  this->Superclass::PrintSelf(os, indent);
  os << indent << "Radius: " << this->Radius << "\n";
  os << indent << "Operation: " << this->Operation << " ("
     << neighborgrid::toString(EngineOperation(this->Operation)) << ")\n";
  os << indent << "NeighborTarget: " << this->NeighborTarget << "\n";
  os << indent << "SmoothingLengthMode: " << this->SmoothingLengthMode << " ("
     << neighborgrid::toString(EngineSmoothingLengthMode(this->SmoothingLengthMode)) << ")\n";
  os << indent << "RadiusArray: " << (this->RadiusArraySelected() ? "selected (input array 1)" : "none") << "\n";
  os << indent << "Kernel: " << this->Kernel << " ("
     << neighborgrid::toString(EngineKernel(this->Kernel)) << ")\n";
  os << indent << "Dimension: " << this->Dimension << "\n";
  os << indent << "Mass: " << this->Mass << "\n";
  os << indent << "SmoothedArrays (" << this->SmoothedArrays.size() << "):";
  for (const std::string& name : this->SmoothedArrays)
  {
    os << " " << Quoted(name);
  }
  os << "\n";
  os << indent << "Normalization: " << this->Normalization << " ("
     << neighborgrid::toString(EngineNormalization(this->Normalization)) << ")\n";
  os << indent << "Backend: " << this->Backend << " ("
     << neighborgrid::toString(EngineBackend(this->Backend)) << ")\n";
  os << indent << "Method: " << this->Method << " ("
     << neighborgrid::toString(EngineMethod(this->Method)) << ")\n";
  os << indent << "NullValue: " << this->NullValue << "\n";
  os << indent << "MemoryLimit: " << this->MemoryLimit << " MiB\n";
  os << indent << "Periodic: " << this->Periodic[0] << " " << this->Periodic[1] << " " << this->Periodic[2] << "\n";
  os << indent << "BoxOrigin: " << this->BoxOrigin[0] << " " << this->BoxOrigin[1] << " " << this->BoxOrigin[2] << "\n";
  os << indent << "BoxLengths: " << this->BoxLengths[0] << " " << this->BoxLengths[1] << " " << this->BoxLengths[2]
     << "\n";
  os << indent << "ValidPointMaskArrayName: " << this->ValidPointMaskArrayName << "\n";
  os << indent << "LastRunInfo: " << (this->LastRunInfo.empty() ? "(none)\n" : "\n");
  std::istringstream lines(this->LastRunInfo);
  for (std::string line; std::getline(lines, line);)
  {
    os << indent.GetNextIndent() << line << "\n";
  }
}
