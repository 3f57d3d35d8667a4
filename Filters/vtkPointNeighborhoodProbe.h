/**
 * @class   vtkPointNeighborhoodProbe
 * @brief   NeighborGrid's operations evaluated at the points of another dataset (a probe)
 *
 * Input (port 0) holds the particles: a vtkPointSet, or a composite dataset of them whose blocks
 * are taken together. Source (port 1) is any vtkDataSet (image data, structured or unstructured
 * grid, polydata, ParaView's Line and Plane sources): the results are computed at its points and
 * written as point arrays of a shallow copy of it, the way vtkSPHInterpolator and ParaView's
 * SPH Dataset Interpolator do (SetSourceConnection for the probe).
 *
 * A probe point's neighbors are the particles within R of it (|x - x_j| <= R, decided exactly in
 * double); the probe point is not a particle, so a particle at its position counts. Operations,
 * kernels, masses, smoothing, backend and method are those of vtkPointNeighborhoodFilter, with
 * the masses and arrays to smooth taken from the particles:
 * - NeighborCount: the particles within R (int32 "NeighborCount");
 * - Density: sum_j m_j W(|x - x_j|, h) ("Density");
 * - KernelSmoothing: "<name>_smoothed", Shepard sum_j W f_j / sum_j W, or SPH
 *   sum_j (m_j / rho_j) f_j W, with rho_j the density at particle j from the particles (SPH also
 *   writes "Density" at the probe points).
 * With a radius array (input array 1) the radii are the particles' R_j: a probe point x gets the
 * particles with |x - x_j| <= R_j, each with W(r, h_j). That is SmoothingLengthMode SCATTER, the
 * default here and the only mode that applies (a probe point has no radius; GATHER and SYMMETRIC
 * are errors). GRADIENT is computed at the particles only: it is an error here.
 * A probe point with no particle within R gets count 0, density 0, smoothed values NullValue
 * (also where every neighbor lies exactly at the kernel's cutoff and the Shepard weights sum to
 * 0), and 0 in the validity array (ValidPointMaskArrayName, default "vtkValidPointMask"; 1
 * elsewhere). Image data probes (identity direction, extent from 0) are never turned into
 * points: the engine generates their points on the device.
 *
 * Errors are reported as in vtkPointNeighborhoodFilter (the output is left empty); a probe
 * without points passes through unchanged.
 */
#ifndef vtkPointNeighborhoodProbe_h
#define vtkPointNeighborhoodProbe_h

#include "NeighborGridFiltersModule.h" // for export macro
#include "vtkPointNeighborhoodFilter.h"

class vtkAlgorithmOutput;
class vtkDataObject;

class NEIGHBORGRIDFILTERS_EXPORT vtkPointNeighborhoodProbe : public vtkPointNeighborhoodFilter
{
public:
  static vtkPointNeighborhoodProbe* New();
  vtkTypeMacro(vtkPointNeighborhoodProbe, vtkPointNeighborhoodFilter);
  void PrintSelf(ostream& os, vtkIndent indent) override;

  ///@{
  /// The probe: where results are wanted (input port 1).
  void SetSourceConnection(vtkAlgorithmOutput* output);
  void SetSourceData(vtkDataObject* probe);
  vtkDataObject* GetSource();
  ///@}

protected:
  vtkPointNeighborhoodProbe();
  ~vtkPointNeighborhoodProbe() override;

  int FillInputPortInformation(int port, vtkInformation* info) override;
  int RequestDataObject(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  int RequestInformation(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  int RequestUpdateExtent(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  int RequestData(vtkInformation*, vtkInformationVector**, vtkInformationVector*) override;
  bool ProcessesBlocksSeparately() const override { return false; }

private:
  vtkPointNeighborhoodProbe(const vtkPointNeighborhoodProbe&) = delete;
  void operator=(const vtkPointNeighborhoodProbe&) = delete;
};

#endif
