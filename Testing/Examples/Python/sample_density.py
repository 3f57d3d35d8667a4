"""NeighborGrid sample: density and neighbor counts of a lipid membrane, with a picture.

    pvpython Testing/Examples/Python/sample_density.py PLUGIN [--data VTP] [--out DIR]
             [--density-radius R] [--count-radius R] [--backend Auto|CUDA|CPU] [--no-image]

PLUGIN is the built NeighborGrid.so (build/lib/paraview-5.11/plugins/NeighborGrid/NeighborGrid.so).
Reads Data/popc-membrane.vtp (OpenMM's POPC bilayer in water, 32,512 atoms, angstrom), runs
Point Neighborhood twice, for the mass density (Mass Array 'mass', Da/A^3, R = 8 A) and for the
neighbor count (the default Radius, 5 A), in the data's periodic box (--open-box: without it), writes DIR/sample-result.vtp with both arrays and
DIR/sample-density.png (a slab through the box, atoms colored by density), and prints a summary.
Rendering needs an X display; without one, run it under xvfb-run (.ci/sample does).
"""
import argparse
import os
import sys

import numpy as np
from paraview import simple
from vtkmodules.util.numpy_support import vtk_to_numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DA_PER_A3_TO_G_PER_CM3 = 1.66053907  # 1 Da/A^3 = 1.66054 g/cm^3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plugin", help="path of NeighborGrid.so")
    p.add_argument("--data", default=os.path.join(ROOT, "Data", "popc-membrane.vtp"))
    p.add_argument("--out", default=os.path.join(os.getcwd(), "out"))
    p.add_argument("--open-box", action="store_true",
                   help="ignore the data's periodic box (BoxLengths field data)")
    p.add_argument("--density-radius", type=float, default=8.0,
                   help="support radius R of the density (angstrom; default 8: h = 4 for the cubic)")
    p.add_argument("--count-radius", type=float, default=None,
                   help="support radius R of the neighbor count (default: the filter's default, 5)")
    p.add_argument("--backend", default="Auto", choices=["Auto", "CUDA", "CPU"])
    p.add_argument("--no-image", action="store_true", help="skip the rendering")
    return p.parse_args()


def stats(values):
    v = np.asarray(values, dtype=np.float64)
    return v.min(), np.median(v), v.max(), v.mean()


def run_info(proxy):
    """NeighborGridInfo of a filter's output as a dict (its entries are key=value)."""
    data = proxy.GetClientSideObject().GetOutputDataObject(0)
    arr = data.GetFieldData().GetAbstractArray("NeighborGridInfo")
    entries = [arr.GetValue(i) for i in range(arr.GetNumberOfValues())] if arr else []
    return dict(e.split("=", 1) for e in entries if "=" in e)


def stage_ms(info):
    return sum(float(v) for k, v in info.items() if k.startswith("stage.") and k.endswith("_ms"))


def render(result, path, bounds, radius, caption):
    """Atoms of a 16 A thick slab through the middle of the box, seen along y, colored by density."""
    ymid = 0.5 * (bounds[2] + bounds[3])
    # Threshold on the y coordinate, made a point array by a Calculator.
    ycoord = simple.Calculator(Input=result, ResultArrayName="y", Function="coordsY")
    slab = simple.Threshold(Input=ycoord, Scalars=["POINTS", "y"])
    slab.LowerThreshold = ymid - 8.0
    slab.UpperThreshold = ymid + 8.0
    slab.ThresholdMethod = "Between"

    view = simple.CreateView("RenderView")
    view.ViewSize = [1000, 900]
    view.OrientationAxesVisibility = 0
    view.Background = [1.0, 1.0, 1.0]
    try:  # ParaView 5.11: the background comes from the color palette unless this is off
        view.UseColorPaletteForBackground = 0
    except AttributeError:
        pass
    display = simple.Show(slab, view)
    display.SetRepresentationType("Points")
    display.PointSize = 6.0
    display.RenderPointsAsSpheres = 1
    simple.ColorBy(display, ("POINTS", "Density"))
    lut = simple.GetColorTransferFunction("Density")
    lut.ApplyPreset("Viridis (matplotlib)", True)
    lut.RescaleTransferFunction(0.25, 0.75)  # Da/A^3: the core of the bilayer to the head groups
    bar = simple.GetScalarBar(lut, view)
    bar.Title = "Mass density (Da/\u00c5\u00b3)"
    bar.ComponentTitle = ""
    bar.TitleColor = [0.1, 0.1, 0.1]
    bar.LabelColor = [0.1, 0.1, 0.1]
    bar.TitleFontSize = 20
    bar.LabelFontSize = 18
    bar.RangeLabelFormat = "%-#.2f"
    bar.WindowLocation = "Any Location"
    bar.Orientation = "Vertical"
    bar.Position = [0.86, 0.25]
    bar.ScalarBarLength = 0.5
    display.SetScalarBarVisibility(view, True)

    title = simple.Text(Text="%s (a 16 \u00c5 slab shown)\n"
                        "NeighborGrid Point Neighborhood, Density of atom masses, R = %g \u00c5"
                        % (caption, radius))
    title_display = simple.Show(title, view)
    title_display.Color = [0.1, 0.1, 0.1]
    title_display.FontSize = 22
    title_display.WindowLocation = "Upper Center"

    cx, cy, cz = (0.5 * (bounds[0] + bounds[1]), ymid, 0.5 * (bounds[4] + bounds[5]))
    view.CameraPosition = [cx, cy - 250.0, cz]
    view.CameraFocalPoint = [cx, cy, cz]
    view.CameraViewUp = [0.0, 0.0, 1.0]
    view.CameraParallelProjection = 1
    simple.Render(view)
    view.ResetCamera()
    view.CameraParallelScale *= 0.95
    simple.SaveScreenshot(path, view, ImageResolution=[1000, 900])


def main():
    args = parse_args()
    simple.LoadPlugin(args.plugin, ns=globals())
    os.makedirs(args.out, exist_ok=True)

    reader = simple.XMLPolyDataReader(FileName=[args.data])
    # Mass density: the atoms' masses (Da) summed with the cubic spline. A mass density needs a
    # smoothing length of a few atomic spacings: R = 8 A, h = R / 2 = 4 A (about 190 neighbors).
    density = PointNeighborhood(Input=reader)  # noqa: F821 (defined by LoadPlugin)
    density.Operation = "Density"
    density.Radius = args.density_radius
    density.Kernel = "Cubic Spline"
    density.MassArray = ["POINTS", "mass"]
    density.Backend = args.backend
    # The membrane's periodic box (CRYST1) travels with the data as field data (BoxLengths,
    # BoxOrigin): with Periodic on, atoms near the faces see their neighbors across them.
    reader.UpdatePipeline()
    periodic = not args.open_box and "BoxLengths" in reader.FieldData.keys()
    if periodic:
        density.Periodic = [1, 1, 1]
    # Neighbor count on the density's output: the result carries both arrays.
    count = PointNeighborhood(Input=density)  # noqa: F821
    count.Operation = "Neighbor Count"
    if args.count_radius is not None:
        count.Radius = args.count_radius
    count.Backend = args.backend
    if periodic:
        count.Periodic = [1, 1, 1]
    count.UpdatePipeline()

    result = count.GetClientSideObject().GetOutputDataObject(0)
    pd = result.GetPointData()
    for name in ("Density", "NeighborCount"):
        if pd.GetArray(name) is None:
            sys.exit("sample: the output has no %s array (see the errors above)" % name)
    rho = vtk_to_numpy(pd.GetArray("Density"))
    nbr = vtk_to_numpy(pd.GetArray("NeighborCount"))
    density_info = run_info(density)
    count_info = run_info(count)

    result_path = os.path.join(args.out, "sample-result.vtp")
    simple.SaveData(result_path, proxy=count, DataMode="Binary", CompressorType="ZLib")

    image_path = None
    if not args.no_image:
        image_path = os.path.join(args.out, "sample-density.png")
        what = ("POPC bilayer in water" if os.path.basename(args.data) == "popc-membrane.vtp"
                else os.path.basename(args.data))
        caption = "%s: %s atoms" % (what, format(result.GetNumberOfPoints(), ","))
        render(count, image_path, result.GetBounds(), density.Radius, caption)

    water = vtk_to_numpy(pd.GetArray("water")) > 0.5 if pd.GetArray("water") else None
    print("NeighborGrid sample")
    print("  data           %s (%d points)" % (os.path.relpath(args.data), result.GetNumberOfPoints()))
    print("  backend        %s (%s), method %s, device %s" % (
        density_info.get("backend", "?"), density_info.get("backend_reason", "?"),
        density_info.get("method", "?"), density_info.get("device", "?")))
    print("  time           Density %.1f ms, NeighborCount %.1f ms (engine stages)" % (
        stage_ms(density_info), stage_ms(count_info)))
    if periodic:
        print("  periodic box   %s, %s images of atoms added" % (
            density_info.get("periodic", "?"), density_info.get("periodic_images", "?")))
    else:
        print("  open box       (no periodic images)")
    print("  Density        radius %g, Cubic Spline, Mass Array 'mass'" % density.Radius)
    print("  Density        min %.4g  median %.4g  max %.4g  mean %.4g  (Da/A^3)" % stats(rho))
    if water is not None and water.any() and (~water).any():
        print("                 median water %.3f g/cm^3, lipid %.3f g/cm^3" % (
            np.median(rho[water]) * DA_PER_A3_TO_G_PER_CM3,
            np.median(rho[~water]) * DA_PER_A3_TO_G_PER_CM3))
    print("  NeighborCount  radius %g" % count.Radius)
    print("  NeighborCount  min %d  median %g  max %d  mean %.2f" % (
        nbr.min(), np.median(nbr), nbr.max(), nbr.mean()))
    print("  wrote          %s" % result_path)
    if image_path:
        print("  wrote          %s" % image_path)


if __name__ == "__main__":
    main()
