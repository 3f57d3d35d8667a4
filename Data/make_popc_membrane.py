"""Convert OpenMM's pre-equilibrated POPC membrane patch (POPC.pdb) to Data/popc-membrane.vtp.

Run with pvpython (or any Python with VTK and numpy):

    pvpython Data/make_popc_membrane.py [path/to/POPC.pdb] [out.vtp]

The PDB ships in Debian's python3-simtk package (OpenMM 7.7) as
/usr/lib/python3/dist-packages/openmm/app/data/POPC.pdb. Without installing the package:

    apt-get download python3-simtk && dpkg -x python3-simtk_*.deb simtk
    pvpython Data/make_popc_membrane.py simtk/usr/lib/python3/dist-packages/openmm/app/data/POPC.pdb

Every ATOM/HETATM record becomes one vertex of a vtkPolyData; coordinates stay in angstrom, as in
the PDB. Point arrays (see Data/README.md): mass (Da, from the element), atomic_number, water
(1 for atoms of water molecules, 0 for lipid atoms) and residue (residue sequence number).
"""
import os
import sys

import numpy as np
from vtkmodules.util.numpy_support import numpy_to_vtk
from vtkmodules.vtkCommonCore import vtkPoints
from vtkmodules.vtkCommonDataModel import vtkCellArray, vtkPolyData
from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter

# Standard atomic weights (IUPAC, conventional values) and atomic numbers of the elements present.
ELEMENTS = {
    "H": (1.008, 1),
    "C": (12.011, 6),
    "N": (14.007, 7),
    "O": (15.999, 8),
    "P": (30.974, 15),
}

DEFAULT_PDB = "/usr/lib/python3/dist-packages/openmm/app/data/POPC.pdb"


def read_pdb(path):
    xyz, element, resname, resseq = [], [], [], []
    box = None
    with open(path) as f:
        for line in f:
            if line.startswith("CRYST1"):  # the periodic box: a, b, c (angstrom) from the origin
                box = (float(line[6:15]), float(line[15:24]), float(line[24:33]))
            if not line.startswith(("ATOM  ", "HETATM")):
                continue
            xyz.append((float(line[30:38]), float(line[38:46]), float(line[46:54])))
            element.append(line[76:78].strip())
            resname.append(line[17:20].strip())
            resseq.append(int(line[22:26]))
    return np.array(xyz, dtype=np.float64), element, resname, np.array(resseq, dtype=np.int32), box


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_PDB
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "popc-membrane.vtp")
    xyz, element, resname, resseq, box = read_pdb(src)
    n = len(xyz)
    if n == 0:
        sys.exit("no ATOM/HETATM records in %s" % src)

    mass = np.array([ELEMENTS[e][0] for e in element], dtype=np.float32)
    znum = np.array([ELEMENTS[e][1] for e in element], dtype=np.int32)
    water = np.array([1.0 if r == "HOH" else 0.0 for r in resname], dtype=np.float32)

    poly = vtkPolyData()
    pts = vtkPoints()
    pts.SetDataTypeToFloat()  # the PDB has 3 decimals: float keeps every digit
    pts.SetData(numpy_to_vtk(xyz.astype(np.float32), deep=True))
    poly.SetPoints(pts)
    verts = vtkCellArray()
    for i in range(n):
        verts.InsertNextCell(1)
        verts.InsertCellPoint(i)
    poly.SetVerts(verts)

    for name, values in (("mass", mass), ("atomic_number", znum), ("water", water),
                         ("residue", resseq)):
        arr = numpy_to_vtk(values, deep=True)
        arr.SetName(name)
        poly.GetPointData().AddArray(arr)

    # The periodic box as field data, where Point Neighborhood's Periodic option finds it.
    if box is not None:
        for name, values in (("BoxOrigin", (0.0, 0.0, 0.0)), ("BoxLengths", box)):
            arr = numpy_to_vtk(np.array(values, dtype=np.float64), deep=True)
            arr.SetName(name)
            poly.GetFieldData().AddArray(arr)

    writer = vtkXMLPolyDataWriter()
    writer.SetFileName(out)
    writer.SetInputData(poly)
    writer.SetDataModeToBinary()
    writer.SetCompressorTypeToZLib()
    if not writer.Write():
        sys.exit("could not write %s" % out)
    print("%s: %d points (%d water atoms), bounds %s" % (
        out, n, int(water.sum()), np.round([xyz.min(0), xyz.max(0)], 3).tolist()))


if __name__ == "__main__":
    main()
