"""A clustered periodic snapshot: dark-matter-like halos in a periodic box, without smoothing lengths.

    pvpython Data/make_halo_snapshot.py [--out halo-snapshot.vtp] [--particles 131072] [--seed 2026]

(or python3 with ParaView's Python modules on the path). Writes a vtkPolyData of equal-mass
particles, the kind of N-body output (Gadget, SWIFT dark matter) that carries positions and masses
but no h: Smoothing Length then gives each particle its own support radius. Deterministic for a
given seed and particle count.

The model, in a box of 100 length units (think Mpc/h), periodic on every axis:
- 70% of the particles in 60 halos whose particle counts follow a power law (dN/dM ~ M^-1.9,
  from 200 particles up to about a tenth of the halo particles), each an NFW profile
  rho ~ 1 / (x (1 + x)^2), x = r / r_s, truncated at the virial radius r_vir = c r_s (c = 8), with
  r_vir proportional to M^(1/3) (3.5 units for the largest); halos near a face wrap around it;
- 30% uniform over the box (the field between halos).
Densities thus range over about five decades: halo cores are 1e4-1e5 times denser than the
field, as in a cosmological snapshot.

Point arrays: "mass" (float32, 1 per particle) and "halo" (int32, the halo's index, -1 in the
field). Field data: "BoxOrigin" (0, 0, 0) and "BoxLengths" (100, 100, 100), which Point
Neighborhood's Periodic option reads when its BoxLengths is left at 0. One vertex per particle.
"""
import argparse

import numpy as np
from vtkmodules.util.numpy_support import numpy_to_vtk
from vtkmodules.vtkCommonCore import vtkPoints, vtkDoubleArray
from vtkmodules.vtkCommonDataModel import vtkCellArray, vtkPolyData
from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter

BOX = 100.0
HALO_FRACTION = 0.7
HALOS = 60
CONCENTRATION = 8.0
LARGEST_VIRIAL_RADIUS = 3.5


def nfw_radii(rng, count, virial_radius):
    """Radii drawn from an NFW profile truncated at the virial radius (inverse of its mass)."""
    x = np.linspace(0.0, CONCENTRATION, 4097)
    enclosed = np.log1p(x) - x / (1.0 + x)
    u = rng.uniform(0.0, enclosed[-1], count)
    return np.interp(u, enclosed, x) * (virial_radius / CONCENTRATION)


def halo_sizes(rng, total):
    """Particle counts of the halos: a power law from 200 up, scaled to `total` in all."""
    smallest, slope = 200.0, 1.9
    u = rng.uniform(0.0, 1.0, HALOS)
    largest = 0.1 * total
    a, b = smallest ** (1.0 - slope), largest ** (1.0 - slope)
    masses = (a + u * (b - a)) ** (1.0 / (1.0 - slope))
    sizes = np.floor(masses / masses.sum() * total).astype(np.int64)
    sizes[np.argmax(sizes)] += total - sizes.sum()
    return sizes


def make_snapshot(particles, seed):
    """(xyz float32 in [0, BOX)^3, halo index per particle)."""
    rng = np.random.default_rng(seed)
    in_halos = int(HALO_FRACTION * particles)
    sizes = halo_sizes(rng, in_halos)
    centers = rng.uniform(0.0, BOX, (HALOS, 3))
    xyz, halo = [], []
    for index, size in enumerate(sizes):
        radius = LARGEST_VIRIAL_RADIUS * (size / sizes.max()) ** (1.0 / 3.0)
        r = nfw_radii(rng, size, radius)
        direction = rng.normal(0.0, 1.0, (size, 3))
        direction /= np.linalg.norm(direction, axis=1)[:, None]
        xyz.append(centers[index] + r[:, None] * direction)
        halo.append(np.full(size, index, dtype=np.int32))
    field = particles - in_halos
    xyz.append(rng.uniform(0.0, BOX, (field, 3)))
    halo.append(np.full(field, -1, dtype=np.int32))
    xyz = np.mod(np.concatenate(xyz), BOX).astype(np.float32)
    # float32 rounding may land on BOX itself: keep every particle inside [0, BOX).
    xyz = np.minimum(xyz, np.nextafter(np.float32(BOX), np.float32(0.0)))
    return xyz, np.concatenate(halo)


def write_snapshot(path, particles=131072, seed=2026):
    xyz, halo = make_snapshot(particles, seed)
    data = vtkPolyData()
    points = vtkPoints()
    points.SetData(numpy_to_vtk(np.ascontiguousarray(xyz), deep=1))
    data.SetPoints(points)
    verts = vtkCellArray()
    offsets = np.arange(particles + 1, dtype=np.int64)
    verts.SetData(numpy_to_vtk(offsets, deep=1), numpy_to_vtk(offsets[:-1].copy(), deep=1))
    data.SetVerts(verts)
    for name, values in (("mass", np.ones(particles, dtype=np.float32)), ("halo", halo)):
        array = numpy_to_vtk(values, deep=1)
        array.SetName(name)
        data.GetPointData().AddArray(array)
    for name, values in (("BoxOrigin", (0.0, 0.0, 0.0)), ("BoxLengths", (BOX, BOX, BOX))):
        array = vtkDoubleArray()
        array.SetName(name)
        for v in values:
            array.InsertNextValue(v)
        data.GetFieldData().AddArray(array)
    writer = vtkXMLPolyDataWriter()
    writer.SetFileName(path)
    writer.SetInputData(data)
    writer.SetDataModeToBinary()
    writer.SetCompressorTypeToZLib()
    if not writer.Write():
        raise SystemExit("could not write %s" % path)
    print("wrote %s: %d particles, %d in %d halos, box %g" % (
        path, particles, int(np.count_nonzero(halo >= 0)), HALOS, BOX))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="halo-snapshot.vtp")
    parser.add_argument("--particles", type=int, default=131072)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    write_snapshot(args.out, args.particles, args.seed)
