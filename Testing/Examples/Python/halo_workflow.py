"""Adaptive SPH on data without smoothing lengths: halos in a periodic box (Data/make_halo_snapshot.py).

    pvpython halo_workflow.py <NeighborGrid.so> --data halo-snapshot.vtp --out out
            [--backend Auto|CUDA|CPU] [--neighbors 64] [--resolution 128] [--no-image]

The pipeline a user builds in ParaView, periodic throughout (the box comes with the data):
  1. Point Neighborhood, Smoothing Length: each particle's distance to its 64th nearest other
     particle, "SupportRadius";
  2. Point Neighborhood, Density with Radius Array SupportRadius (Gather): rho_i with each
     particle's own kernel, about 64 neighbors each, from halo cores to the field;
  3. Point Neighborhood Volume, Density with the same radii (Scatter) on a grid over the box;
  4. a volume rendering of the grid's log10 density, out/halo-volume.png.
It checks the pipeline against references of its own, and fails (exit 1) where one does not hold:
  - every particle has at least k neighbors within its support radius (a Gather Neighbor Count
    with the radii), and on average k;
  - the support radii adapt: they span more than a factor 10 between halo cores and the field;
  - the support radius of 300 sampled particles equals a numpy brute force (the k-th smallest
    squared distance over the nearest images, in double, its square root rounded up to float);
  - the density of those particles (Gather) and at 300 sampled grid points (Scatter) equals a
    numpy brute force over the nearest images (within 1e-4 relative: float kernels);
and prints what SPH promises only approximately: the SPH volumes m_i / rho_i against the box's
volume, and the grid's density integrated against the total mass (kernels smaller than the
grid's spacing, in halo cores, make this a coarse quadrature).
Writes out/halo-particles.vtp and out/halo-volume.vti.
"""
import argparse
import os
import sys

import numpy as np
from paraview import simple
from vtkmodules.util.numpy_support import vtk_to_numpy

parser = argparse.ArgumentParser()
parser.add_argument("plugin")
parser.add_argument("--data", required=True)
parser.add_argument("--out", default="out")
parser.add_argument("--backend", default="Auto")
parser.add_argument("--neighbors", type=int, default=64)
parser.add_argument("--resolution", type=int, default=128)
parser.add_argument("--no-image", action="store_true")
args = parser.parse_args()

simple.LoadPlugin(args.plugin, ns=globals())
os.makedirs(args.out, exist_ok=True)
failures = []


def check(ok, text):
    print("%s %s" % ("ok  " if ok else "FAIL", text))
    if not ok:
        failures.append(text)


def cubic_spline(r, support):
    """VTK's cubic spline kernel in 3D, h = support / 2 (DESIGN.md)."""
    h = support / 2.0
    q = r / h
    w = 0.25 * np.maximum(2.0 - q, 0.0) ** 3 - np.maximum(1.0 - q, 0.0) ** 3
    return w / (np.pi * h ** 3)


def nearest_image_offsets(points, at, box):
    """points - at, per axis the nearest periodic image (the engine's image x_j + m L)."""
    m = np.round((at[None, :] - points) / box)
    return (points + m * box) - at[None, :]


def squared(d):
    return (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]


def info_of(data):
    info = data.GetFieldData().GetAbstractArray("NeighborGridInfo")
    return dict(info.GetValue(k).split("=", 1) for k in range(info.GetNumberOfValues()) if "=" in info.GetValue(k))


snapshot = simple.XMLPolyDataReader(FileName=[args.data])
snapshot.UpdatePipeline()
lengths_array = simple.servermanager.Fetch(snapshot).GetFieldData().GetArray("BoxLengths")
box = [lengths_array.GetValue(a) for a in range(3)]

# 1. Support radii from the k nearest neighbors (the box: BoxLengths field data).
lengths = PointNeighborhood(Input=snapshot)  # noqa: F821 (LoadPlugin)
lengths.Operation = "Smoothing Length"
lengths.NeighborTarget = args.neighbors
lengths.Periodic = [1, 1, 1]
lengths.Backend = args.backend

# 2. The density at the particles, each with its own kernel.
density = PointNeighborhood(Input=lengths)  # noqa: F821
density.Operation = "Density"
density.RadiusArray = ["POINTS", "SupportRadius"]
density.SmoothingLengthMode = "Gather"
density.MassArray = ["POINTS", "mass"]
density.Periodic = [1, 1, 1]
density.Backend = args.backend
density.UpdatePipeline()
particles = simple.servermanager.Fetch(density)
simple.SaveData(os.path.join(args.out, "halo-particles.vtp"), proxy=density)

radius = vtk_to_numpy(particles.GetPointData().GetArray("SupportRadius")).astype(np.float64)
rho = vtk_to_numpy(particles.GetPointData().GetArray("Density")).astype(np.float64)
mass = vtk_to_numpy(particles.GetPointData().GetArray("mass")).astype(np.float64)
ran = info_of(particles)
print("%d particles, box %g x %g x %g; ran on %s (%s)" % (
    len(radius), box[0], box[1], box[2], ran.get("backend"), ran.get("device")))
print("support radius (k = %d): %.3g to %.3g, median %.3g" % (
    args.neighbors, radius.min(), radius.max(), np.median(radius)))
print("density at the particles: %.3g to %.3g (mean of the box %.3g)" % (
    rho.min(), rho.max(), mass.sum() / (box[0] * box[1] * box[2])))

# Every particle sees at least k others within its support radius (Gather).
counts = PointNeighborhood(Input=lengths)  # noqa: F821
counts.Operation = "Neighbor Count"
counts.RadiusArray = ["POINTS", "SupportRadius"]
counts.SmoothingLengthMode = "Gather"
counts.Periodic = [1, 1, 1]
counts.Backend = args.backend
counts.UpdatePipeline()
neighbors = vtk_to_numpy(simple.servermanager.Fetch(counts).GetPointData().GetArray("NeighborCount"))
check(neighbors.min() >= args.neighbors,
      "every particle has at least k = %d neighbors within its support radius (fewest %d, mean %.2f)"
      % (args.neighbors, neighbors.min(), neighbors.mean()))
check(radius.max() > 10.0 * radius.min(),
      "the support radii adapt to the clustering (largest / smallest = %.0f)" % (radius.max() / radius.min()))
xyz = vtk_to_numpy(particles.GetPoints().GetData()).astype(np.float64)
box_array = np.array(box)
rng = np.random.default_rng(5)
worst_radius, worst_density = 0, 0.0
for i in rng.choice(len(xyz), 300, replace=False):
    d2 = squared(nearest_image_offsets(xyz, xyz[i], box_array))
    d2[i] = np.inf
    kth = np.partition(d2, args.neighbors - 1)[args.neighbors - 1]
    expected = np.float32(np.sqrt(kth))
    expected = expected if float(expected) ** 2 >= kth else np.nextafter(expected, np.float32(np.inf))
    worst_radius += int(np.float32(radius[i]) != expected)
    d2[i] = 0.0
    near = d2 <= float(np.float32(radius[i])) ** 2
    reference = np.sum(mass[near] * cubic_spline(np.sqrt(d2[near]), float(np.float32(radius[i]))))
    worst_density = max(worst_density, abs(rho[i] - reference) / reference)
check(worst_radius == 0, "the support radius of 300 sampled particles equals a brute force in double (%d differ)"
      % worst_radius)
check(worst_density < 1e-4, "their Gather density equals a brute force (max relative difference %.2g)"
      % worst_density)
volume_sum = float(np.sum(mass / rho))
box_volume = box[0] * box[1] * box[2]
print("the SPH volumes m_i / rho_i add up to %.4g of the box's %.4g (%+.1f%%)" % (
    volume_sum, box_volume, 100.0 * (volume_sum / box_volume - 1.0)))

# 3. The density on a grid over the box, from the particles' own kernels (Scatter).
grid = PointNeighborhoodVolume(Input=lengths)  # noqa: F821
grid.Operation = "Density"
grid.RadiusArray = ["POINTS", "SupportRadius"]
grid.SmoothingLengthMode = "Scatter"
grid.MassArray = ["POINTS", "mass"]
grid.Periodic = [1, 1, 1]
grid.UseParticleBounds = 0
grid.Origin = [0.0, 0.0, 0.0]
grid.Scale = box
grid.Padding = 0.0
grid.RefinementMode = "Use resolution"
grid.Resolution = [args.resolution] * 3
grid.Backend = args.backend
grid.UpdatePipeline()
simple.SaveData(os.path.join(args.out, "halo-volume.vti"), proxy=grid)
image = simple.servermanager.Fetch(grid)
dims = image.GetDimensions()
field = vtk_to_numpy(image.GetPointData().GetArray("Density")).reshape(dims[2], dims[1], dims[0])
spacing = image.GetSpacing()
# The grid's last plane on each axis is its first one again (the box is periodic).
integral = float(field[:-1, :-1, :-1].sum()) * spacing[0] * spacing[1] * spacing[2]
grid_info = info_of(image)
print("volume %d x %d x %d points, spacing %.3g; density %.3g to %.3g; %s ms in the engine" % (
    dims[0], dims[1], dims[2], spacing[0], field.min(), field.max(),
    "%.0f" % sum(float(v) for k, v in grid_info.items() if k.startswith("stage."))))
print("the grid's density integrates to %.6g of the total mass %.6g (%+.1f%%)" % (
    integral, mass.sum(), 100.0 * (integral / mass.sum() - 1.0)))
flat = field.reshape(-1)
origin = np.array(image.GetOrigin())
worst_grid = 0.0
radius32 = radius.astype(np.float32).astype(np.float64)
for g in rng.choice(flat.size, 300, replace=False):
    ijk = np.array([g % dims[0], (g // dims[0]) % dims[1], g // (dims[0] * dims[1])])
    at = origin + ijk * np.array(spacing)
    d2 = squared(nearest_image_offsets(xyz, at, box_array))
    near = d2 <= radius32 ** 2
    reference = np.sum(mass[near] * cubic_spline(np.sqrt(d2[near]), radius32[near]))
    scale = max(reference, 1e-3 * mass.sum() / box_volume)
    worst_grid = max(worst_grid, abs(flat[g] - reference) / scale)
check(worst_grid < 1e-4, "the grid's Scatter density at 300 sampled points equals a brute force (max relative %.2g)"
      % worst_grid)

if not args.no_image:
    # log10 of the density: halo cores are 1e4-1e5 times denser than the field.
    mean = mass.sum() / box_volume
    logarithm = simple.Calculator(Input=grid, AttributeType="Point Data", ResultArrayName="log10_density",
                                  Function="log10(Density + %.6g)" % (0.1 * mean))
    view = simple.CreateView("RenderView")
    view.ViewSize = [1000, 1000]
    if hasattr(view, "UseColorPaletteForBackground"):
        view.UseColorPaletteForBackground = 0
    view.Background = [0.0, 0.0, 0.0]
    view.OrientationAxesVisibility = 0
    display = simple.Show(logarithm, view)
    display.SetRepresentationType("Volume")
    display.VolumeRenderingMode = "Ray Cast Only"
    display.ScalarOpacityUnitDistance = 2.0
    simple.ColorBy(display, ("POINTS", "log10_density"))
    low, high = np.log10(0.1 * mean), np.log10(3e3 * mean)
    lut = simple.GetColorTransferFunction("log10_density")
    lut.ApplyPreset("Inferno (matplotlib)", True)
    lut.RescaleTransferFunction(low, high)
    opacity = simple.GetOpacityTransferFunction("log10_density")
    # The field faint, halos more opaque towards their cores.
    opacity.Points = [low, 0.0, 0.5, 0.0, np.log10(mean), 0.02, 0.5, 0.0, np.log10(100 * mean), 0.4, 0.5, 0.0,
                      high, 1.0, 0.5, 0.0]
    display.SetScalarBarVisibility(view, True)
    bar = simple.GetScalarBar(lut, view)
    bar.Title = "log10 density (particle masses per unit volume)"
    bar.ComponentTitle = ""
    bar.TitleColor = bar.LabelColor = [0.9, 0.9, 0.9]
    outline = simple.Show(simple.Outline(Input=grid), view)
    outline.AmbientColor = outline.DiffuseColor = [0.5, 0.5, 0.5]
    view.CameraPosition = [0.5 * box[0] + 150.0, 0.5 * box[1] - 190.0, 0.5 * box[2] + 110.0]
    view.CameraFocalPoint = [0.5 * box[0], 0.5 * box[1], 0.5 * box[2]]
    view.CameraViewUp = [0.0, 0.0, 1.0]
    simple.Render(view)
    view.ResetCamera()
    view.GetActiveCamera().Dolly(1.2)
    path = os.path.join(args.out, "halo-volume.png")
    simple.SaveScreenshot(path, view, ImageResolution=[1000, 1000])
    print("wrote", path)

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
