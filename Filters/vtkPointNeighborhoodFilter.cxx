// vtkPointNeighborhoodFilter: hands the points and arrays of a vtkPointSet to the NeighborGrid
// engine and writes its results back as point arrays.
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

#include "vtkAOSDataArrayTemplate.h"
#include "vtkArrayDispatch.h"
#include "vtkCallbackCommand.h"
#include "vtkCommand.h"
#include "vtkCompositeDataIterator.h"
#include "vtkCompositeDataSet.h"
#include "vtkDataArray.h"
#include "vtkDataArrayRange.h"
#include "vtkDataObject.h"
#include "vtkDataSet.h"
#include "vtkDataSetAttributes.h"
#include "vtkFieldData.h"
#include "vtkFloatArray.h"
#include "vtkInformation.h"
#include "vtkInformationVector.h"
#include "vtkIntArray.h"
#include "vtkMultiProcessController.h"
#include "vtkNew.h"
#include "vtkObjectFactory.h"
#include "vtkPointData.h"
#include "vtkPointSet.h"
#include "vtkPolyData.h"
#include "vtkPoints.h"
#include "vtkSmartPointer.h"
#include "vtkStringArray.h"
#include "vtkUnsignedCharArray.h"
#include "vtkWeakPointer.h"

#include "NeighborhoodDistributed.h"

#include <NeighborGrid/NeighborGrid.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

vtkStandardNewMacro(vtkPointNeighborhoodFilter);

namespace
{

/// Name of the field-data string array that describes the run.
constexpr const char* InfoArrayName = "NeighborGridInfo";

static_assert(sizeof(int) == sizeof(std::int32_t), "vtkIntArray must hold the engine's int32 counts");

/// vtkArrayDispatch worker: copies every value of a numeric array (tuple after tuple, components
/// interleaved as in VTK) to a buffer of OutT.
template <typename OutT>
struct CopyValuesWorker
{
  template <typename ArrayT>
  void operator()(ArrayT* array, OutT* out) const
  {
    const auto values = vtk::DataArrayValueRange(array);
    std::transform(
      values.cbegin(), values.cend(), out, [](auto value) { return static_cast<OutT>(value); });
  }
};

/// Converts any vtkDataArray to OutT. The common array types get a fast path through the
/// dispatcher; anything else (vtkBitArray, implicit or custom arrays) goes through vtkDataArray's
/// generic API.
template <typename OutT>
void CopyValues(vtkDataArray* array, OutT* out)
{
  CopyValuesWorker<OutT> worker;
  if (!vtkArrayDispatch::Dispatch::Execute(array, worker, out))
  {
    worker(array, out);
  }
}

/// The contiguous float storage of `array` when it already is one (then the engine reads VTK's
/// memory directly), otherwise a float copy of it in `scratch`.
const float* FloatValues(vtkDataArray* array, std::vector<float>& scratch)
{
  if (auto* floats = vtkArrayDownCast<vtkAOSDataArrayTemplate<float>>(array))
  {
    return floats->GetPointer(0);
  }
  scratch.resize(static_cast<size_t>(array->GetNumberOfValues()));
  CopyValues(array, scratch.data());
  return scratch.data();
}

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

neighborgrid::Operation ToEngine(int operation)
{
  switch (operation)
  {
    case vtkPointNeighborhoodFilter::NEIGHBOR_COUNT:
      return neighborgrid::Operation::NeighborCount;
    case vtkPointNeighborhoodFilter::KERNEL_SMOOTHING:
      return neighborgrid::Operation::Smoothing;
    case vtkPointNeighborhoodFilter::GRADIENT:
      return neighborgrid::Operation::Gradient;
    case vtkPointNeighborhoodFilter::DENSITY:
    default:
      return neighborgrid::Operation::Density;
  }
}

neighborgrid::Kernel KernelToEngine(int kernel)
{
  switch (kernel)
  {
    case vtkPointNeighborhoodFilter::QUARTIC_SPLINE:
      return neighborgrid::Kernel::QuarticSpline;
    case vtkPointNeighborhoodFilter::QUINTIC_SPLINE:
      return neighborgrid::Kernel::QuinticSpline;
    case vtkPointNeighborhoodFilter::WENDLAND_C2:
      return neighborgrid::Kernel::WendlandC2;
    case vtkPointNeighborhoodFilter::CUBIC_SPLINE:
    default:
      return neighborgrid::Kernel::CubicSpline;
  }
}

neighborgrid::Normalization NormalizationToEngine(int normalization)
{
  return normalization == vtkPointNeighborhoodFilter::SPH ? neighborgrid::Normalization::SPH
                                                           : neighborgrid::Normalization::Shepard;
}

neighborgrid::SmoothingLengthMode SmoothingLengthModeToEngine(int mode)
{
  switch (mode)
  {
    case vtkPointNeighborhoodFilter::SCATTER:
      return neighborgrid::SmoothingLengthMode::Scatter;
    case vtkPointNeighborhoodFilter::SYMMETRIC:
      return neighborgrid::SmoothingLengthMode::Symmetric;
    case vtkPointNeighborhoodFilter::GATHER:
    default:
      return neighborgrid::SmoothingLengthMode::Gather;
  }
}

neighborgrid::Backend BackendToEngine(int backend)
{
  switch (backend)
  {
    case vtkPointNeighborhoodFilter::BACKEND_CUDA:
      return neighborgrid::Backend::CUDA;
    case vtkPointNeighborhoodFilter::BACKEND_CPU:
      return neighborgrid::Backend::CPU;
    case vtkPointNeighborhoodFilter::BACKEND_AUTO:
    default:
      return neighborgrid::Backend::Auto;
  }
}

neighborgrid::Method MethodToEngine(int method)
{
  switch (method)
  {
    case vtkPointNeighborhoodFilter::METHOD_COUNTING_SORT:
      return neighborgrid::Method::CountingSort;
    case vtkPointNeighborhoodFilter::METHOD_BRUTE_FORCE:
      return neighborgrid::Method::BruteForce;
    case vtkPointNeighborhoodFilter::METHOD_FENNS:
      return neighborgrid::Method::FENNS;
    case vtkPointNeighborhoodFilter::METHOD_RADIX_SORT:
      return neighborgrid::Method::RadixSort;
    case vtkPointNeighborhoodFilter::METHOD_CLAWS:
      return neighborgrid::Method::CLAWS;
    case vtkPointNeighborhoodFilter::METHOD_BAYRAKTAR:
      return neighborgrid::Method::Bayraktar;
    case vtkPointNeighborhoodFilter::METHOD_STAGED_TILES:
      return neighborgrid::Method::StagedTiles;
    case vtkPointNeighborhoodFilter::METHOD_AUTO:
    default:
      return neighborgrid::Method::Auto;
  }
}

std::string Quoted(const std::string& name)
{
  return "'" + name + "'";
}

/// "a vtkStringArray" / "an vtkIdTypeArray": for messages about arrays of the wrong kind.
std::string ArrayKind(vtkAbstractArray* array)
{
  return std::string("a ") + array->GetClassName();
}

template <typename T>
std::string ToText(const T& value)
{
  std::ostringstream stream;
  stream << value;
  return stream.str();
}

/// A new array of `components` x `tuples` values, named, for the output.
template <typename ArrayT>
vtkSmartPointer<ArrayT> NewResultArray(const std::string& name, int components, vtkIdType tuples)
{
  auto array = vtkSmartPointer<ArrayT>::New();
  array->SetName(name.c_str());
  array->SetNumberOfComponents(components);
  array->SetNumberOfTuples(tuples);
  return array;
}

/// The names of a gradient array's components: "d/dx", "d/dy", "d/dz" for a one-component
/// array; "d<component>/dx", ... for several, the component's name or else its index.
void NameGradientComponents(vtkDataArray* values, vtkDataArray* gradient)
{
  const int components = values->GetNumberOfComponents();
  for (int c = 0; c < components; ++c)
  {
    std::string component;
    if (components > 1)
    {
      const char* name = values->GetComponentName(c);
      component = name && *name ? std::string(name) : ToText(c);
    }
    for (int a = 0; a < 3; ++a)
    {
      gradient->SetComponentName(3 * c + a, ("d" + component + "/d" + "xyz"[a]).c_str());
    }
  }
}

/// The selection of input array `index` (SetInputArrayToProcess), or null.
vtkInformation* ArraySelection(vtkAlgorithm* algorithm, int index)
{
  vtkInformationVector* selections = algorithm->GetInformation()->Get(vtkAlgorithm::INPUT_ARRAYS_TO_PROCESS());
  return selections ? selections->GetInformationObject(index) : nullptr;
}

/// Whether input array `index` selects an array, from the selection alone: a name other than ""
/// and "None", or an attribute type.
bool ArraySelected(vtkAlgorithm* algorithm, int index)
{
  vtkInformation* selection = ArraySelection(algorithm, index);
  if (!selection)
  {
    return false;
  }
  if (selection->Has(vtkDataObject::FIELD_NAME()))
  {
    const char* name = selection->Get(vtkDataObject::FIELD_NAME());
    return name && *name && std::strcmp(name, "None") != 0;
  }
  return selection->Has(vtkDataObject::FIELD_ATTRIBUTE_TYPE());
}

/// The one-component numeric point array of `particles` selected as input array `index` of
/// `algorithm` (the mass array, the radius array). Returns true with `array` (null when none is
/// selected), false with `error`. `what` names the array in messages ("mass"), `otherwise` says
/// what is used without one ("the constant Mass").
bool SelectedPointArray(vtkAlgorithm* algorithm, int index, vtkPointSet* particles, const std::string& what,
  const std::string& otherwise, vtkDataArray*& array, std::string& error)
{
  array = nullptr;
  vtkPointData* pointData = particles->GetPointData();
  vtkInformation* selection = ArraySelection(algorithm, index);
  const char* name =
    selection && selection->Has(vtkDataObject::FIELD_NAME()) ? selection->Get(vtkDataObject::FIELD_NAME()) : nullptr;
  // No name, an empty name, and ParaView's none entry "None" (its ArrayListDomain passes the
  // none_string through as the name) all mean "no array". A point array that really is named
  // "None" is still used.
  const bool noneEntry = name && std::strcmp(name, "None") == 0 && !pointData->GetAbstractArray(name);
  const bool byName = name && *name && !noneEntry;
  const bool byAttribute =
    !byName && selection && !selection->Has(vtkDataObject::FIELD_NAME()) && selection->Has(vtkDataObject::FIELD_ATTRIBUTE_TYPE());
  if (!byName && !byAttribute)
  {
    return true;
  }
  const int association = selection->Has(vtkDataObject::FIELD_ASSOCIATION())
    ? selection->Get(vtkDataObject::FIELD_ASSOCIATION())
    : vtkDataObject::FIELD_ASSOCIATION_POINTS;
  if (association != vtkDataObject::FIELD_ASSOCIATION_POINTS &&
    association != vtkDataObject::FIELD_ASSOCIATION_POINTS_THEN_CELLS)
  {
    error = "The " + what + " array must be a point array (input array " + ToText(index) +
      " is selected with field association " + ToText(association) + ").";
    return false;
  }
  if (byName)
  {
    vtkAbstractArray* candidate = pointData->GetAbstractArray(name);
    if (!candidate)
    {
      error = "The " + what + " array " + Quoted(name) + " is not a point array of the input. Select an existing point array, or none to use " + otherwise + ".";
      return false;
    }
    array = vtkDataArray::SafeDownCast(candidate);
    if (!array)
    {
      error = "The " + what + " array " + Quoted(name) + " is " + ArrayKind(candidate) + ", not a numeric array.";
      return false;
    }
  }
  else
  {
    // What vtkAlgorithm::GetInputArrayToProcess finds for a point association.
    array = pointData->GetAttribute(selection->Get(vtkDataObject::FIELD_ATTRIBUTE_TYPE()));
    if (!array)
    {
      error = "The " + what + " is selected by attribute type (input array " + ToText(index) +
        "), but the input has no such point array.";
      return false;
    }
  }
  if (array->GetNumberOfComponents() != 1)
  {
    error = "The " + what + " array " + Quoted(array->GetName() ? array->GetName() : "(unnamed)") + " has " +
      ToText(array->GetNumberOfComponents()) + " components; it must have exactly 1.";
    array = nullptr;
    return false;
  }
  return true;
}

/// Gives `output` its own field data: the input's arrays plus a NeighborGridInfo string array
/// (replacing one from an upstream NeighborGrid filter). A new container, because
/// vtkDataObject::ShallowCopy shares the input's field-data object in some VTK versions, and
/// adding to it would modify the input.
void AttachRunInfo(vtkDataObject* input, vtkDataObject* output, const std::vector<std::string>& info)
{
  vtkNew<vtkFieldData> fieldData;
  if (input->GetFieldData())
  {
    fieldData->ShallowCopy(input->GetFieldData());
  }
  vtkNew<vtkStringArray> infoArray;
  infoArray->SetName(InfoArrayName);
  for (const std::string& entry : info)
  {
    infoArray->InsertNextValue(entry);
  }
  fieldData->RemoveArray(InfoArrayName);
  fieldData->AddArray(infoArray);
  output->SetFieldData(fieldData);
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
  const std::string block = this->Internal->DescribeBlock(input);
  const std::string where = block.empty() ? std::string() : "In " + block + ": ";
  std::vector<std::string> info; // NeighborGridInfo entries

  auto storeRunInfo = [&](const std::vector<std::string>& entries) {
    std::string text;
    if (!block.empty())
    {
      text += "[" + block + "]\n";
    }
    for (const std::string& entry : entries)
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
  };
  // Every failure leaves an empty output (see the top of this file) and says what and where.
  auto fail = [&](const std::string& message) {
    vtkErrorMacro(<< where << message);
    output->Initialize();
    storeRunInfo({ "error=" + message });
    return 0;
  };

  if (!this->RadiusArraySelected() && !(std::isfinite(this->Radius) && this->Radius > 0.0))
  {
    return fail("The radius must be a finite number > 0 (got " + ToText(this->Radius) + ").");
  }

  const vtkIdType pointCount = input->GetNumberOfPoints();
  vtkPointData* inputPointData = input->GetPointData();
  const neighborgrid::Operation operation = ToEngine(this->Operation);
  const bool gradient = operation == neighborgrid::Operation::Gradient;
  const bool usesMass = operation == neighborgrid::Operation::Density || gradient ||
    (operation == neighborgrid::Operation::Smoothing && this->Normalization == SPH);
  const bool outputsDensity = usesMass;

  if (operation == neighborgrid::Operation::Smoothing && this->SmoothedArrays.empty())
  {
    return fail("Kernel Smoothing needs at least one point array to smooth (AddSmoothedArray).");
  }
  if (gradient && this->SmoothedArrays.empty())
  {
    return fail("Gradient needs at least one point array to differentiate (AddSmoothedArray; "
                "SmoothedArrays in ParaView).");
  }

  const bool distributed = this->Internal->Ranks() > 1;
  if (distributed && this->Internal->InCompositeExecution)
  {
    return fail("With several processes (MPI) the blocks of a composite dataset would each need their own "
                "collective run: merge the blocks first (Merge Blocks).");
  }

  // --- Empty input: an error on its own, passed through as a composite block -----------------
  // Under MPI a process without points still takes part: the others may send it nothing, but
  // they wait for it.
  if (pointCount == 0 && !distributed)
  {
    if (!this->Internal->InCompositeExecution)
    {
      return fail("The input has no points.");
    }
    output->ShallowCopy(input);
    vtkPointData* outputPointData = output->GetPointData();
    if (operation == neighborgrid::Operation::NeighborCount)
    {
      outputPointData->AddArray(NewResultArray<vtkIntArray>("NeighborCount", 1, 0));
    }
    if (outputsDensity)
    {
      outputPointData->AddArray(NewResultArray<vtkFloatArray>("Density", 1, 0));
    }
    if (operation == neighborgrid::Operation::Smoothing || gradient)
    {
      for (const std::string& name : this->SmoothedArrays)
      {
        // An empty block may lack the arrays altogether: there is nothing to smooth then.
        if (auto* values = vtkDataArray::SafeDownCast(inputPointData->GetAbstractArray(name.c_str())))
        {
          const int components = values->GetNumberOfComponents();
          auto empty = NewResultArray<vtkFloatArray>(
            name + (gradient ? "_gradient" : "_smoothed"), gradient ? 3 * components : components, 0);
          if (gradient)
          {
            NameGradientComponents(values, empty);
          }
          outputPointData->AddArray(empty);
        }
      }
    }
    info = { "points=0", "skipped=the block has no points" };
    AttachRunInfo(input, output, info);
    storeRunInfo(info);
    return 1;
  }

  // --- Run, then the output: a shallow copy of the input plus the results ---------------------
  ComputeResult result;
  const int status = this->ComputeNeighborhood(input, QuerySpec{}, result);
  if (status == 2)
  {
    vtkDebugMacro(<< where << result.AbortMessage);
    output->Initialize();
    storeRunInfo({ "aborted=" + result.AbortMessage });
    return 1;
  }
  if (status == 0)
  {
    return fail(result.Error);
  }
  output->ShallowCopy(input);
  for (const auto& array : result.Arrays)
  {
    output->GetPointData()->AddArray(array);
  }
  info = result.Info;
  AttachRunInfo(input, output, info);
  storeRunInfo(info);
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodFilter::ComputeNeighborhood(
  vtkPointSet* particles, const QuerySpec& queries, ComputeResult& result)
{
  vtkMultiProcessController* controller = this->Internal->Controller;
  bool collectiveRunStarted = false;
  auto fail = [&](const std::string& message) {
    if (!collectiveRunStarted)
    {
      // The other processes wait for this one in the run: tell them it will not come.
      neighborgrid_filters::ReportFailureToOtherRanks(controller, message);
    }
    result.Error = message;
    return 0;
  };
  const vtkIdType particleCount = particles->GetNumberOfPoints();
  const vtkIdType resultCount = queries.Kind == QuerySpec::PARTICLES ? particleCount : queries.Count;
  vtkPointData* inputPointData = particles->GetPointData();
  const neighborgrid::Operation operation = ToEngine(this->Operation);
  const bool gradient = operation == neighborgrid::Operation::Gradient;
  const bool usesArrays = operation == neighborgrid::Operation::Smoothing || gradient;
  const bool usesMass = operation == neighborgrid::Operation::Density || gradient ||
    (operation == neighborgrid::Operation::Smoothing && this->Normalization == SPH);
  const bool outputsDensity = usesMass;
  const bool radiusArraySelected = this->RadiusArraySelected();

  // --- Checks that depend on the properties only (so every process decides alike) ------------
  if (usesArrays && this->SmoothedArrays.empty())
  {
    return fail(gradient ? "Gradient needs at least one point array to differentiate (AddSmoothedArray; "
                           "SmoothedArrays in ParaView)."
                         : "Kernel Smoothing needs at least one point array to smooth (AddSmoothedArray).");
  }
  if (gradient && queries.Kind != QuerySpec::PARTICLES)
  {
    return fail("Gradient is computed at the particles only: it needs the value and density of the point "
                "itself (f_j - f_i, with rho_j of every neighbor), which a probe or volume point does not "
                "have. Run Point Neighborhood with Operation Gradient on the particles, then probe its "
                "'<name>_gradient' arrays with Kernel Smoothing.");
  }
  if (radiusArraySelected && queries.Kind != QuerySpec::PARTICLES && this->SmoothingLengthMode != SCATTER)
  {
    return fail(std::string("With a probe or volume the radius array gives the particles' (source) radii, "
                            "and a probe point has no radius of its own: only SmoothingLengthMode Scatter "
                            "applies (|x - x_j| <= R_j, W(r, h_j)), not ") +
      neighborgrid::toString(SmoothingLengthModeToEngine(this->SmoothingLengthMode)) + ".");
  }

  // --- The request ---------------------------------------------------------------------------
  neighborgrid::Request request;
  request.radius = this->Radius;
  request.smoothingLengthMode = SmoothingLengthModeToEngine(this->SmoothingLengthMode);
  request.operation = operation;
  request.kernel = KernelToEngine(this->Kernel);
  request.dimension = this->Dimension;
  request.normalization = NormalizationToEngine(this->Normalization);
  request.backend = BackendToEngine(this->Backend);
  request.method = MethodToEngine(this->Method);
  request.constantMass = this->Mass;

  // The periodic box: the properties, or the particles' field data where BoxLengths is 0.
  std::string boxDescription;
  for (int a = 0; a < 3; ++a)
  {
    if (!this->Periodic[a])
    {
      continue;
    }
    double origin = this->BoxOrigin[a], length = this->BoxLengths[a];
    std::string from = "properties";
    if (length == 0.0)
    {
      vtkFieldData* fieldData = particles->GetFieldData();
      vtkDataArray* lengths = fieldData ? fieldData->GetArray("BoxLengths") : nullptr;
      vtkDataArray* origins = fieldData ? fieldData->GetArray("BoxOrigin") : nullptr;
      if (!lengths || lengths->GetNumberOfValues() < 3)
      {
        return fail(std::string("Periodic is on along ") + "xyz"[a] +
          " but BoxLengths is 0 there and the particles carry no BoxLengths field-data array (3 values): set "
          "BoxLengths (and BoxOrigin).");
      }
      length = lengths->GetNumberOfComponents() >= 3 ? lengths->GetComponent(0, a) : lengths->GetComponent(a, 0);
      origin = 0.0;
      if (origins && origins->GetNumberOfValues() >= 3)
      {
        origin = origins->GetNumberOfComponents() >= 3 ? origins->GetComponent(0, a) : origins->GetComponent(a, 0);
      }
      from = "field data";
    }
    if (!(std::isfinite(length) && length > 0.0 && std::isfinite(origin)))
    {
      return fail(std::string("The periodic box along ") + "xyz"[a] + " needs a finite origin and a length > 0 (got origin " +
        ToText(origin) + ", length " + ToText(length) + ", from the " + from + ").");
    }
    request.periodic[a] = true;
    request.boxOrigin[a] = origin;
    request.boxLengths[a] = length;
    boxDescription += std::string(boxDescription.empty() ? "" : " ") + "xyz"[a] + ":[" + ToText(origin) + "," +
      ToText(origin + length) + ")(" + from + ")";
  }

  // Coordinates: float and double go to the engine as they are (it converts them to float
  // relative to the bounds' minimum itself); any other type is converted to double first.
  std::vector<double> convertedCoordinates;
  neighborgrid::Points particlePoints;
  vtkDataArray* coordinates = particles->GetPoints() ? particles->GetPoints()->GetData() : nullptr;
  if (!coordinates || particleCount == 0)
  {
    particlePoints = neighborgrid::Points(static_cast<const float*>(nullptr), 0); // a process without points
  }
  else if (auto* floats = vtkArrayDownCast<vtkAOSDataArrayTemplate<float>>(coordinates))
  {
    particlePoints = neighborgrid::Points(floats->GetPointer(0), particleCount);
  }
  else if (auto* doubles = vtkArrayDownCast<vtkAOSDataArrayTemplate<double>>(coordinates))
  {
    particlePoints = neighborgrid::Points(doubles->GetPointer(0), particleCount);
  }
  else
  {
    convertedCoordinates.resize(static_cast<size_t>(3 * particleCount));
    CopyValues(coordinates, convertedCoordinates.data());
    particlePoints = neighborgrid::Points(convertedCoordinates.data(), particleCount);
  }

  // Mass: input array 0 when one is selected, else the constant Mass. Only checked when the
  // operation uses it, so a stale selection does not break Neighbor Count or Shepard smoothing.
  std::vector<float> massScratch;
  std::string massDescription = "constant " + ToText(this->Mass);
  if (usesMass)
  {
    vtkDataArray* mass = nullptr;
    std::string error;
    if (!SelectedPointArray(this, MASS_ARRAY, particles, "mass", "the constant Mass", mass, error))
    {
      return fail(error);
    }
    if (mass)
    {
      request.mass = FloatValues(mass, massScratch);
      massDescription = "array " + Quoted(mass->GetName() ? mass->GetName() : "(unnamed)");
    }
  }

  // Radii: input array 1 when one is selected (it replaces Radius), every value finite and > 0
  // once converted to float, which is what the engine reads.
  std::vector<float> radiusScratch;
  std::string radiusDescription = ToText(this->Radius);
  float smallestRadius = 0.0f, largestRadius = 0.0f;
  if (radiusArraySelected)
  {
    vtkDataArray* radii = nullptr;
    std::string error;
    if (!SelectedPointArray(this, RADIUS_ARRAY, particles, "radius", "the constant Radius", radii, error))
    {
      return fail(error);
    }
    if (radii)
    {
      const std::string shownName = radii->GetName() ? radii->GetName() : "(unnamed)";
      const float* values = particleCount > 0 ? FloatValues(radii, radiusScratch) : nullptr;
      smallestRadius = HUGE_VALF;
      for (vtkIdType i = 0; i < particleCount; ++i)
      {
        const float r = values[i];
        if (!(std::isfinite(r) && r > 0.0f))
        {
          const double original = radii->GetComponent(i, 0);
          const bool outOfRange = std::isfinite(original) && original > 0.0;
          return fail("The radius array " + Quoted(shownName) + " has the value " + ToText(original) + " at point " +
            ToText(i) + (outOfRange ? ", which is outside float's range" : "") +
            ": every radius must be a finite number > 0.");
        }
        smallestRadius = std::min(smallestRadius, r);
        largestRadius = std::max(largestRadius, r);
      }
      request.radii = values;
      radiusDescription = "array " + Quoted(shownName);
    }
  }

  // Arrays to smooth (or to differentiate): any numeric point array, any number of components.
  std::vector<std::vector<float>> smoothedScratch;
  std::vector<vtkSmartPointer<vtkFloatArray>> smoothedOutputs;
  if (usesArrays)
  {
    smoothedScratch.resize(this->SmoothedArrays.size());
    for (size_t i = 0; i < this->SmoothedArrays.size(); ++i)
    {
      const std::string& name = this->SmoothedArrays[i];
      vtkAbstractArray* candidate = inputPointData->GetAbstractArray(name.c_str());
      if (!candidate)
      {
        return fail("The array to smooth " + Quoted(name) + " is not a point array of the input.");
      }
      auto* values = vtkDataArray::SafeDownCast(candidate);
      if (!values)
      {
        return fail("The array to smooth " + Quoted(name) + " is " + ArrayKind(candidate) +
          ", not a numeric array.");
      }
      const int components = values->GetNumberOfComponents();
      vtkSmartPointer<vtkFloatArray> result;
      if (gradient)
      {
        // d/dx, d/dy, d/dz of component 0, then of component 1, ...
        result = NewResultArray<vtkFloatArray>(name + "_gradient", 3 * components, resultCount);
        NameGradientComponents(values, result);
      }
      else
      {
        result = NewResultArray<vtkFloatArray>(name + "_smoothed", components, resultCount);
        for (int c = 0; c < components; ++c)
        {
          if (const char* componentName = values->GetComponentName(c))
          {
            result->SetComponentName(c, componentName);
          }
        }
      }
      neighborgrid::SmoothedArray smoothed;
      smoothed.values = FloatValues(values, smoothedScratch[i]);
      smoothed.components = components;
      smoothed.output = result->GetPointer(0);
      smoothed.name = name;
      request.smoothed.push_back(std::move(smoothed));
      smoothedOutputs.push_back(result);
    }
  }

  // Results are written straight into the new VTK arrays: no copy afterwards.
  vtkSmartPointer<vtkIntArray> neighborCount;
  if (operation == neighborgrid::Operation::NeighborCount)
  {
    neighborCount = NewResultArray<vtkIntArray>("NeighborCount", 1, resultCount);
    request.neighborCount = reinterpret_cast<std::int32_t*>(neighborCount->GetPointer(0));
  }
  vtkSmartPointer<vtkFloatArray> density;
  if (outputsDensity)
  {
    density = NewResultArray<vtkFloatArray>("Density", 1, resultCount);
    request.density = density->GetPointer(0);
  }

  // Progress between stages and slices of work drives VTK's progress events and abort checks.
  // The engine reports from the thread that called run(); should a report ever come from another
  // thread, it only reads the abort flag: VTK's events and observers are not thread-safe.
  const char* lastStage = nullptr;
  const std::thread::id callingThread = std::this_thread::get_id();
  request.progress = [this, &lastStage, callingThread](double fraction, const char* stage) {
    if (std::this_thread::get_id() != callingThread)
    {
      return this->GetAbortExecute() == 0;
    }
    if (stage && stage != lastStage && (!lastStage || std::strcmp(stage, lastStage) != 0))
    {
      this->SetProgressText(stage);
      lastStage = stage;
    }
    this->UpdateProgress(fraction);
    return !AbortRequested(this);
  };

  // Where the results go: the particles themselves, other points, or a grid.
  std::vector<double> convertedQueries;
  vtkSmartPointer<vtkUnsignedCharArray> validMask;
  if (queries.Kind == QuerySpec::PARTICLES)
  {
    request.points = particlePoints;
  }
  else
  {
    request.source = particlePoints;
    request.nullValue = static_cast<float>(this->NullValue);
    if (queries.Kind == QuerySpec::GRID)
    {
      for (int a = 0; a < 3; ++a)
      {
        request.queryGrid.origin[a] = queries.Origin[a];
        request.queryGrid.spacing[a] = queries.Spacing[a];
        request.queryGrid.dimensions[a] = queries.Dimensions[a];
      }
    }
    else if (!queries.Coordinates || resultCount == 0)
    {
      request.points = neighborgrid::Points(static_cast<const float*>(nullptr), 0); // a process without queries
    }
    else if (auto* floats = vtkArrayDownCast<vtkAOSDataArrayTemplate<float>>(queries.Coordinates))
    {
      request.points = neighborgrid::Points(floats->GetPointer(0), resultCount);
    }
    else if (auto* doubles = vtkArrayDownCast<vtkAOSDataArrayTemplate<double>>(queries.Coordinates))
    {
      request.points = neighborgrid::Points(doubles->GetPointer(0), resultCount);
    }
    else
    {
      convertedQueries.resize(static_cast<size_t>(3 * resultCount));
      CopyValues(queries.Coordinates, convertedQueries.data());
      request.points = neighborgrid::Points(convertedQueries.data(), resultCount);
    }
    validMask = vtkSmartPointer<vtkUnsignedCharArray>::New();
    validMask->SetName(this->ValidPointMaskArrayName.c_str());
    validMask->SetNumberOfTuples(resultCount);
    request.valid = validMask->GetPointer(0);
  }

  // --- Run -----------------------------------------------------------------------------------
  neighborgrid::Report report;
  neighborgrid_filters::DistributedSummary distributed;
  vtkUnsignedCharArray* ghosts = particles->GetPointGhostArray();
  try
  {
    collectiveRunStarted = true;
    this->Internal->Engine.setMemoryLimit(static_cast<std::int64_t>(this->MemoryLimit * 1048576.0));
    report = neighborgrid_filters::RunDistributed(this->Internal->Engine, request,
      queries.Kind == QuerySpec::PARTICLES, ghosts && ghosts->GetNumberOfTuples() == particleCount ? ghosts->GetPointer(0) : nullptr, controller,
      distributed);
  }
  catch (const neighborgrid::Aborted& aborted)
  {
    this->SetProgressText(nullptr);
    result.AbortMessage = aborted.what();
    return 2;
  }
  catch (const neighborgrid::Error& error)
  {
    this->SetProgressText(nullptr);
    return fail(error.what());
  }
  catch (const std::exception& error)
  {
    // std::bad_alloc and the like: still a message, never an exception through the pipeline.
    this->SetProgressText(nullptr);
    return fail(std::string("NeighborGrid failed: ") + error.what());
  }
  this->SetProgressText(nullptr);

  // --- The result arrays, for the caller to attach --------------------------------------------
  if (neighborCount)
  {
    result.Arrays.push_back(neighborCount);
  }
  if (density)
  {
    result.Arrays.push_back(density);
  }
  for (const auto& smoothed : smoothedOutputs)
  {
    result.Arrays.push_back(smoothed);
  }
  if (validMask)
  {
    result.Arrays.push_back(validMask);
  }
  std::vector<std::string>& info = result.Info;

  info.push_back(std::string("backend=") + neighborgrid::toString(report.backend));
  info.push_back("backend_reason=" + report.backendReason);
  info.push_back(std::string("method=") + neighborgrid::toString(report.method));
  info.push_back("device=" + report.device);
  info.push_back(std::string("operation=") + neighborgrid::toString(ToEngine(this->Operation)));
  if (operation != neighborgrid::Operation::NeighborCount)
  {
    info.push_back(std::string("kernel=") + neighborgrid::toString(request.kernel));
    info.push_back("dimension=" + ToText(this->Dimension));
  }
  if (operation == neighborgrid::Operation::Smoothing)
  {
    info.push_back(std::string("normalization=") + neighborgrid::toString(request.normalization));
  }
  if (usesMass)
  {
    info.push_back("mass=" + massDescription);
  }
  info.push_back("radius=" + radiusDescription);
  if (request.radii)
  {
    info.push_back("radius_range=" + ToText(smallestRadius) + " " + ToText(largestRadius));
    info.push_back(std::string("smoothing_length_mode=") + neighborgrid::toString(request.smoothingLengthMode));
    info.push_back("radius_levels=" + ToText(report.radiusLevels));
    info.push_back("radius_searches=" + ToText(report.radiusSearches));
  }
  if (!boxDescription.empty())
  {
    info.push_back("periodic=" + boxDescription);
    info.push_back("periodic_images=" + ToText(static_cast<vtkIdType>(report.periodicImages)));
  }
  info.push_back("points=" + ToText(particleCount));
  if (report.slabs > 1)
  {
    info.push_back("slabs=" + ToText(static_cast<vtkIdType>(report.slabs)));
    info.push_back("slab_halo_points=" + ToText(static_cast<vtkIdType>(report.slabHaloPoints)));
  }
  if (distributed.ranks > 1 || distributed.ghostPoints > 0)
  {
    info.push_back("rank=" + ToText(distributed.rank) + " of " + ToText(distributed.ranks));
    info.push_back("halo_points_received=" + ToText(static_cast<vtkIdType>(distributed.haloReceived)));
    info.push_back("halo_points_sent=" + ToText(static_cast<vtkIdType>(distributed.haloSent)));
    info.push_back("ghost_points=" + ToText(static_cast<vtkIdType>(distributed.ghostPoints)));
    info.push_back("cuda_device=" + ToText(distributed.cudaDevice));
  }
  if (queries.Kind != QuerySpec::PARTICLES)
  {
    info.push_back("queries=" + ToText(resultCount));
  }
  for (const neighborgrid::StageTime& stage : report.stages)
  {
    info.push_back("stage." + stage.stage + "_ms=" + ToText(stage.milliseconds));
  }
  if (report.neighborPairs >= 0)
  {
    info.push_back("neighbor_pairs=" + ToText(report.neighborPairs));
  }
  info.push_back("extra_device_bytes=" + ToText(report.extraDeviceBytes));

  return 1;
}

//------------------------------------------------------------------------------
bool vtkPointNeighborhoodFilter::RadiusArraySelected()
{
  return ArraySelected(this, RADIUS_ARRAY);
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
  if (!particles || !SelectedPointArray(this, RADIUS_ARRAY, particles, "radius", "the constant Radius", radii, error) ||
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
vtkSmartPointer<vtkPointSet> vtkPointNeighborhoodFilter::GatherParticles(
  vtkDataObject* input, std::string& error)
{
  if (auto* points = vtkPointSet::SafeDownCast(input))
  {
    return points;
  }
  auto* composite = vtkCompositeDataSet::SafeDownCast(input);
  if (!composite)
  {
    error = std::string("The particles (Input) must be a vtkPointSet or a composite dataset of them, not ") +
      (input ? input->GetClassName() : "nothing") + ".";
    return nullptr;
  }
  std::vector<vtkPointSet*> blocks;
  vtkSmartPointer<vtkCompositeDataIterator> iterator;
  iterator.TakeReference(composite->NewIterator());
  for (iterator->InitTraversal(); !iterator->IsDoneWithTraversal(); iterator->GoToNextItem())
  {
    vtkDataObject* block = iterator->GetCurrentDataObject();
    auto* points = vtkPointSet::SafeDownCast(block);
    if (!points)
    {
      if (auto* dataSet = vtkDataSet::SafeDownCast(block))
      {
        if (dataSet->GetNumberOfPoints() == 0)
        {
          continue;
        }
      }
      error = "Block " + ToText(iterator->GetCurrentFlatIndex()) + " of the particles (Input) is " +
        (block ? std::string("a ") + block->GetClassName() : std::string("missing")) + ", not a vtkPointSet.";
      return nullptr;
    }
    if (points->GetNumberOfPoints() > 0)
    {
      blocks.push_back(points);
    }
  }
  if (blocks.size() == 1)
  {
    return blocks[0];
  }
  // The blocks' points one after the other, with the point arrays common to all of them.
  vtkIdType total = 0;
  vtkDataSetAttributes::FieldList fields(static_cast<int>(blocks.size()));
  for (size_t b = 0; b < blocks.size(); ++b)
  {
    total += blocks[b]->GetNumberOfPoints();
    if (b == 0)
    {
      fields.InitializeFieldList(blocks[b]->GetPointData());
    }
    else
    {
      fields.IntersectFieldList(blocks[b]->GetPointData());
    }
  }
  auto merged = vtkSmartPointer<vtkPolyData>::New();
  vtkNew<vtkPoints> points;
  points->SetDataTypeToDouble();
  points->SetNumberOfPoints(total);
  merged->GetPointData()->CopyAllocate(fields, total);
  vtkIdType next = 0;
  for (size_t b = 0; b < blocks.size(); ++b)
  {
    const vtkIdType n = blocks[b]->GetNumberOfPoints();
    vtkDataArray* from = blocks[b]->GetPoints()->GetData();
    for (vtkIdType i = 0; i < n; ++i)
    {
      double x[3];
      from->GetTuple(i, x);
      points->SetPoint(next + i, x);
    }
    merged->GetPointData()->CopyData(fields, blocks[b]->GetPointData(), static_cast<int>(b), next, n, 0);
    next += n;
  }
  merged->SetPoints(points);
  merged->GetFieldData()->ShallowCopy(input->GetFieldData()); // a box the composite carries
  return merged;
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::AttachInfo(
  vtkDataObject* source, vtkDataObject* output, const std::vector<std::string>& info)
{
  AttachRunInfo(source, output, info);
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::SetLastRunInfo(const std::vector<std::string>& info)
{
  std::string text;
  for (const std::string& entry : info)
  {
    text += entry + "\n";
  }
  this->LastRunInfo = text;
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodFilter::PrintSelf(ostream& os, vtkIndent indent)
{
  this->Superclass::PrintSelf(os, indent);
  os << indent << "Radius: " << this->Radius << "\n";
  os << indent << "Operation: " << this->Operation << " (" << neighborgrid::toString(ToEngine(this->Operation))
     << ")\n";
  os << indent << "SmoothingLengthMode: " << this->SmoothingLengthMode << " ("
     << neighborgrid::toString(SmoothingLengthModeToEngine(this->SmoothingLengthMode)) << ")\n";
  os << indent << "RadiusArray: " << (this->RadiusArraySelected() ? "selected (input array 1)" : "none") << "\n";
  os << indent << "Kernel: " << this->Kernel << " ("
     << neighborgrid::toString(KernelToEngine(this->Kernel)) << ")\n";
  os << indent << "Dimension: " << this->Dimension << "\n";
  os << indent << "Mass: " << this->Mass << "\n";
  os << indent << "SmoothedArrays (" << this->SmoothedArrays.size() << "):";
  for (const std::string& name : this->SmoothedArrays)
  {
    os << " " << Quoted(name);
  }
  os << "\n";
  os << indent << "Normalization: " << this->Normalization << " ("
     << neighborgrid::toString(NormalizationToEngine(this->Normalization)) << ")\n";
  os << indent << "Backend: " << this->Backend << " ("
     << neighborgrid::toString(BackendToEngine(this->Backend)) << ")\n";
  os << indent << "Method: " << this->Method << " ("
     << neighborgrid::toString(MethodToEngine(this->Method)) << ")\n";
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
