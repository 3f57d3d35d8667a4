"""The view of the GUI test (TestNeighborGridGUI.xml), run in the paraview client's Python shell
after the three NeighborGrid filters were applied from the Filters menu.

Side by side in one render view, seen along +y (the membrane normal z is up), parallel
projection, fixed camera and fixed color and opacity ranges (so wrong values show as wrong colors,
not as a rescaled map): Point Neighborhood's particles as points (left, shifted by -95 A), the
Volume's density volume-rendered (middle), the Probe's line as a thick line (right, +60 A), all
colored by Density. The pipeline is checked first and reported on the process's stderr (the
shell's own output stays in the GUI): if it is not what the XML should have built, nothing is
shown, so the image comparison fails.
"""
import os

import paraview.simple as s


def _report(message):
    os.write(2, ("TestNeighborGridGUI: %s\n" % message).encode())


def _input_name(proxy, name="Input"):
    """The registration name of the source connected to an input property."""
    value = proxy.GetPropertyValue(name)
    value = value[0] if isinstance(value, list) and value else value
    smproxy = getattr(value, "SMProxy", None) or getattr(getattr(value, "Proxy", None), "SMProxy", None)
    return next((key[0] for key, p in s.GetSources().items() if p.SMProxy == smproxy), None)


view = s.GetActiveView()
sources = {key[0]: proxy for key, proxy in s.GetSources().items()}
for proxy in sources.values():
    s.Hide(proxy, view)

expected = {  # source: (its class, the input it must have, the probe's source)
    "PointNeighborhood1": ("PointNeighborhood", "popc-membrane.vtp", None),
    "PointNeighborhoodProbe1": ("PointNeighborhoodProbe", "PointNeighborhood1", "ProbeLine"),
    "PointNeighborhoodVolume1": ("PointNeighborhoodVolume", "PointNeighborhood1", None),
}
problems = []
for name, (xml_name, input_name, source_name) in expected.items():
    proxy = sources.get(name)
    if proxy is None or proxy.GetXMLName() != xml_name:
        problems.append("no %s %s in the pipeline (%s)" % (xml_name, name, sorted(sources)))
        continue
    if _input_name(proxy) != input_name:
        problems.append("%s's Input is %s, not %s" % (name, _input_name(proxy), input_name))
    if source_name and _input_name(proxy, "Source") != source_name:
        problems.append("%s's Source is %s, not %s" % (name, _input_name(proxy, "Source"), source_name))
    density = proxy.PointData["Density"].GetRange() if "Density" in proxy.PointData.keys() else None
    _report("%s: %d points, Density %s" % (name, proxy.GetDataInformation().GetNumberOfPoints(), density))

if problems:
    for problem in problems:
        _report("FAIL " + problem)
    s.Render(view)  # an empty view: the image comparison fails
else:
    view.OrientationAxesVisibility = 0
    view.UseColorPaletteForBackground = 0
    view.Background = [1.0, 1.0, 1.0]

    # Number density (mass 1) with R = 5 A: 0.05 to 0.18 atoms/A^3 at the atoms.
    density_range = [0.0, 0.18]
    lut = s.GetColorTransferFunction("Density")
    lut.ApplyPreset("Viridis (matplotlib)", True)
    lut.AutomaticRescaleRangeMode = "Never"
    lut.RescaleTransferFunction(*density_range)
    opacity = s.GetOpacityTransferFunction("Density")
    opacity.RescaleTransferFunction(*density_range)
    opacity.Points = [0.0, 0.0, 0.5, 0.0, 0.06, 0.0, 0.5, 0.0, 0.18, 0.6, 0.5, 0.0]

    particles = s.Show(sources["PointNeighborhood1"], view)
    particles.SetRepresentationType("Points")
    particles.PointSize = 2
    s.ColorBy(particles, ("POINTS", "Density"))
    particles.Position = [-95.0, 0.0, 0.0]

    volume = s.Show(sources["PointNeighborhoodVolume1"], view)
    volume.SetRepresentationType("Volume")
    s.ColorBy(volume, ("POINTS", "Density"))
    volume.ScalarOpacityFunction = opacity
    volume.ScalarOpacityUnitDistance = 3.0

    probe = s.Show(sources["PointNeighborhoodProbe1"], view)
    probe.SetRepresentationType("Surface")
    probe.LineWidth = 6
    s.ColorBy(probe, ("POINTS", "Density"))
    probe.Position = [60.0, 0.0, 0.0]

    for display in (particles, volume, probe):
        display.SetScalarBarVisibility(view, False)
    view.CameraParallelProjection = 1
    view.CameraFocalPoint = [-10.0, 32.0, 37.0]
    view.CameraPosition = [-10.0, -300.0, 37.0]
    view.CameraViewUp = [0.0, 0.0, 1.0]
    view.CameraParallelScale = 110.0
    s.Render(view)
