"""PointNeighborhoodProbe and PointNeighborhoodVolume (Backend 'CPU') from pvpython, against
ParaView's SPH Volume Interpolator used the way its users use it, and vtkSPHInterpolator.

The volume: PointNeighborhoodVolume with "Use cell-size" over the sample's particles, against
SPHVolumeInterpolator(Input=particles, Source='Bounded Volume') on the same box and cell size
with a density array of ones (its "Shepard Summation" is then sum_j m_j W). The line: the density
on a Line source through the membrane, against vtkSPHInterpolator. Both to 1e-5 of the field's largest value; the validity
mask equals the interpolators' where they mark points (MASK_POINTS).

    pvpython TestPointNeighborhoodProbeVolume.py <NeighborGrid.so> [Data/popc-membrane.vtp]
"""
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy
from vtkmodules.vtkIOXML import vtkXMLPolyDataReader

import neighborgrid_testing as T

simple = T.load_plugin(globals())
RADIUS = 3.0
CELL = 1.5


def scaled_error(got, want):
    scale = max(np.max(np.abs(want)), 1e-300)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-2 * scale)))


reader = vtkXMLPolyDataReader()
reader.SetFileName(sys.argv[2])
reader.Update()
particles = reader.GetOutput()
n = particles.GetNumberOfPoints()
ones = np.ones(n, dtype=np.float32)
from vtkmodules.util.numpy_support import numpy_to_vtk  # noqa: E402

array = numpy_to_vtk(ones, deep=1)
array.SetName("ones")
particles.GetPointData().AddArray(array)
source = T.producer(simple, particles)

# --- The volume -------------------------------------------------------------------------------
volume = PointNeighborhoodVolume(Input=source)  # noqa: F821 (LoadPlugin)
volume.Backend = "CPU"
volume.Operation = "Density"
volume.Radius = RADIUS
volume.RefinementMode = "Use cell-size"
volume.CellSize = CELL
ours = T.output_of(volume)
dims = ours.GetDimensions()
bounds = particles.GetBounds()
expected_dims = [int(np.ceil((bounds[2 * a + 1] - bounds[2 * a] + 2 * RADIUS) / CELL)) + 1 for a in range(3)]
T.check(list(dims) == expected_dims, "volume dimensions %s, expected %s" % (dims, expected_dims))

reference = simple.SPHVolumeInterpolator(Input=source, Source="Bounded Volume")
reference.Kernel = "SPHCubicKernel"
reference.Kernel.SpatialStep = RADIUS / 2.0
reference.MassArray = "ones"
reference.DensityArray = "ones"
reference.ComputeShepardSum = 1
reference.NullPointsStrategy = "Mask Points"
reference.Source.Origin = [bounds[0] - RADIUS, bounds[2] - RADIUS, bounds[4] - RADIUS]
reference.Source.Scale = [bounds[1] - bounds[0] + 2 * RADIUS, bounds[3] - bounds[2] + 2 * RADIUS,
                          bounds[5] - bounds[4] + 2 * RADIUS]
reference.Source.RefinementMode = "Use cell-size"
reference.Source.CellSize = CELL
theirs = T.output_of(reference)
T.check(tuple(theirs.GetDimensions()) == tuple(dims),
        "SPH Volume Interpolator's volume %s differs from ours %s" % (theirs.GetDimensions(), dims))
T.check(np.allclose(theirs.GetOrigin(), ours.GetOrigin(), rtol=0, atol=1e-9),
        "origins differ: %s vs %s" % (theirs.GetOrigin(), ours.GetOrigin()))
density = vtk_to_numpy(ours.GetPointData().GetArray("Density")).astype(np.float64)
want = vtk_to_numpy(theirs.GetPointData().GetArray("Shepard Summation")).astype(np.float64)
error = scaled_error(density, want)
T.check(error <= 1e-5, "volume density vs SPH Volume Interpolator: error %g" % error)
mask = vtk_to_numpy(ours.GetPointData().GetArray("vtkValidPointMask"))
their_mask = vtk_to_numpy(theirs.GetPointData().GetArray("vtkValidPointMask"))
T.check(np.array_equal(mask, their_mask), "validity masks differ in %d points" % int(np.sum(mask != their_mask)))
T.check(0 < int(np.sum(mask == 0)) < mask.size, "the padded volume has empty points: %d" % int(np.sum(mask == 0)))

# --- A line probe -------------------------------------------------------------------------------
line = simple.Line(Point1=[bounds[0] - 5, 0.5 * (bounds[2] + bounds[3]), 0.5 * (bounds[4] + bounds[5])],
                   Point2=[bounds[1] + 5, 0.5 * (bounds[2] + bounds[3]), 0.5 * (bounds[4] + bounds[5])],
                   Resolution=400)
probe = PointNeighborhoodProbe(Input=source, Source=line)  # noqa: F821
probe.Backend = "CPU"
probe.Operation = "Density"
probe.Radius = RADIUS
along = T.output_of(probe)
T.check(along.GetClassName() == "vtkPolyData" and along.GetNumberOfPoints() == 401,
        "the probe output keeps the line's structure")
# vtkSPHInterpolator itself (the SPH Line Interpolator's class) on the same line.
from vtkmodules.vtkFiltersPoints import vtkSPHCubicKernel, vtkSPHInterpolator  # noqa: E402

kernel = vtkSPHCubicKernel()
kernel.SetSpatialStep(RADIUS / 2.0)
kernel.SetDimension(3)
interpolator = vtkSPHInterpolator()
interpolator.SetInputData(T.output_of(line))
interpolator.SetSourceData(particles)
interpolator.SetKernel(kernel)
interpolator.SetMassArrayName("ones")
interpolator.SetDensityArrayName("ones")
interpolator.ComputeShepardSumOn()
interpolator.Update()
on_line = interpolator.GetOutput()
got = vtk_to_numpy(along.GetPointData().GetArray("Density")).astype(np.float64)
want = vtk_to_numpy(on_line.GetPointData().GetArray("Shepard Summation")).astype(np.float64)
error = scaled_error(got, want)
T.check(error <= 1e-5, "line density vs SPH Line Interpolator: error %g" % error)
T.check(got[0] == 0.0 and got[-1] == 0.0, "the line's ends lie outside the particles")

T.finish()
