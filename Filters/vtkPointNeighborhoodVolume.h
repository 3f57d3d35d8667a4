/**
 * @class   vtkPointNeighborhoodVolume
 * @brief   NeighborGrid's operations on a regular grid: density and smoothed fields as a volume
 *
 * Input (port 0) holds the particles: a vtkPointSet, or a composite dataset of them whose blocks
 * are taken together. The output is a vtkImageData whose points receive the results of
 * vtkPointNeighborhoodProbe (same operations, arrays, null value and validity array), for volume
 * rendering and slicing, as ParaView's SPH Volume Interpolator does with its Bounded Volume.
 *
 * The volume is chosen the way ParaView's Bounded Volume chooses it:
 * - the box: the particles' bounds padded by Padding on every side (UseParticleBounds on, the
 *   default; Padding < 0, the default, means R, or with a radius array the particles' largest
 *   radius), or Origin and Scale (its lengths) padded by Padding (< 0 means 0);
 * - RefinementMode USE_RESOLUTION (default): Resolution cells per axis (points: Resolution + 1),
 *   spacing = length / Resolution; USE_CELL_SIZE: spacing CellSize on every axis,
 *   ceil(length / CellSize) cells per axis, centered on the box.
 * Grid points are generated on the device from origin, spacing and dimensions, never stored or
 * uploaded; only the result arrays come back.
 *
 * With a radius array (input array 1) the radii are the particles', and only SmoothingLengthMode
 * SCATTER applies (the default here); GRADIENT is not available here (an error says so).
 *
 * The whole extent is reported in RequestInformation, as consumers of images expect. With
 * USE_CELL_SIZE over the particles' bounds it depends on the particles, so RequestInformation
 * brings them up to date first (the update that follows finds them current).
 */
#ifndef vtkPointNeighborhoodVolume_h
#define vtkPointNeighborhoodVolume_h

#include "NeighborGridFiltersModule.h" // for export macro
#include "vtkPointNeighborhoodFilter.h"

#include <string> // for std::string

class NEIGHBORGRIDFILTERS_EXPORT vtkPointNeighborhoodVolume : public vtkPointNeighborhoodFilter
{
public:
  static vtkPointNeighborhoodVolume* New();
  vtkTypeMacro(vtkPointNeighborhoodVolume, vtkPointNeighborhoodFilter);
  void PrintSelf(ostream& os, vtkIndent indent) override;

  ///@{
  /// The box (see the class description).
  vtkSetMacro(UseParticleBounds, bool);
  vtkGetMacro(UseParticleBounds, bool);
  vtkBooleanMacro(UseParticleBounds, bool);
  vtkSetVector3Macro(Origin, double);
  vtkGetVector3Macro(Origin, double);
  vtkSetVector3Macro(Scale, double);
  vtkGetVector3Macro(Scale, double);
  vtkSetMacro(Padding, double);
  vtkGetMacro(Padding, double);
  ///@}

  /// How the box is divided: Resolution cells per axis, or cells of CellSize.
  enum RefinementModes
  {
    USE_RESOLUTION = 0,
    USE_CELL_SIZE = 1
  };

  ///@{
  /// How the box is divided (see the class description). Resolution default 64 x 64 x 64 cells.
  vtkSetClampMacro(RefinementMode, int, USE_RESOLUTION, USE_CELL_SIZE);
  vtkGetMacro(RefinementMode, int);
  vtkSetVector3Macro(Resolution, int);
  vtkGetVector3Macro(Resolution, int);
  vtkSetMacro(CellSize, double);
  vtkGetMacro(CellSize, double);
  ///@}

protected:
  vtkPointNeighborhoodVolume();
  ~vtkPointNeighborhoodVolume() override;

  int FillInputPortInformation(int port, vtkInformation* info) override;
  int FillOutputPortInformation(int port, vtkInformation* info) override;
  int RequestDataObject(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  int RequestInformation(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  int RequestData(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  bool ProcessesBlocksSeparately() const override { return false; }
  /// The volume's box (class description): the particles' bounds padded, or Origin and Scale.
  /// `largestRadius`: the padding that a negative Padding means around the particles' bounds.
  void VolumeBox(const double particleBounds[6], double largestRadius, double lo[3], double hi[3]) const;
  /// What a negative Padding means around the particles: Radius, or with a radius array the
  /// largest radius of every process's particles (collective then).
  double PaddingRadius(vtkPointSet* particles);
  /// The grid of the volume's box (VolumeBox) as RefinementMode divides it: its origin, spacing
  /// and whole extent; false with `error` for bad settings or more points than supported.
  bool WholeGrid(const double particleBounds[6], double paddingRadius, double origin[3], double spacing[3],
    int wholeExtent[6], std::string& error) const;
  /// The particles' bounds for RequestInformation, the particles updated first, and their
  /// largest radius (LargestRadius); false when there are none.
  bool UpdatedParticleBounds(vtkInformation* inInfo, vtkInformation* outInfo, double bounds[6], double& largestRadius);

  bool UseParticleBounds = true;
  double Origin[3] = { 0, 0, 0 };
  double Scale[3] = { 1, 1, 1 };
  double Padding = -1.0;
  int RefinementMode = USE_RESOLUTION;
  int Resolution[3] = { 64, 64, 64 };
  double CellSize = 1.0;

private:
  vtkPointNeighborhoodVolume(const vtkPointNeighborhoodVolume&) = delete;
  void operator=(const vtkPointNeighborhoodVolume&) = delete;
};

#endif
