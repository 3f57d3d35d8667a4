// The request builder of the three filters (vtkPointNeighborhoodFilter, vtkPointNeighborhoodProbe,
// vtkPointNeighborhoodVolume). They differ in where results go, not in how a request is checked
// and built (DESIGN.md), so that lives here once, one small unit per concern:
// - the particles and their coordinates (ParticlesOf, EngineCoordinates);
// - the periodic box (PeriodicBox);
// - each selected array with its validation and error text (MassInput, RadiusInput,
//   SmoothedInputs, on top of SelectedPointArray);
// - the result arrays the engine writes in place (ResultArrays);
// - the queries: the particles, other points, or a grid (QuerySpec, EngineQueries);
// - the run info, NeighborGridInfo (RunInfo, AttachRunInfo).
// vtkPointNeighborhoodFilter::RequestBuilder puts them together in the order the checks have
// always run, so the first problem found is the one reported. Internal: not installed.
#pragma once

#include "vtkPointNeighborhoodFilter.h"

#include "NeighborhoodDistributed.h" // for DistributedSummary

#include "vtkSmartPointer.h"

#include <NeighborGrid/NeighborGrid.h>

#include <sstream>
#include <string>
#include <vector>

class vtkAlgorithm;
class vtkFieldData;
class vtkFloatArray;
class vtkIntArray;
class vtkPointData;
class vtkUnsignedCharArray;

namespace neighborgrid_filters
{

// --- The filter's enumerations in the engine's terms -----------------------------------------
neighborgrid::Operation EngineOperation(int operation);
neighborgrid::Kernel EngineKernel(int kernel);
neighborgrid::Normalization EngineNormalization(int normalization);
neighborgrid::SmoothingLengthMode EngineSmoothingLengthMode(int mode);
neighborgrid::Backend EngineBackend(int backend);
neighborgrid::Method EngineMethod(int method);

/// Which inputs an operation reads and which results it writes.
struct OperationTraits
{
  explicit OperationTraits(int operation, int normalization);
  neighborgrid::Operation Operation;
  bool Gradient;  // GRADIENT
  bool SmoothingLength; // SMOOTHING_LENGTH: no radius, mass or kernel; writes "SupportRadius"
  bool UsesArrays; // KERNEL_SMOOTHING and GRADIENT read the arrays to smooth
  bool UsesMass;  // DENSITY, GRADIENT and SPH smoothing; these also write "Density"
};

// --- Text for messages and the run info ------------------------------------------------------
std::string Quoted(const std::string& name);

template <typename T>
std::string ToText(const T& value)
{
  std::ostringstream stream;
  stream << value;
  return stream.str();
}

// --- The particles and their coordinates -----------------------------------------------------
/// The particles of an input taken as one set (vtkPointNeighborhoodFilter::GatherParticles).
vtkSmartPointer<vtkPointSet> ParticlesOf(vtkDataObject* input, std::string& error);

/// The ghost flags (vtkGhostType) of the particles, one per point, or null.
const unsigned char* GhostFlagsOf(vtkPointSet* particles);

/// Coordinates as the engine reads them: float and double arrays as they are (no copy: the engine
/// converts them to float relative to their cell itself), any other type converted to double.
class EngineCoordinates
{
public:
  neighborgrid::Points Of(vtkDataArray* coordinates, vtkIdType count);

private:
  std::vector<double> Converted;
};

// --- The periodic box ------------------------------------------------------------------------
/// Periodic axes take their box from the properties, or from the particles' field data
/// ("BoxLengths", "BoxOrigin") where BoxLengths is 0.
class PeriodicBox
{
public:
  bool Read(const int periodic[3], const double origin[3], const double lengths[3], vtkFieldData* particleFields,
    neighborgrid::Request& request, std::string& error);
  /// "x:[0,10)(properties) z:[...)(field data)" for the run info; empty for an open box.
  const std::string& Description() const { return this->Text; }

private:
  std::string Text;
};

// --- The selected arrays ---------------------------------------------------------------------
/// Whether input array `index` selects an array, from the selection alone (so every process
/// decides alike): a name other than "" and "None", or an attribute type.
bool ArraySelected(vtkAlgorithm* algorithm, int index);

/// The one-component numeric point array of `particles` selected as input array `index` of
/// `algorithm` (the mass array, the radius array). Returns true with `array` (null when none is
/// selected), false with `error`. `what` names the array in messages ("mass"), `otherwise` says
/// what is used without one ("the constant Mass").
bool SelectedPointArray(vtkAlgorithm* algorithm, int index, vtkPointSet* particles, const std::string& what,
  const std::string& otherwise, vtkDataArray*& array, std::string& error);

/// The mass: the selected mass array (input array 0, as float), or the constant mass.
class MassInput
{
public:
  bool Read(vtkAlgorithm* algorithm, vtkPointSet* particles, double constantMass, neighborgrid::Request& request,
    std::string& error);
  const std::string& Description() const { return this->Text; } // "constant 1" or "array 'm'"

private:
  std::vector<float> Converted;
  std::string Text;
};

/// Per-particle radii: the selected radius array (input array 1, as float), every value finite
/// and > 0 once converted to float, which is what the engine reads.
class RadiusInput
{
public:
  bool Read(vtkAlgorithm* algorithm, vtkPointSet* particles, double constantRadius, neighborgrid::Request& request,
    std::string& error);
  const std::string& Description() const { return this->Text; } // "0.5" or "array 'h'"
  float Smallest() const { return this->SmallestValue; }
  float Largest() const { return this->LargestValue; }

private:
  std::vector<float> Converted;
  std::string Text;
  float SmallestValue = 0.0f;
  float LargestValue = 0.0f;
};

/// The arrays to smooth (or to differentiate): any numeric point array, any number of components.
/// Each becomes an entry of Request::smoothed (its output is set by ResultArrays).
class SmoothedInputs
{
public:
  bool Read(const std::vector<std::string>& names, vtkPointData* pointData, neighborgrid::Request& request,
    std::string& error);
  const std::vector<vtkDataArray*>& Arrays() const { return this->Values; }

private:
  std::vector<vtkDataArray*> Values;
  std::vector<std::vector<float>> Converted;
};

// --- The result arrays -----------------------------------------------------------------------
/// The output arrays, created before the run so the engine writes straight into them.
class ResultArrays
{
public:
  /// "NeighborCount", "Density", "SupportRadius", "<name>_smoothed" or "<name>_gradient" per array to smooth, for
  /// `count` points; their storage becomes the request's outputs.
  void Allocate(const OperationTraits& traits, const std::vector<vtkDataArray*>& smoothed,
    const std::vector<std::string>& names, vtkIdType count, neighborgrid::Request& request);
  /// The validity array of probe and volume points (1: a particle within R).
  void AllocateValidMask(const std::string& name, vtkIdType count, neighborgrid::Request& request);
  /// In output order: NeighborCount, Density, the smoothed or gradient arrays, the valid mask.
  std::vector<vtkSmartPointer<vtkAbstractArray>> All() const;
  /// Whether arrays of a run on the GPU take the engine's pinned transfer memory: only in a run
  /// of one process, whose engine uses the calling thread's device (MPI ranks choose theirs).
  void SetTransferMemory(bool use) { this->TransferMemory = use; }

  /// The same arrays with no tuples, for an empty block of a composite dataset; an array to smooth
  /// that the block lacks has no output (there is nothing to smooth).
  static std::vector<vtkSmartPointer<vtkAbstractArray>> ForEmptyBlock(
    const OperationTraits& traits, const std::vector<std::string>& names, vtkPointData* pointData);

private:
  vtkSmartPointer<vtkIntArray> NeighborCount;
  vtkSmartPointer<vtkFloatArray> Density;
  vtkSmartPointer<vtkFloatArray> SupportRadius;
  std::vector<vtkSmartPointer<vtkFloatArray>> Smoothed;
  vtkSmartPointer<vtkUnsignedCharArray> ValidMask;
  bool TransferMemory = false;

  bool UsesTransferMemory(const neighborgrid::Request& request) const;
};

// --- The run info ----------------------------------------------------------------------------
/// Gives `output` its own field data: the input's arrays plus a NeighborGridInfo string array
/// (replacing one from an upstream NeighborGrid filter).
void AttachRunInfo(vtkDataObject* input, vtkDataObject* output, const std::vector<std::string>& info);

} // namespace neighborgrid_filters

/// Checks the filter's properties and its input, concern by concern, and builds the engine's
/// request from them, with the result arrays it writes. The request points into the builder's
/// buffers and result arrays: run it while the builder lives.
class vtkPointNeighborhoodFilter::RequestBuilder
{
public:
  RequestBuilder(vtkPointNeighborhoodFilter* filter, vtkPointSet* particles, const QuerySpec& queries);

  /// False with Error() at the first problem.
  bool Build();
  /// Result arrays in the engine's transfer memory where the run is on the GPU (ResultArrays).
  void SetTransferMemory(bool use) { this->Results.SetTransferMemory(use); }
  const std::string& Error() const { return this->ErrorText; }

  neighborgrid::Request& Request() { return this->EngineRequest; }
  const unsigned char* GhostFlags() const;
  std::vector<vtkSmartPointer<vtkAbstractArray>> ResultArrays() const { return this->Results.All(); }
  /// The NeighborGridInfo entries of the run.
  std::vector<std::string> RunInfo(
    const neighborgrid::Report& report, const neighborgrid_filters::DistributedSummary& distributed) const;

  /// What the properties alone rule out, "" when nothing: no array to smooth, and for queries
  /// other than the particles (`atParticles` false) Gradient and radii other than Scatter.
  static std::string PropertiesError(vtkPointNeighborhoodFilter* filter, bool atParticles);

  /// The result arrays of an empty block of a composite dataset, with no tuples.
  static std::vector<vtkSmartPointer<vtkAbstractArray>> EmptyBlockArrays(
    vtkPointNeighborhoodFilter* filter, vtkPointSet* block);

  /// The queries of a probe: an axis-aligned image's grid (generated by the engine), a point
  /// set's coordinates, or any other dataset's points converted to double into `converted`.
  static QuerySpec ProbeQueries(vtkDataSet* probe, vtkSmartPointer<vtkDataArray>& converted);
  /// The queries of a volume: the points of `extent` of the grid origin + ijk * spacing.
  static QuerySpec GridQueries(const double origin[3], const double spacing[3], const int extent[6]);

private:
  void SetOptions();
  bool AddPeriodicBox();
  void AddParticles();
  bool AddSelectedArrays();
  void AddQueries();
  std::vector<std::string> OperationInfo() const;

  vtkPointNeighborhoodFilter* Filter;
  vtkPointSet* Particles;
  const QuerySpec& Queries;
  const neighborgrid_filters::OperationTraits Traits;
  const vtkIdType ResultCount; // the particles' or the queries'
  neighborgrid::Request EngineRequest;
  std::string ErrorText;

  neighborgrid_filters::EngineCoordinates ParticleCoordinates;
  neighborgrid_filters::PeriodicBox Box;
  neighborgrid_filters::MassInput Mass;
  neighborgrid_filters::RadiusInput Radii;
  neighborgrid_filters::SmoothedInputs Smoothed;
  neighborgrid_filters::ResultArrays Results;
  neighborgrid_filters::EngineCoordinates QueryCoordinates;
};
