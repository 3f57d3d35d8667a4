"""The sample membrane's mass density as a volume: Point Neighborhood Volume, volume-rendered.

    pvpython volume_density.py <NeighborGrid.so> --data Data/popc-membrane.vtp --out out
            [--backend Auto|CUDA|CPU] [--cell-size 0.5] [--no-image]

Writes out/sample-volume.vti (density, vtkValidPointMask) and out/sample-volume.png (a volume
rendering), and prints the volume's size, the density range and where it ran. Rendering needs
an X display; without one, run it under xvfb-run (.ci/sample does).
"""
import argparse
import os

from paraview import simple

parser = argparse.ArgumentParser()
parser.add_argument("plugin")
parser.add_argument("--data", required=True)
parser.add_argument("--out", default="out")
parser.add_argument("--backend", default="Auto")
parser.add_argument("--cell-size", type=float, default=0.5)
parser.add_argument("--no-image", action="store_true")
args = parser.parse_args()

simple.LoadPlugin(args.plugin, ns=globals())
os.makedirs(args.out, exist_ok=True)

membrane = simple.XMLPolyDataReader(FileName=[args.data])
volume = PointNeighborhoodVolume(Input=membrane)  # noqa: F821 (LoadPlugin)
volume.Operation = "Density"
volume.Radius = 8.0
volume.MassArray = ["POINTS", "mass"]
volume.RefinementMode = "Use cell-size"  # ParaView's Bounded Volume: 'Use resolution' or 'Use cell-size'
volume.CellSize = args.cell_size         # Angstrom; the box is the atoms' bounds padded by Radius
volume.Backend = args.backend
# The membrane's periodic box travels with the data (BoxLengths field data): atoms see their
# neighbors across the faces, and the grid points outside the box see the atoms' images.
membrane.UpdatePipeline()
if "BoxLengths" in membrane.FieldData.keys():
    volume.Periodic = [1, 1, 1]
volume.UpdatePipeline()
simple.SaveData(os.path.join(args.out, "sample-volume.vti"), proxy=volume)

image = simple.servermanager.Fetch(volume)
density = image.GetPointData().GetArray("Density")
valid = image.GetPointData().GetArray("vtkValidPointMask")
info = image.GetFieldData().GetAbstractArray("NeighborGridInfo")
entries = dict(info.GetValue(k).split("=", 1) for k in range(info.GetNumberOfValues()) if "=" in info.GetValue(k))
dims = image.GetDimensions()
low, high = density.GetRange()
print("volume %d x %d x %d points (spacing %.2f A), density %.4g to %.4g amu/A^3, %d points without atoms within R"
      % (dims[0], dims[1], dims[2], image.GetSpacing()[0], low, high,
         sum(1 for k in range(valid.GetNumberOfTuples()) if valid.GetValue(k) == 0)))
print("ran on %s (%s, %s)" % (entries.get("backend"), entries.get("method"), entries.get("device")))

if not args.no_image:
    view = simple.CreateView("RenderView")
    view.ViewSize = [1000, 900]
    if hasattr(view, "UseColorPaletteForBackground"):
        view.UseColorPaletteForBackground = 0
    view.Background = [1.0, 1.0, 1.0]
    view.OrientationAxesVisibility = 0
    display = simple.Show(volume, view)
    display.SetRepresentationType("Volume")
    display.VolumeRenderingMode = "Ray Cast Only"
    display.ScalarOpacityUnitDistance = 2.0
    simple.ColorBy(display, ("POINTS", "Density"))
    lut = simple.GetColorTransferFunction("Density")
    lut.ApplyPreset("Inferno (matplotlib)", True)
    lut.RescaleTransferFunction(0.0, high)
    opacity = simple.GetOpacityTransferFunction("Density")
    # The thin rim where atoms end and the lipid tails clear, water (about 0.6 amu/A^3) faint, the
    # head groups (densest) opaque.
    opacity.Points = [0.0, 0.0, 0.5, 0.0, 0.45 * high, 0.0, 0.5, 0.0, 0.6 * high, 0.004, 0.5, 0.0,
                      high, 0.7, 0.5, 0.0]
    display.SetScalarBarVisibility(view, True)
    bar = simple.GetScalarBar(lut, view)
    bar.Title = "Density (amu/A^3)"
    bar.ComponentTitle = ""
    bar.TitleColor = bar.LabelColor = [0.1, 0.1, 0.1]
    bounds = image.GetBounds()
    cx, cy, cz = [(bounds[2 * a] + bounds[2 * a + 1]) / 2 for a in range(3)]
    view.CameraPosition = [cx + 120.0, cy - 200.0, cz + 60.0]
    view.CameraFocalPoint = [cx, cy, cz]
    view.CameraViewUp = [0.0, 0.0, 1.0]
    simple.Render(view)
    view.ResetCamera()
    view.GetActiveCamera().Dolly(1.15)
    path = os.path.join(args.out, "sample-volume.png")
    simple.SaveScreenshot(path, view, ImageResolution=[1000, 900])
    print("wrote", path)
