// vtkPointNeighborhoodVolume: the particles of port 0 as neighbors, results on a regular grid
// chosen as ParaView's Bounded Volume chooses it. The engine generates the grid's points.
#include "vtkPointNeighborhoodVolume.h"

#include "NeighborhoodDistributed.h"
#include "NeighborhoodRequestBuilder.h"

#include "vtkAlgorithmOutput.h"
#include "vtkCompositeDataSet.h"
#include "vtkDataSet.h"
#include "vtkDataObject.h"
#include "vtkExtentTranslator.h"
#include "vtkImageData.h"
#include "vtkInformation.h"
#include "vtkInformationVector.h"
#include "vtkMultiProcessController.h"
#include "vtkNew.h"
#include "vtkPolyData.h"
#include "vtkObjectFactory.h"
#include "vtkPointData.h"
#include "vtkPointSet.h"
#include "vtkSmartPointer.h"
#include "vtkStreamingDemandDrivenPipeline.h"

#include <algorithm>
#include <cmath>
#include <sstream>

vtkStandardNewMacro(vtkPointNeighborhoodVolume);

namespace
{

/// The grid of a box [lo, hi]: Bounded Volume's rules (vtkBoundedVolumeSource::SetImageParameters).
bool VolumeGrid(const double lo[3], const double hi[3], int mode, const int resolution[3], double cellSize,
  double origin[3], double spacing[3], int cells[3], std::string& error)
{
  for (int a = 0; a < 3; ++a)
  {
    const double length = hi[a] - lo[a];
    if (!(std::isfinite(lo[a]) && std::isfinite(length) && length >= 0.0))
    {
      error = "The volume's box is not a finite box.";
      return false;
    }
    if (mode == vtkPointNeighborhoodVolume::USE_RESOLUTION)
    {
      if (resolution[a] < 1)
      {
        error = "Every component of the Resolution must be at least 1.";
        return false;
      }
      cells[a] = resolution[a];
      origin[a] = lo[a];
      spacing[a] = length / resolution[a];
    }
    else
    {
      if (!(std::isfinite(cellSize) && cellSize > 0.0))
      {
        error = "The CellSize must be a finite number > 0.";
        return false;
      }
      const double count = std::ceil(length / cellSize);
      if (!(count < 2147483647.0))
      {
        error = "The CellSize is too small for the volume's box.";
        return false;
      }
      cells[a] = static_cast<int>(std::max(1.0, count));
      origin[a] = 0.5 * (lo[a] + hi[a]) - 0.5 * cells[a] * cellSize;
      spacing[a] = cellSize;
    }
  }
  return true;
}

/// The bounds of the particles of every process (collective with several): false when no
/// process has a point.
bool AllProcessBounds(vtkMultiProcessController* controller, vtkDataObject* particles, double bounds[6])
{
  // Reduced as minima of (lo, -hi), so that an empty piece contributes +inf.
  double mine[6] = { HUGE_VAL, HUGE_VAL, HUGE_VAL, HUGE_VAL, HUGE_VAL, HUGE_VAL };
  double local[6];
  bool any = false;
  if (auto* composite = vtkCompositeDataSet::SafeDownCast(particles))
  {
    composite->GetBounds(local);
    any = local[0] <= local[1] && local[2] <= local[3] && local[4] <= local[5];
  }
  else if (auto* set = vtkDataSet::SafeDownCast(particles))
  {
    any = set->GetNumberOfPoints() > 0;
    if (any)
    {
      set->GetBounds(local);
    }
  }
  if (any)
  {
    for (int a = 0; a < 3; ++a)
    {
      mine[a] = local[2 * a];
      mine[3 + a] = -local[2 * a + 1];
    }
  }
  double all[6];
  if (controller && controller->GetNumberOfProcesses() > 1)
  {
    controller->AllReduce(mine, all, 6, vtkCommunicator::MIN_OP);
  }
  else
  {
    std::copy(mine, mine + 6, all);
  }
  for (int a = 0; a < 3; ++a)
  {
    bounds[2 * a] = all[a];
    bounds[2 * a + 1] = -all[3 + a];
  }
  return bounds[0] <= bounds[1] && bounds[2] <= bounds[3] && bounds[4] <= bounds[5];
}

bool Distributed(vtkMultiProcessController* controller)
{
  return controller && controller->GetNumberOfProcesses() > 1;
}

/// The largest of every process's `value` (collective with several).
double AllProcessMax(vtkMultiProcessController* controller, double value)
{
  double all = value;
  if (Distributed(controller))
  {
    controller->AllReduce(&value, &all, 1, vtkCommunicator::MAX_OP);
  }
  return all;
}

/// This process's piece of the whole extent (pieces share their boundary points): the piece the
/// output is asked for, by default the process's rank among the processes; all of it in one process.
void PieceExtent(vtkMultiProcessController* controller, vtkInformation* outInfo, const int wholeExtent[6],
  int extent[6])
{
  std::copy(wholeExtent, wholeExtent + 6, extent);
  if (!Distributed(controller))
  {
    return;
  }
  int piece = controller->GetLocalProcessId(), pieces = controller->GetNumberOfProcesses();
  if (outInfo->Has(vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER()) &&
    outInfo->Has(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES()))
  {
    piece = outInfo->Get(vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER());
    pieces = outInfo->Get(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES());
  }
  int whole[6]; // PieceToExtentThreadSafe takes it non-const
  std::copy(wholeExtent, wholeExtent + 6, whole);
  vtkNew<vtkExtentTranslator> translator;
  if (!translator->PieceToExtentThreadSafe(piece, pieces, 0, whole, extent, vtkExtentTranslator::BLOCK_MODE, 0))
  {
    extent[0] = extent[2] = extent[4] = 0; // no piece for this process: an empty extent
    extent[1] = extent[3] = extent[5] = -1;
  }
}

} // namespace

//------------------------------------------------------------------------------
vtkPointNeighborhoodVolume::vtkPointNeighborhoodVolume()
{
  // A grid point has no radius of its own: with a radius array only Scatter applies.
  this->SmoothingLengthMode = SCATTER;
}
vtkPointNeighborhoodVolume::~vtkPointNeighborhoodVolume() = default;

//------------------------------------------------------------------------------
int vtkPointNeighborhoodVolume::FillInputPortInformation(int port, vtkInformation* info)
{
  if (port != 0)
  {
    return 0;
  }
  info->Set(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkPointSet");
  info->Append(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkCompositeDataSet");
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodVolume::FillOutputPortInformation(int, vtkInformation* info)
{
  info->Set(vtkDataObject::DATA_TYPE_NAME(), "vtkImageData");
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodVolume::RequestDataObject(
  vtkInformation*, vtkInformationVector**, vtkInformationVector* outputVector)
{
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  if (!vtkImageData::SafeDownCast(vtkDataObject::GetData(outInfo)))
  {
    outInfo->Set(vtkDataObject::DATA_OBJECT(), vtkSmartPointer<vtkImageData>::New());
  }
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodVolume::RequestInformation(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  // An image's whole extent belongs here, before any data: consumers (ParaView's volume
  // representation among them) size their requests by it. With cell-size refinement of the
  // particles' box the extent depends on the particles' bounds, so the particles are brought up
  // to date now (the pipeline's own update then finds them current and does not run them again).
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  double bounds[6] = { 0, 1, 0, 1, 0, 1 }; // resolution mode: the extent does not depend on the box
  double largestRadius = this->Radius;
  bool boxKnown = true;
  if (this->UseParticleBounds && this->RefinementMode == USE_CELL_SIZE)
  {
    boxKnown = this->UpdatedParticleBounds(inputVector[0]->GetInformationObject(0), outInfo, bounds, largestRadius);
  }
  double lo[3], hi[3];
  this->VolumeBox(bounds, largestRadius, lo, hi);
  double origin[3], spacing[3];
  int cells[3];
  std::string error;
  if (boxKnown &&
    VolumeGrid(lo, hi, this->RefinementMode, this->Resolution, this->CellSize, origin, spacing, cells, error))
  {
    const int extent[6] = { 0, cells[0], 0, cells[1], 0, cells[2] };
    outInfo->Set(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), extent, 6);
    if (!this->UseParticleBounds)
    {
      outInfo->Set(vtkDataObject::ORIGIN(), origin, 3);
      outInfo->Set(vtkDataObject::SPACING(), spacing, 3);
    }
  }
  else
  {
    // Bad settings or no particles: RequestData reports the error and leaves the output empty.
    const int empty[6] = { 0, -1, 0, -1, 0, -1 };
    outInfo->Set(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), empty, 6);
  }
  if (Distributed(this->GetController()))
  {
    // Each process computes its piece of the whole extent (RequestData), from its particles and
    // the halo the others send it.
    outInfo->Set(vtkAlgorithm::CAN_HANDLE_PIECE_REQUEST(), 1);
  }
  return 1;
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodVolume::VolumeBox(
  const double particleBounds[6], double largestRadius, double lo[3], double hi[3]) const
{
  for (int a = 0; a < 3; ++a)
  {
    if (this->UseParticleBounds)
    {
      const double padding = this->Padding < 0 ? largestRadius : this->Padding;
      lo[a] = particleBounds[2 * a] - padding;
      hi[a] = particleBounds[2 * a + 1] + padding;
    }
    else
    {
      const double padding = this->Padding < 0 ? 0.0 : this->Padding;
      lo[a] = this->Origin[a] - padding;
      hi[a] = this->Origin[a] + this->Scale[a] + padding;
    }
  }
}

//------------------------------------------------------------------------------
double vtkPointNeighborhoodVolume::PaddingRadius(vtkPointSet* particles)
{
  if (!this->RadiusArraySelected())
  {
    return this->Radius;
  }
  // Collective under MPI: every process calls this when a radius array is selected.
  const double largest = AllProcessMax(this->GetController(), particles ? this->LargestRadius(particles) : 0.0);
  return largest > 0.0 ? largest : this->Radius;
}

//------------------------------------------------------------------------------
bool vtkPointNeighborhoodVolume::UpdatedParticleBounds(
  vtkInformation* inInfo, vtkInformation* outInfo, double bounds[6], double& largestRadius)
{
  largestRadius = this->Radius;
  vtkAlgorithmOutput* connection = this->GetInputConnection(0, 0);
  if (!connection || !inInfo)
  {
    return false;
  }
  // The piece this output was last asked for (the whole data when none yet).
  int piece = 0, pieces = 1;
  if (outInfo->Has(vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER()) &&
    outInfo->Has(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES()))
  {
    piece = outInfo->Get(vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER());
    pieces = outInfo->Get(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES());
  }
  vtkAlgorithm* producer = connection->GetProducer();
  const bool updated = producer->UpdatePiece(piece, pieces, 0) != 0;
  // Under MPI every process takes part in the reduction, even one whose update failed.
  vtkDataObject* particles = updated ? producer->GetOutputDataObject(connection->GetIndex()) : nullptr;
  if (this->RadiusArraySelected())
  {
    // As RequestData decides it, on every process alike.
    std::string error;
    vtkSmartPointer<vtkPointSet> set = particles ? GatherParticles(particles, error) : nullptr;
    largestRadius = this->PaddingRadius(set);
  }
  return AllProcessBounds(this->GetController(), particles, bounds) && updated;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodVolume::RequestData(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  vtkImageData* output = vtkImageData::GetData(outInfo);
  if (!output)
  {
    return this->ReportError(output, "The output must be a vtkImageData.");
  }
  if (!this->RadiusArraySelected() && !(std::isfinite(this->Radius) && this->Radius > 0.0))
  {
    return this->ReportError(
      output, "The radius must be a finite number > 0 (got " + std::to_string(this->Radius) + ").");
  }
  vtkMultiProcessController* controller = this->GetController();
  std::string error;
  vtkSmartPointer<vtkPointSet> particles = GatherParticles(vtkDataObject::GetData(inputVector[0], 0), error);
  const std::string gatherError = particles ? std::string() : error;
  if (!particles)
  {
    particles = vtkSmartPointer<vtkPolyData>::New(); // takes part in the collective steps below
  }
  // The grid is the same on every process: from the bounds of all processes' particles.
  double bounds[6];
  const bool anyParticle = AllProcessBounds(controller, particles, bounds);
  const double paddingRadius = this->PaddingRadius(particles); // collective too
  if (!gatherError.empty())
  {
    neighborgrid_filters::ReportFailureToOtherRanks(controller, gatherError);
    return this->ReportError(output, gatherError);
  }
  if (!anyParticle)
  {
    return this->ReportError(output, "The particles (Input) have no points."); // on every process alike
  }
  double origin[3], spacing[3];
  int wholeExtent[6], extent[6];
  if (!this->WholeGrid(bounds, paddingRadius, origin, spacing, wholeExtent, error))
  {
    return this->ReportError(output, error);
  }
  outInfo->Set(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(), wholeExtent, 6);
  PieceExtent(controller, outInfo, wholeExtent, extent);

  // The output: this process's piece of the grid, with the results at its points.
  const int status =
    this->ComputeInto(particles, RequestBuilder::GridQueries(origin, spacing, extent), particles, output, [&] {
      output->Initialize();
      output->SetExtent(extent);
      output->SetOrigin(origin);
      output->SetSpacing(spacing);
    });
  vtkPointData* results = output->GetPointData();
  if (status == 1 && results->GetNumberOfArrays() > 0) // none when aborted
  {
    results->SetActiveScalars(results->GetArrayName(0));
  }
  return status;
}

//------------------------------------------------------------------------------
bool vtkPointNeighborhoodVolume::WholeGrid(const double particleBounds[6], double paddingRadius, double origin[3],
  double spacing[3], int wholeExtent[6], std::string& error) const
{
  double lo[3], hi[3];
  this->VolumeBox(particleBounds, paddingRadius, lo, hi);
  int cells[3];
  if (!VolumeGrid(lo, hi, this->RefinementMode, this->Resolution, this->CellSize, origin, spacing, cells, error))
  {
    return false;
  }
  const double points = double(cells[0] + 1) * double(cells[1] + 1) * double(cells[2] + 1);
  if (points > 2147483646.0)
  {
    std::ostringstream s;
    s << "The volume would have " << points << " points; at most 2^31 - 2 are supported. Lower the Resolution or "
      << "raise the CellSize.";
    error = s.str();
    return false;
  }
  for (int a = 0; a < 3; ++a)
  {
    wholeExtent[2 * a] = 0;
    wholeExtent[2 * a + 1] = cells[a];
  }
  return true;
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodVolume::PrintSelf(ostream& os, vtkIndent indent)
{
  this->Superclass::PrintSelf(os, indent);
  os << indent << "UseParticleBounds: " << this->UseParticleBounds << "\n";
  os << indent << "Origin: " << this->Origin[0] << ", " << this->Origin[1] << ", " << this->Origin[2] << "\n";
  os << indent << "Scale: " << this->Scale[0] << ", " << this->Scale[1] << ", " << this->Scale[2] << "\n";
  os << indent << "Padding: " << this->Padding << "\n";
  os << indent << "RefinementMode: " << this->RefinementMode << "\n";
  os << indent << "Resolution: " << this->Resolution[0] << ", " << this->Resolution[1] << ", " << this->Resolution[2]
     << "\n";
  os << indent << "CellSize: " << this->CellSize << "\n";
}
