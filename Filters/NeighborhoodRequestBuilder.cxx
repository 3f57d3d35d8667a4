// The units of NeighborhoodRequestBuilder.h, in its order, then the builder that strings them
// together.
#include "NeighborhoodRequestBuilder.h"

#include "vtkAOSDataArrayTemplate.h"
#include "vtkArrayDispatch.h"
#include "vtkCompositeDataIterator.h"
#include "vtkCompositeDataSet.h"
#include "vtkDataArray.h"
#include "vtkDataArrayRange.h"
#include "vtkDataObject.h"
#include "vtkDataSet.h"
#include "vtkDataSetAttributes.h"
#include "vtkDoubleArray.h"
#include "vtkFieldData.h"
#include "vtkFloatArray.h"
#include "vtkImageData.h"
#include "vtkInformation.h"
#include "vtkInformationVector.h"
#include "vtkIntArray.h"
#include "vtkMatrix3x3.h"
#include "vtkNew.h"
#include "vtkPointData.h"
#include "vtkPointSet.h"
#include "vtkPoints.h"
#include "vtkPolyData.h"
#include "vtkStringArray.h"
#include "vtkUnsignedCharArray.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace neighborgrid_filters
{
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

/// "a vtkStringArray": for messages about arrays of the wrong kind.
std::string ArrayKind(vtkAbstractArray* array)
{
  return std::string("a ") + array->GetClassName();
}

std::string ShownName(vtkAbstractArray* array)
{
  return array->GetName() ? array->GetName() : "(unnamed)";
}

void ReleaseTransferMemory(void* memory)
{
  neighborgrid::Engine::releaseTransferMemory(memory);
}

/// Room for `tuples` tuples of a result array. Where the run will be on the GPU (`transfer`),
/// arrays of 1 MiB or more go in the engine's pinned transfer memory, which the GPU writes with
/// one DMA and whose pages are always resident (NeighborGrid.h, allocateTransferMemory); VTK
/// gives it back through ReleaseTransferMemory. Otherwise arrays above 32 MiB go in transparent
/// huge pages (Linux, where the kernel gives them on request). glibc maps an array that large afresh at
/// every run and unmaps it when the pipeline runs again, a page fault and a page freed per 4 KiB
/// (a 64 MB array: 16,384 of each; the filter's Update() on 16M points, H100 machine: 54.5 ms
/// in small pages, 50.7 in huge ones, the engine alone 50.0). Smaller arrays come back from the
/// heap already in place, which huge pages of their own only slowed (4M points: +0.15 ms).
template <typename ArrayT>
void AllocateResultValues(ArrayT* array, vtkIdType tuples, bool transfer)
{
  using Value = typename ArrayT::ValueType;
  const vtkIdType values = tuples * array->GetNumberOfComponents();
  const std::size_t bytes = static_cast<std::size_t>(values) * sizeof(Value);
  if (transfer && bytes >= (std::size_t(1) << 20))
  {
    if (void* memory = neighborgrid::Engine::allocateTransferMemory(bytes))
    {
      array->SetArray(static_cast<Value*>(memory), values, 0, vtkAbstractArray::VTK_DATA_ARRAY_USER_DEFINED);
      array->SetArrayFreeFunction(&ReleaseTransferMemory);
      return;
    }
  }
#if defined(__linux__)
  constexpr std::size_t hugePage = std::size_t(2) << 20;
  if (bytes > 16 * hugePage)
  {
    const std::size_t rounded = (bytes + hugePage - 1) / hugePage * hugePage;
    if (void* memory = std::aligned_alloc(hugePage, rounded))
    {
      madvise(memory, rounded, MADV_HUGEPAGE); // advice only: without it the pages are small
      array->SetArray(static_cast<Value*>(memory), values, 0, vtkAbstractArray::VTK_DATA_ARRAY_FREE);
      return;
    }
  }
#endif
  array->SetNumberOfTuples(tuples);
}

/// A new array of `components` x `tuples` values, named, for the output.
template <typename ArrayT>
vtkSmartPointer<ArrayT> NewResultArray(const std::string& name, int components, vtkIdType tuples, bool transfer = false)
{
  auto array = vtkSmartPointer<ArrayT>::New();
  array->SetName(name.c_str());
  array->SetNumberOfComponents(components);
  AllocateResultValues(array.Get(), tuples, transfer);
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

/// The output of one array to smooth: "<name>_smoothed" with its components, or for the gradient
/// "<name>_gradient" with d/dx, d/dy, d/dz of component 0, then of component 1, ...
vtkSmartPointer<vtkFloatArray> NewSmoothedOutput(
  vtkDataArray* values, const std::string& name, bool gradient, vtkIdType tuples, bool transfer = false)
{
  const int components = values->GetNumberOfComponents();
  if (!gradient)
  {
    return NewResultArray<vtkFloatArray>(name + "_smoothed", components, tuples, transfer);
  }
  auto output = NewResultArray<vtkFloatArray>(name + "_gradient", 3 * components, tuples, transfer);
  NameGradientComponents(values, output);
  return output;
}

/// The selection of input array `index` (SetInputArrayToProcess), or null.
vtkInformation* ArraySelection(vtkAlgorithm* algorithm, int index)
{
  vtkInformationVector* selections = algorithm->GetInformation()->Get(vtkAlgorithm::INPUT_ARRAYS_TO_PROCESS());
  return selections ? selections->GetInformationObject(index) : nullptr;
}

/// The point array a selection by attribute type finds, as vtkAlgorithm::GetInputArrayToProcess
/// finds it for a point association.
bool AttributeArray(vtkInformation* selection, int index, vtkPointData* pointData, const std::string& what,
  vtkDataArray*& array, std::string& error)
{
  array = pointData->GetAttribute(selection->Get(vtkDataObject::FIELD_ATTRIBUTE_TYPE()));
  if (!array)
  {
    error = "The " + what + " is selected by attribute type (input array " + ToText(index) +
      "), but the input has no such point array.";
    return false;
  }
  return true;
}

/// The numeric point array named `name`, or false with the error.
bool NamedArray(const char* name, vtkPointData* pointData, const std::string& what, const std::string& otherwise,
  vtkDataArray*& array, std::string& error)
{
  vtkAbstractArray* candidate = pointData->GetAbstractArray(name);
  if (!candidate)
  {
    error = "The " + what + " array " + Quoted(name) +
      " is not a point array of the input. Select an existing point array, or none to use " + otherwise + ".";
    return false;
  }
  array = vtkDataArray::SafeDownCast(candidate);
  if (!array)
  {
    error = "The " + what + " array " + Quoted(name) + " is " + ArrayKind(candidate) + ", not a numeric array.";
    return false;
  }
  return true;
}

/// Appends point sets: their points (as double) one after the other, with the point arrays that
/// all of them have, and the field data of `fieldSource` (a box the composite carries).
vtkSmartPointer<vtkPointSet> AppendBlocks(const std::vector<vtkPointSet*>& blocks, vtkDataObject* fieldSource)
{
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
  merged->GetFieldData()->ShallowCopy(fieldSource->GetFieldData());
  return merged;
}

/// One value of a field-data box array of 3 values, stored as 1 tuple of 3 or 3 tuples of 1.
double BoxValue(vtkDataArray* values, int axis)
{
  return values->GetNumberOfComponents() >= 3 ? values->GetComponent(0, axis) : values->GetComponent(axis, 0);
}

} // namespace

//------------------------------------------------------------------------------
// The filter's enumerations in the engine's terms
neighborgrid::Operation EngineOperation(int operation)
{
  switch (operation)
  {
    case vtkPointNeighborhoodFilter::NEIGHBOR_COUNT:
      return neighborgrid::Operation::NeighborCount;
    case vtkPointNeighborhoodFilter::KERNEL_SMOOTHING:
      return neighborgrid::Operation::Smoothing;
    case vtkPointNeighborhoodFilter::GRADIENT:
      return neighborgrid::Operation::Gradient;
    case vtkPointNeighborhoodFilter::SMOOTHING_LENGTH:
      return neighborgrid::Operation::SmoothingLength;
    case vtkPointNeighborhoodFilter::DENSITY:
    default:
      return neighborgrid::Operation::Density;
  }
}

neighborgrid::Kernel EngineKernel(int kernel)
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

neighborgrid::Normalization EngineNormalization(int normalization)
{
  return normalization == vtkPointNeighborhoodFilter::SPH ? neighborgrid::Normalization::SPH
                                                           : neighborgrid::Normalization::Shepard;
}

neighborgrid::SmoothingLengthMode EngineSmoothingLengthMode(int mode)
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

neighborgrid::Backend EngineBackend(int backend)
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

neighborgrid::Method EngineMethod(int method)
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
    case vtkPointNeighborhoodFilter::METHOD_RADIUS_TREE:
      return neighborgrid::Method::RadiusTree;
    case vtkPointNeighborhoodFilter::METHOD_AUTO:
    default:
      return neighborgrid::Method::Auto;
  }
}

OperationTraits::OperationTraits(int operation, int normalization)
  : Operation(EngineOperation(operation))
  , Gradient(this->Operation == neighborgrid::Operation::Gradient)
  , SmoothingLength(this->Operation == neighborgrid::Operation::SmoothingLength)
  , UsesArrays(this->Operation == neighborgrid::Operation::Smoothing || this->Gradient)
  , UsesMass(this->Operation == neighborgrid::Operation::Density || this->Gradient ||
      (this->Operation == neighborgrid::Operation::Smoothing && normalization == vtkPointNeighborhoodFilter::SPH))
{
}

std::string Quoted(const std::string& name)
{
  return "'" + name + "'";
}

//------------------------------------------------------------------------------
// The particles and their coordinates
vtkSmartPointer<vtkPointSet> ParticlesOf(vtkDataObject* input, std::string& error)
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
  // The non-empty point-set blocks; an empty block of another type is passed over.
  std::vector<vtkPointSet*> blocks;
  vtkSmartPointer<vtkCompositeDataIterator> iterator;
  iterator.TakeReference(composite->NewIterator());
  for (iterator->InitTraversal(); !iterator->IsDoneWithTraversal(); iterator->GoToNextItem())
  {
    vtkDataObject* block = iterator->GetCurrentDataObject();
    auto* points = vtkPointSet::SafeDownCast(block);
    auto* dataSet = vtkDataSet::SafeDownCast(block);
    if (!points && !(dataSet && dataSet->GetNumberOfPoints() == 0))
    {
      error = "Block " + ToText(iterator->GetCurrentFlatIndex()) + " of the particles (Input) is " +
        (block ? std::string("a ") + block->GetClassName() : std::string("missing")) + ", not a vtkPointSet.";
      return nullptr;
    }
    if (points && points->GetNumberOfPoints() > 0)
    {
      blocks.push_back(points);
    }
  }
  if (blocks.size() == 1)
  {
    return blocks[0];
  }
  return AppendBlocks(blocks, input);
}

const unsigned char* GhostFlagsOf(vtkPointSet* particles)
{
  vtkUnsignedCharArray* ghosts = particles->GetPointGhostArray();
  return ghosts && ghosts->GetNumberOfTuples() == particles->GetNumberOfPoints() ? ghosts->GetPointer(0) : nullptr;
}

neighborgrid::Points EngineCoordinates::Of(vtkDataArray* coordinates, vtkIdType count)
{
  if (!coordinates || count == 0)
  {
    return neighborgrid::Points(static_cast<const float*>(nullptr), 0); // a process without points
  }
  if (auto* floats = vtkArrayDownCast<vtkAOSDataArrayTemplate<float>>(coordinates))
  {
    return neighborgrid::Points(floats->GetPointer(0), count);
  }
  if (auto* doubles = vtkArrayDownCast<vtkAOSDataArrayTemplate<double>>(coordinates))
  {
    return neighborgrid::Points(doubles->GetPointer(0), count);
  }
  this->Converted.resize(static_cast<size_t>(3 * count));
  CopyValues(coordinates, this->Converted.data());
  return neighborgrid::Points(this->Converted.data(), count);
}

//------------------------------------------------------------------------------
// The periodic box
bool PeriodicBox::Read(const int periodic[3], const double origin[3], const double lengths[3],
  vtkFieldData* particleFields, neighborgrid::Request& request, std::string& error)
{
  vtkDataArray* fieldLengths = particleFields ? particleFields->GetArray("BoxLengths") : nullptr;
  vtkDataArray* fieldOrigins = particleFields ? particleFields->GetArray("BoxOrigin") : nullptr;
  for (int a = 0; a < 3; ++a)
  {
    if (!periodic[a])
    {
      continue;
    }
    double axisOrigin = origin[a], axisLength = lengths[a];
    std::string from = "properties";
    if (axisLength == 0.0)
    {
      if (!fieldLengths || fieldLengths->GetNumberOfValues() < 3)
      {
        error = std::string("Periodic is on along ") + "xyz"[a] +
          " but BoxLengths is 0 there and the particles carry no BoxLengths field-data array (3 values): set "
          "BoxLengths (and BoxOrigin).";
        return false;
      }
      axisLength = BoxValue(fieldLengths, a);
      axisOrigin = fieldOrigins && fieldOrigins->GetNumberOfValues() >= 3 ? BoxValue(fieldOrigins, a) : 0.0;
      from = "field data";
    }
    if (!(std::isfinite(axisLength) && axisLength > 0.0 && std::isfinite(axisOrigin)))
    {
      error = std::string("The periodic box along ") + "xyz"[a] + " needs a finite origin and a length > 0 (got origin " +
        ToText(axisOrigin) + ", length " + ToText(axisLength) + ", from the " + from + ").";
      return false;
    }
    request.periodic[a] = true;
    request.boxOrigin[a] = axisOrigin;
    request.boxLengths[a] = axisLength;
    this->Text += std::string(this->Text.empty() ? "" : " ") + "xyz"[a] + ":[" + ToText(axisOrigin) + "," +
      ToText(axisOrigin + axisLength) + ")(" + from + ")";
  }
  return true;
}

//------------------------------------------------------------------------------
// The selected arrays
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

bool SelectedPointArray(vtkAlgorithm* algorithm, int index, vtkPointSet* particles, const std::string& what,
  const std::string& otherwise, vtkDataArray*& array, std::string& error)
{
  array = nullptr;
  vtkPointData* pointData = particles->GetPointData();
  vtkInformation* selection = ArraySelection(algorithm, index);
  const bool hasName = selection && selection->Has(vtkDataObject::FIELD_NAME());
  const char* name = hasName ? selection->Get(vtkDataObject::FIELD_NAME()) : nullptr;
  // No name, an empty name, and ParaView's none entry "None" (its ArrayListDomain passes the
  // none_string through as the name) all mean "no array". A point array that really is named
  // "None" is still used.
  const bool noneEntry = name && std::strcmp(name, "None") == 0 && !pointData->GetAbstractArray(name);
  const bool byName = name && *name && !noneEntry;
  const bool byAttribute = !byName && selection && !hasName && selection->Has(vtkDataObject::FIELD_ATTRIBUTE_TYPE());
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
  const bool found = byName ? NamedArray(name, pointData, what, otherwise, array, error)
                            : AttributeArray(selection, index, pointData, what, array, error);
  if (!found)
  {
    return false;
  }
  if (array->GetNumberOfComponents() != 1)
  {
    error = "The " + what + " array " + Quoted(ShownName(array)) + " has " + ToText(array->GetNumberOfComponents()) +
      " components; it must have exactly 1.";
    array = nullptr;
    return false;
  }
  return true;
}

bool MassInput::Read(vtkAlgorithm* algorithm, vtkPointSet* particles, double constantMass,
  neighborgrid::Request& request, std::string& error)
{
  this->Text = "constant " + ToText(constantMass);
  vtkDataArray* mass = nullptr;
  if (!SelectedPointArray(algorithm, vtkPointNeighborhoodFilter::MASS_ARRAY, particles, "mass", "the constant Mass",
        mass, error))
  {
    return false;
  }
  if (mass)
  {
    request.mass = FloatValues(mass, this->Converted);
    this->Text = "array " + Quoted(ShownName(mass));
  }
  return true;
}

bool RadiusInput::Read(vtkAlgorithm* algorithm, vtkPointSet* particles, double constantRadius,
  neighborgrid::Request& request, std::string& error)
{
  this->Text = ToText(constantRadius);
  if (!ArraySelected(algorithm, vtkPointNeighborhoodFilter::RADIUS_ARRAY))
  {
    return true;
  }
  vtkDataArray* radii = nullptr;
  if (!SelectedPointArray(algorithm, vtkPointNeighborhoodFilter::RADIUS_ARRAY, particles, "radius",
        "the constant Radius", radii, error))
  {
    return false;
  }
  if (!radii)
  {
    return true;
  }
  const vtkIdType count = particles->GetNumberOfPoints();
  const float* values = count > 0 ? FloatValues(radii, this->Converted) : nullptr;
  this->SmallestValue = HUGE_VALF;
  for (vtkIdType i = 0; i < count; ++i)
  {
    const float r = values[i];
    if (!(std::isfinite(r) && r > 0.0f))
    {
      const double original = radii->GetComponent(i, 0);
      const bool outOfRange = std::isfinite(original) && original > 0.0;
      error = "The radius array " + Quoted(ShownName(radii)) + " has the value " + ToText(original) + " at point " +
        ToText(i) + (outOfRange ? ", which is outside float's range" : "") +
        ": every radius must be a finite number > 0.";
      return false;
    }
    this->SmallestValue = std::min(this->SmallestValue, r);
    this->LargestValue = std::max(this->LargestValue, r);
  }
  request.radii = values;
  this->Text = "array " + Quoted(ShownName(radii));
  return true;
}

bool SmoothedInputs::Read(const std::vector<std::string>& names, vtkPointData* pointData,
  neighborgrid::Request& request, std::string& error)
{
  this->Converted.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i)
  {
    const std::string& name = names[i];
    vtkAbstractArray* candidate = pointData->GetAbstractArray(name.c_str());
    if (!candidate)
    {
      error = "The array to smooth " + Quoted(name) + " is not a point array of the input.";
      return false;
    }
    auto* values = vtkDataArray::SafeDownCast(candidate);
    if (!values)
    {
      error = "The array to smooth " + Quoted(name) + " is " + ArrayKind(candidate) + ", not a numeric array.";
      return false;
    }
    neighborgrid::SmoothedArray smoothed;
    smoothed.values = FloatValues(values, this->Converted[i]);
    smoothed.components = values->GetNumberOfComponents();
    smoothed.name = name;
    request.smoothed.push_back(std::move(smoothed));
    this->Values.push_back(values);
  }
  return true;
}

//------------------------------------------------------------------------------
// The result arrays
void ResultArrays::Allocate(const OperationTraits& traits, const std::vector<vtkDataArray*>& smoothed,
  const std::vector<std::string>& names, vtkIdType count, neighborgrid::Request& request)
{
  const bool transfer = this->UsesTransferMemory(request);
  for (size_t i = 0; i < smoothed.size(); ++i)
  {
    auto output = NewSmoothedOutput(smoothed[i], names[i], traits.Gradient, count, transfer);
    for (int c = 0; !traits.Gradient && c < smoothed[i]->GetNumberOfComponents(); ++c)
    {
      if (const char* componentName = smoothed[i]->GetComponentName(c))
      {
        output->SetComponentName(c, componentName);
      }
    }
    request.smoothed[i].output = output->GetPointer(0);
    this->Smoothed.push_back(output);
  }
  if (traits.Operation == neighborgrid::Operation::NeighborCount)
  {
    this->NeighborCount = NewResultArray<vtkIntArray>("NeighborCount", 1, count, transfer);
    request.neighborCount = reinterpret_cast<std::int32_t*>(this->NeighborCount->GetPointer(0));
  }
  if (traits.UsesMass)
  {
    this->Density = NewResultArray<vtkFloatArray>("Density", 1, count, transfer);
    request.density = this->Density->GetPointer(0);
  }
  if (traits.SmoothingLength)
  {
    this->SupportRadius = NewResultArray<vtkFloatArray>("SupportRadius", 1, count, transfer);
    request.supportRadius = this->SupportRadius->GetPointer(0);
  }
}

void ResultArrays::AllocateValidMask(const std::string& name, vtkIdType count, neighborgrid::Request& request)
{
  this->ValidMask = vtkSmartPointer<vtkUnsignedCharArray>::New();
  this->ValidMask->SetName(name.c_str());
  AllocateResultValues(this->ValidMask.Get(), count, this->UsesTransferMemory(request));
  request.valid = this->ValidMask->GetPointer(0);
}

bool ResultArrays::UsesTransferMemory(const neighborgrid::Request& request) const
{
  return this->TransferMemory && request.backend != neighborgrid::Backend::CPU;
}

std::vector<vtkSmartPointer<vtkAbstractArray>> ResultArrays::All() const
{
  std::vector<vtkSmartPointer<vtkAbstractArray>> all;
  if (this->NeighborCount)
  {
    all.push_back(this->NeighborCount);
  }
  if (this->Density)
  {
    all.push_back(this->Density);
  }
  if (this->SupportRadius)
  {
    all.push_back(this->SupportRadius);
  }
  all.insert(all.end(), this->Smoothed.begin(), this->Smoothed.end());
  if (this->ValidMask)
  {
    all.push_back(this->ValidMask);
  }
  return all;
}

std::vector<vtkSmartPointer<vtkAbstractArray>> ResultArrays::ForEmptyBlock(
  const OperationTraits& traits, const std::vector<std::string>& names, vtkPointData* pointData)
{
  std::vector<vtkSmartPointer<vtkAbstractArray>> arrays;
  if (traits.Operation == neighborgrid::Operation::NeighborCount)
  {
    arrays.push_back(NewResultArray<vtkIntArray>("NeighborCount", 1, 0));
  }
  if (traits.UsesMass)
  {
    arrays.push_back(NewResultArray<vtkFloatArray>("Density", 1, 0));
  }
  if (traits.SmoothingLength)
  {
    arrays.push_back(NewResultArray<vtkFloatArray>("SupportRadius", 1, 0));
  }
  for (size_t i = 0; traits.UsesArrays && i < names.size(); ++i)
  {
    // An empty block may lack the arrays altogether: there is nothing to smooth then.
    if (auto* values = vtkDataArray::SafeDownCast(pointData->GetAbstractArray(names[i].c_str())))
    {
      arrays.push_back(NewSmoothedOutput(values, names[i], traits.Gradient, 0));
    }
  }
  return arrays;
}

//------------------------------------------------------------------------------
// The run info
void AttachRunInfo(vtkDataObject* input, vtkDataObject* output, const std::vector<std::string>& info)
{
  // A new container, because vtkDataObject::ShallowCopy shares the input's field-data object in
  // some VTK versions, and adding to it would modify the input.
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

} // namespace neighborgrid_filters

//------------------------------------------------------------------------------
// The builder
using namespace neighborgrid_filters;

vtkPointNeighborhoodFilter::RequestBuilder::RequestBuilder(
  vtkPointNeighborhoodFilter* filter, vtkPointSet* particles, const QuerySpec& queries)
  : Filter(filter)
  , Particles(particles)
  , Queries(queries)
  , Traits(filter->Operation, filter->Normalization)
  , ResultCount(queries.Kind == QuerySpec::PARTICLES ? particles->GetNumberOfPoints() : queries.Count)
{
}

bool vtkPointNeighborhoodFilter::RequestBuilder::Build()
{
  // One concern after the other, in the order the checks have always run: the first problem
  // found is the one reported.
  this->ErrorText = PropertiesError(this->Filter, this->Queries.Kind == QuerySpec::PARTICLES);
  if (!this->ErrorText.empty())
  {
    return false;
  }
  this->SetOptions();
  // NEIGHBORGRID_TRANSFER_MEMORY=0|1, a benchmarking knob: 0 keeps the results in ordinary memory,
  // to measure what transfer memory saves. A misspelled value must not measure the default.
  if (const char* knob = std::getenv("NEIGHBORGRID_TRANSFER_MEMORY"))
  {
    const std::string value = knob;
    if (value != "0" && value != "1")
    {
      this->ErrorText = "NEIGHBORGRID_TRANSFER_MEMORY is '" + value + "'; it takes '0' or '1'.";
      return false;
    }
    if (value == "0")
    {
      this->Results.SetTransferMemory(false);
    }
  }
  if (!this->AddPeriodicBox())
  {
    return false;
  }
  this->AddParticles();
  if (!this->AddSelectedArrays())
  {
    return false;
  }
  this->Results.Allocate(
    this->Traits, this->Smoothed.Arrays(), this->Filter->SmoothedArrays, this->ResultCount, this->EngineRequest);
  this->AddQueries();
  return true;
}

std::string vtkPointNeighborhoodFilter::RequestBuilder::PropertiesError(
  vtkPointNeighborhoodFilter* filter, bool atParticles)
{
  const OperationTraits traits(filter->Operation, filter->Normalization);
  if (traits.UsesArrays && filter->SmoothedArrays.empty())
  {
    return traits.Gradient ? "Gradient needs at least one point array to differentiate (AddSmoothedArray; "
                             "SmoothedArrays in ParaView)."
                           : "Kernel Smoothing needs at least one point array to smooth (AddSmoothedArray).";
  }
  if (traits.Gradient && !atParticles)
  {
    return "Gradient is computed at the particles only: it needs the value and density of the point "
           "itself (f_j - f_i, with rho_j of every neighbor), which a probe or volume point does not "
           "have. Run Point Neighborhood with Operation Gradient on the particles, then probe its "
           "'<name>_gradient' arrays with Kernel Smoothing.";
  }
  if (traits.SmoothingLength && !atParticles)
  {
    return "Smoothing Length is computed at the particles only: it is the distance from a particle to "
           "its k-th nearest other particle. Run Point Neighborhood with Operation Smoothing Length on the "
           "particles, then select its 'SupportRadius' array as the radius array of this filter "
           "(SmoothingLengthMode Scatter).";
  }
  if (traits.SmoothingLength)
  {
    return std::string(); // it reads no radius array
  }
  if (!atParticles && filter->SmoothingLengthMode != SCATTER && filter->RadiusArraySelected())
  {
    return std::string("With a probe or volume the radius array gives the particles' (source) radii, "
                       "and a probe point has no radius of its own: only SmoothingLengthMode Scatter "
                       "applies (|x - x_j| <= R_j, W(r, h_j)), not ") +
      neighborgrid::toString(EngineSmoothingLengthMode(filter->SmoothingLengthMode)) + ".";
  }
  return std::string();
}

std::vector<vtkSmartPointer<vtkAbstractArray>> vtkPointNeighborhoodFilter::RequestBuilder::EmptyBlockArrays(
  vtkPointNeighborhoodFilter* filter, vtkPointSet* block)
{
  return ResultArrays::ForEmptyBlock(
    OperationTraits(filter->Operation, filter->Normalization), filter->SmoothedArrays, block->GetPointData());
}

/// The request's options, straight from the properties (nothing to check).
void vtkPointNeighborhoodFilter::RequestBuilder::SetOptions()
{
  const vtkPointNeighborhoodFilter* f = this->Filter;
  neighborgrid::Request& request = this->EngineRequest;
  request.radius = f->Radius;
  request.smoothingLengthMode = EngineSmoothingLengthMode(f->SmoothingLengthMode);
  request.operation = this->Traits.Operation;
  request.kernel = EngineKernel(f->Kernel);
  request.dimension = f->Dimension;
  request.normalization = EngineNormalization(f->Normalization);
  request.backend = EngineBackend(f->Backend);
  request.method = EngineMethod(f->Method);
  request.constantMass = f->Mass;
  request.neighborTarget = f->NeighborTarget;
}

/// The periodic box, from the properties or the particles' field data.
bool vtkPointNeighborhoodFilter::RequestBuilder::AddPeriodicBox()
{
  const vtkPointNeighborhoodFilter* f = this->Filter;
  return this->Box.Read(
    f->Periodic, f->BoxOrigin, f->BoxLengths, this->Particles->GetFieldData(), this->EngineRequest, this->ErrorText);
}

/// The particles' coordinates: the points of the request, or its source with separate queries.
void vtkPointNeighborhoodFilter::RequestBuilder::AddParticles()
{
  vtkPoints* points = this->Particles->GetPoints();
  const neighborgrid::Points particles =
    this->ParticleCoordinates.Of(points ? points->GetData() : nullptr, this->Particles->GetNumberOfPoints());
  neighborgrid::Request& request = this->EngineRequest;
  (this->Queries.Kind == QuerySpec::PARTICLES ? request.points : request.source) = particles;
}

/// The mass, radius and arrays to smooth that the operation reads. The mass is only checked
/// where the operation uses it, so that a stale selection does not break Neighbor Count or
/// Shepard smoothing.
bool vtkPointNeighborhoodFilter::RequestBuilder::AddSelectedArrays()
{
  vtkPointNeighborhoodFilter* f = this->Filter;
  neighborgrid::Request& request = this->EngineRequest;
  std::string& error = this->ErrorText;
  return (!this->Traits.UsesMass || this->Mass.Read(f, this->Particles, f->Mass, request, error)) &&
    (this->Traits.SmoothingLength || this->Radii.Read(f, this->Particles, f->Radius, request, error)) &&
    (!this->Traits.UsesArrays ||
      this->Smoothed.Read(f->SmoothedArrays, this->Particles->GetPointData(), request, error));
}

/// Where the results go: the particles themselves (set with the coordinates), other points, or
/// a grid, whose points also get the valid mask.
void vtkPointNeighborhoodFilter::RequestBuilder::AddQueries()
{
  const QuerySpec& queries = this->Queries;
  neighborgrid::Request& request = this->EngineRequest;
  if (queries.Kind == QuerySpec::PARTICLES)
  {
    return;
  }
  request.nullValue = static_cast<float>(this->Filter->NullValue);
  if (queries.Kind == QuerySpec::GRID)
  {
    for (int a = 0; a < 3; ++a)
    {
      request.queryGrid.origin[a] = queries.Origin[a];
      request.queryGrid.spacing[a] = queries.Spacing[a];
      request.queryGrid.dimensions[a] = queries.Dimensions[a];
    }
  }
  else
  {
    request.points = this->QueryCoordinates.Of(queries.Coordinates, this->ResultCount);
  }
  this->Results.AllocateValidMask(this->Filter->ValidPointMaskArrayName, this->ResultCount, request);
}

vtkPointNeighborhoodFilter::QuerySpec vtkPointNeighborhoodFilter::RequestBuilder::ProbeQueries(
  vtkDataSet* probe, vtkSmartPointer<vtkDataArray>& converted)
{
  QuerySpec queries;
  queries.Count = probe->GetNumberOfPoints();
  auto* image = vtkImageData::SafeDownCast(probe);
  const int* extent = image ? image->GetExtent() : nullptr;
  if (image && image->GetDirectionMatrix()->IsIdentity() && extent[0] == 0 && extent[2] == 0 && extent[4] == 0)
  {
    // An axis-aligned image: the engine generates its points (origin + ijk * spacing, as
    // vtkImageData::GetPoint computes them).
    queries.Kind = QuerySpec::GRID;
    int dimensions[3];
    image->GetDimensions(dimensions);
    std::copy_n(image->GetOrigin(), 3, queries.Origin);
    std::copy_n(image->GetSpacing(), 3, queries.Spacing);
    std::copy_n(dimensions, 3, queries.Dimensions);
    return queries;
  }
  queries.Kind = QuerySpec::POINTS;
  if (auto* pointSet = vtkPointSet::SafeDownCast(probe))
  {
    queries.Coordinates = pointSet->GetPoints() ? pointSet->GetPoints()->GetData() : nullptr;
    return queries;
  }
  // Rectilinear grids, images with a direction or a shifted extent: their points in double.
  auto points = vtkSmartPointer<vtkDoubleArray>::New();
  points->SetNumberOfComponents(3);
  points->SetNumberOfTuples(queries.Count);
  for (vtkIdType i = 0; i < queries.Count; ++i)
  {
    double x[3];
    probe->GetPoint(i, x);
    points->SetTypedTuple(i, x);
  }
  converted = points;
  queries.Coordinates = points;
  return queries;
}

vtkPointNeighborhoodFilter::QuerySpec vtkPointNeighborhoodFilter::RequestBuilder::GridQueries(
  const double origin[3], const double spacing[3], const int extent[6])
{
  QuerySpec queries;
  queries.Kind = QuerySpec::GRID;
  queries.Count = 1;
  for (int a = 0; a < 3; ++a)
  {
    queries.Origin[a] = origin[a] + extent[2 * a] * spacing[a];
    queries.Spacing[a] = spacing[a];
    queries.Dimensions[a] = std::max(0, extent[2 * a + 1] - extent[2 * a] + 1);
    queries.Count *= queries.Dimensions[a];
  }
  return queries;
}

const unsigned char* vtkPointNeighborhoodFilter::RequestBuilder::GhostFlags() const
{
  return GhostFlagsOf(this->Particles);
}

/// What ran and how: backend, method, device, the operation and its kernel, mass and radii.
std::vector<std::string> vtkPointNeighborhoodFilter::RequestBuilder::OperationInfo() const
{
  const neighborgrid::Request& request = this->EngineRequest;
  std::vector<std::string> info;
  info.push_back(std::string("operation=") + neighborgrid::toString(this->Traits.Operation));
  if (this->Traits.SmoothingLength)
  {
    info.push_back("neighbor_target=" + ToText(request.neighborTarget));
    return info;
  }
  if (this->Traits.Operation != neighborgrid::Operation::NeighborCount)
  {
    info.push_back(std::string("kernel=") + neighborgrid::toString(request.kernel));
    info.push_back("dimension=" + ToText(this->Filter->Dimension));
  }
  if (this->Traits.Operation == neighborgrid::Operation::Smoothing)
  {
    info.push_back(std::string("normalization=") + neighborgrid::toString(request.normalization));
  }
  if (this->Traits.UsesMass)
  {
    info.push_back("mass=" + this->Mass.Description());
  }
  info.push_back("radius=" + this->Radii.Description());
  if (request.radii)
  {
    info.push_back("radius_range=" + ToText(this->Radii.Smallest()) + " " + ToText(this->Radii.Largest()));
    info.push_back(std::string("smoothing_length_mode=") + neighborgrid::toString(request.smoothingLengthMode));
  }
  return info;
}

std::vector<std::string> vtkPointNeighborhoodFilter::RequestBuilder::RunInfo(
  const neighborgrid::Report& report, const DistributedSummary& distributed) const
{
  std::vector<std::string> info{ std::string("backend=") + neighborgrid::toString(report.backend),
    "backend_reason=" + report.backendReason, std::string("method=") + neighborgrid::toString(report.method),
    "device=" + report.device };
  for (std::string& entry : this->OperationInfo())
  {
    info.push_back(std::move(entry));
  }
  if (this->EngineRequest.radii || this->Traits.SmoothingLength)
  {
    // Smoothing Length: the levels of cells its k-th neighbor search took.
    info.push_back("radius_levels=" + ToText(report.radiusLevels));
  }
  if (this->EngineRequest.radii)
  {
    info.push_back("radius_searches=" + ToText(report.radiusSearches));
  }
  if (!this->Box.Description().empty())
  {
    info.push_back("periodic=" + this->Box.Description());
    info.push_back("periodic_images=" + ToText(static_cast<vtkIdType>(report.periodicImages)));
  }
  info.push_back("points=" + ToText(this->Particles->GetNumberOfPoints()));
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
  if (this->Queries.Kind != QuerySpec::PARTICLES)
  {
    info.push_back("queries=" + ToText(this->ResultCount));
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
  return info;
}
