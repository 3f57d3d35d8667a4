// vtkPointNeighborhoodProbe: the particles of port 0 as neighbors, results at the points of the
// probe on port 1. The engine does the work (vtkPointNeighborhoodFilter::ComputeNeighborhood).
#include "vtkPointNeighborhoodProbe.h"

#include "NeighborhoodDistributed.h"
#include "NeighborhoodRequestBuilder.h"

#include "vtkAlgorithmOutput.h"
#include "vtkCompositeDataSet.h"
#include "vtkDataArray.h"
#include "vtkDataObject.h"
#include "vtkDataSet.h"
#include "vtkMultiProcessController.h"
#include "vtkInformation.h"
#include "vtkInformationVector.h"
#include "vtkObjectFactory.h"
#include "vtkPointSet.h"
#include "vtkSmartPointer.h"
#include "vtkStreamingDemandDrivenPipeline.h"

vtkStandardNewMacro(vtkPointNeighborhoodProbe);

//------------------------------------------------------------------------------
vtkPointNeighborhoodProbe::vtkPointNeighborhoodProbe()
{
  this->SetNumberOfInputPorts(2);
  // A probe point has no radius of its own: with a radius array only Scatter applies.
  this->SmoothingLengthMode = SCATTER;
}

//------------------------------------------------------------------------------
vtkPointNeighborhoodProbe::~vtkPointNeighborhoodProbe() = default;

//------------------------------------------------------------------------------
void vtkPointNeighborhoodProbe::SetSourceConnection(vtkAlgorithmOutput* output)
{
  this->SetInputConnection(1, output);
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodProbe::SetSourceData(vtkDataObject* probe)
{
  this->SetInputData(1, probe);
}

//------------------------------------------------------------------------------
vtkDataObject* vtkPointNeighborhoodProbe::GetSource()
{
  return this->GetNumberOfInputConnections(1) < 1 ? nullptr : this->GetExecutive()->GetInputData(1, 0);
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodProbe::FillInputPortInformation(int port, vtkInformation* info)
{
  if (port == 0)
  {
    info->Set(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkPointSet");
    info->Append(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkCompositeDataSet");
    return 1;
  }
  if (port == 1)
  {
    info->Set(vtkAlgorithm::INPUT_REQUIRED_DATA_TYPE(), "vtkDataSet");
    return 1;
  }
  return 0;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodProbe::RequestDataObject(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  // The output has the probe's type.
  vtkDataObject* probe = vtkDataObject::GetData(inputVector[1], 0);
  if (!probe)
  {
    return 0;
  }
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  vtkDataObject* output = vtkDataObject::GetData(outInfo);
  if (!output || !output->IsA(probe->GetClassName()))
  {
    vtkSmartPointer<vtkDataObject> created;
    created.TakeReference(probe->NewInstance());
    outInfo->Set(vtkDataObject::DATA_OBJECT(), created);
  }
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodProbe::RequestInformation(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  // Extent, time and pieces follow the probe, not the particles.
  vtkInformation* probeInfo = inputVector[1]->GetInformationObject(0);
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  outInfo->CopyEntry(probeInfo, vtkStreamingDemandDrivenPipeline::TIME_STEPS());
  outInfo->CopyEntry(probeInfo, vtkStreamingDemandDrivenPipeline::TIME_RANGE());
  if (probeInfo->Has(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT()))
  {
    outInfo->Set(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT(),
      probeInfo->Get(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT()), 6);
  }
  else
  {
    outInfo->Remove(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT());
  }
  outInfo->Set(vtkAlgorithm::CAN_HANDLE_PIECE_REQUEST(), 1);
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodProbe::RequestUpdateExtent(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  // The probe as the output is asked for. The particles: in one process, all of them (results
  // near a piece's border need the particles beyond it); with several processes, this process's
  // piece, since the processes send each other the particles near their pieces.
  vtkInformation* particleInfo = inputVector[0]->GetInformationObject(0);
  vtkInformation* probeInfo = inputVector[1]->GetInformationObject(0);
  vtkInformation* outInfo = outputVector->GetInformationObject(0);
  vtkMultiProcessController* controller = this->GetController();
  if (controller && controller->GetNumberOfProcesses() > 1)
  {
    particleInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER());
    particleInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES());
    particleInfo->Set(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_GHOST_LEVELS(), 0);
  }
  else
  {
    particleInfo->Set(vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER(), 0);
    particleInfo->Set(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES(), 1);
    particleInfo->Set(vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_GHOST_LEVELS(), 0);
  }
  if (particleInfo->Has(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT()))
  {
    particleInfo->Set(vtkStreamingDemandDrivenPipeline::UPDATE_EXTENT(),
      particleInfo->Get(vtkStreamingDemandDrivenPipeline::WHOLE_EXTENT()), 6);
  }
  probeInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_PIECE_NUMBER());
  probeInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_PIECES());
  probeInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_NUMBER_OF_GHOST_LEVELS());
  probeInfo->CopyEntry(outInfo, vtkStreamingDemandDrivenPipeline::UPDATE_EXTENT());
  return 1;
}

//------------------------------------------------------------------------------
int vtkPointNeighborhoodProbe::RequestData(
  vtkInformation*, vtkInformationVector** inputVector, vtkInformationVector* outputVector)
{
  vtkDataObject* particleInput = vtkDataObject::GetData(inputVector[0], 0);
  vtkDataSet* probe = vtkDataSet::GetData(inputVector[1], 0);
  vtkDataSet* output = vtkDataSet::GetData(outputVector, 0);
  if (!probe || !output)
  {
    return this->ReportError(output, "The probe (Source) must be a vtkDataSet.");
  }
  vtkMultiProcessController* controller = this->GetController();
  const bool distributed = controller && controller->GetNumberOfProcesses() > 1;
  std::string error;
  vtkSmartPointer<vtkPointSet> particles = GatherParticles(particleInput, error);
  if (!particles)
  {
    // The other processes wait for this one in the collective run: tell them it will not come.
    neighborgrid_filters::ReportFailureToOtherRanks(controller, error);
    return this->ReportError(output, error);
  }
  if (particles->GetNumberOfPoints() == 0 && !distributed)
  {
    return this->ReportError(output, "The particles (Input) have no points.");
  }

  // The output: a shallow copy of the probe plus the results.
  vtkSmartPointer<vtkDataArray> convertedPoints;
  const QuerySpec queries = RequestBuilder::ProbeQueries(probe, convertedPoints);
  if (queries.Count == 0 && !distributed)
  {
    // An empty probe: nothing to compute; it passes through.
    output->ShallowCopy(probe);
    this->SetLastRunInfo({ "queries=0" });
    return 1;
  }
  return this->ComputeInto(particles, queries, probe, output, [&] { output->ShallowCopy(probe); });
}

//------------------------------------------------------------------------------
void vtkPointNeighborhoodProbe::PrintSelf(ostream& os, vtkIndent indent)
{
  this->Superclass::PrintSelf(os, indent);
}
