#!/usr/bin/env python3
"""Markdown tables for RESULTS.md from a benchmark CSV (NeighborGridBenchmark --csv=...).

    python3 Testing/Benchmarks/make_tables.py Testing/Benchmarks/results-H100.csv

Prints, per paper table, our medians (ms, device-resident) with our ratios beside the papers'
(their GTX 1080 Ti column): FENNS/Hoetzlein and FENNS/Green for the FENNS tables, CLAWS/FENNS and
CLAWS/Hoetzlein for the CLAWS tables. Hoetzlein is our 'Counting Sort', Green our 'Radix Sort'.
Also checks Auto against the fastest method of every row.
"""
import csv
import sys
from collections import OrderedDict

# The papers' medians on the GTX 1080 Ti, ms: (Hoetzlein, Green, FENNS) per (n, r).
FENNS_PAPER = {
    "FENNS-T1": {
        (1024, 0.2): (62.84, 3.64, 0.41), (1024, 0.5): (4.20, 1.88, 0.48), (1024, 0.8): (1.15, 1.89, 0.51),
        (1024, 1.0): (0.73, 1.48, 0.51), (8192, 0.2): (65.28, 3.88, 1.18), (8192, 0.5): (4.40, 1.92, 1.18),
        (8192, 0.8): (1.31, 1.94, 1.28), (8192, 1.0): (0.77, 1.63, 1.29), (65536, 0.2): (64.77, 5.20, 1.78),
        (65536, 0.5): (4.70, 2.49, 1.92), (65536, 0.8): (1.38, 1.81, 1.97), (65536, 1.0): (0.76, 1.99, 1.99),
        (524288, 0.2): (71.02, 13.82, 3.16), (524288, 0.5): (7.61, 4.52, 3.52), (524288, 0.8): (4.00, 3.29, 4.16),
        (524288, 1.0): (3.47, 3.25, 4.39), (4194304, 0.2): (90.21, 41.12, 17.16), (4194304, 0.5): (29.13, 26.27, 24.47),
        (4194304, 0.8): (27.97, 29.55, 31.22), (4194304, 1.0): (27.13, 29.25, 35.29)},
    "FENNS-T2": {
        (1024, 0.2): (0.18, 1.14, 0.52), (1024, 0.5): (0.25, 0.96, 0.57), (1024, 0.8): (0.24, 1.69, 0.62),
        (1024, 1.0): (0.26, 1.09, 0.60), (8192, 0.2): (0.23, 1.62, 1.10), (8192, 0.5): (0.23, 1.00, 1.12),
        (8192, 0.8): (0.24, 1.42, 1.50), (8192, 1.0): (0.23, 1.05, 1.25), (65536, 0.2): (0.51, 1.41, 1.76),
        (65536, 0.5): (0.48, 1.55, 1.89), (65536, 0.8): (0.52, 1.63, 1.94), (65536, 1.0): (0.52, 1.42, 1.96),
        (524288, 0.2): (7.45, 8.33, 3.14), (524288, 0.5): (7.47, 8.35, 3.52), (524288, 0.8): (7.48, 8.40, 4.18),
        (524288, 1.0): (7.50, 8.40, 4.39), (4194304, 0.2): (419.90, 426.09, 17.28),
        (4194304, 0.5): (418.28, 426.14, 24.86), (4194304, 0.8): (418.28, 426.26, 31.53),
        (4194304, 1.0): (418.79, 426.23, 35.67)},
    "FENNS-T3": {
        (1024, 0.3): (148.72, 6.24, 0.47), (1024, 0.5): (32.19, 2.59, 0.52), (1024, 0.8): (7.92, 1.29, 0.46),
        (1024, 1.0): (4.13, 1.66, 0.49), (8192, 0.3): (152.71, 6.37, 1.10), (8192, 0.5): (33.43, 0.09, 1.77),
        (8192, 0.8): (8.25, 1.74, 1.22), (8192, 1.0): (4.27, 1.70, 1.23), (65536, 0.3): (154.82, 8.07, 1.75),
        (65536, 0.5): (33.98, 4.28, 1.83), (65536, 0.8): (8.89, 2.98, 1.90), (65536, 1.0): (4.72, 2.48, 1.91),
        (524288, 0.3): (160.10, 18.52, 3.12), (524288, 0.5): (38.11, 10.47, 3.20), (524288, 0.8): (11.27, 5.51, 3.31),
        (524288, 1.0): (7.07, 4.49, 3.49), (4194304, 0.3): (186.09, 55.21, 15.57),
        (4194304, 0.5): (58.60, 30.20, 18.03), (4194304, 0.8): (32.70, 26.22, 21.62),
        (4194304, 1.0): (29.00, 26.43, 23.87)},
}
# (Hoetzlein, FENNS, CLAWS) per (scene, n, r).
CLAWS_PAPER = {
    (60, 1048576, 1.0): (7.92, 10.72, 11.07), (60, 8388608, 0.5): (76.46, 137.24, 82.94),
    (90, 1048576, 1.5): (7.75, 11.55, 11.67), (90, 8388608, 0.75): (71.18, 125.79, 77.14),
    (120, 8388608, 1.0): (68.4, 126.71, 75.96), (150, 8388608, 1.25): (67.66, 123.2, 72.3),
    (180, 8388608, 1.5): (66.81, 120.9, 69.01), (90, 2097152, 1.5): (28.24, 25.18, 23.98),
    (90, 4194304, 1.5): (115.49, 66.16, 49.61), (90, 8388608, 1.5): (445.24, 269.43, 174.02),
}


def load(path):
    rows = OrderedDict()
    for r in csv.DictReader(open(path)):
        key = (r["table"], int(r["n"]), float(r["scene"]), float(r["radius"]))
        entry = rows.setdefault(key, {"avg": float(r["avg_neighbors"]), "ms": OrderedDict(), "bytes": {}})
        entry["ms"][r["method"]] = float(r["median_ms"])
        entry["bytes"][r["method"]] = int(r["extra_device_bytes"])
    return rows


def fmt(x):
    return "—" if x is None else ("%.3f" % x if x < 10 else "%.1f" % x)


def ratio(a, b):
    return "—" if a is None or b is None or b == 0 else "%.2f" % (a / b)


def main():
    rows = load(sys.argv[1])
    methods = ["Counting Sort", "Radix Sort", "FENNS", "CLAWS", "Bayraktar", "Auto"]
    for table in ("FENNS-T1", "FENNS-T2", "FENNS-T3"):
        print("\n#### %s\n" % table)
        print("| n | R | avg nbrs | Counting Sort | Radix Sort | FENNS | CLAWS | Bayraktar | Auto | FENNS/Hoe ours | FENNS/Hoe paper | FENNS/Green ours | FENNS/Green paper |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (t, n, scene, r), e in rows.items():
            if t != table:
                continue
            ms = e["ms"]
            hoe, green, fenns = FENNS_PAPER[table][(n, r)]
            print("| %d | %g | %.2f | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %.2f |" % (
                n, r, e["avg"], *(fmt(ms.get(m)) for m in methods),
                ratio(ms.get("FENNS"), ms.get("Counting Sort")), fenns / hoe,
                ratio(ms.get("FENNS"), ms.get("Radix Sort")), fenns / green))
    for table in ("CLAWS-T1", "CLAWS-T2"):
        print("\n#### %s\n" % table)
        print("| scene | n | R | avg nbrs | Counting Sort | Radix Sort | FENNS | CLAWS | Bayraktar | Auto | CLAWS/FENNS ours | paper | CLAWS/Hoe ours | paper |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (t, n, scene, r), e in rows.items():
            if t != table:
                continue
            ms = e["ms"]
            hoe, fenns, claws = CLAWS_PAPER[(int(scene), n, r)]
            print("| %g | %d | %g | %.2f | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %.2f |" % (
                scene, n, r, e["avg"], *(fmt(ms.get(m)) for m in methods),
                ratio(ms.get("CLAWS"), ms.get("FENNS")), claws / fenns,
                ratio(ms.get("CLAWS"), ms.get("Counting Sort")), claws / hoe))
    print("\n#### The 4M density row (scene 90, R = 1.5), with CLAWS's ideas switched off in turn\n")
    print("| method | median ms | extra device bytes | bytes per point |")
    print("|---|---|---|---|")
    for (t, n, scene, r), e in rows.items():
        if t != "4M-density":
            continue
        for m, v in e["ms"].items():
            b = e["bytes"][m]
            print("| %s | %s | %d | %.1f |" % (m, fmt(v), b, b / n))
    print("\n#### Auto against the fastest method of each row\n")
    worst = []
    for key, e in rows.items():
        ms = {m: v for m, v in e["ms"].items() if " without " not in m}
        best_method = min((v, m) for m, v in ms.items() if m != "Auto")
        worst.append((ms["Auto"] / best_method[0], key, best_method[1]))
    worst.sort(reverse=True)
    over = [w for w in worst if w[0] > 1.10]
    print("%d rows; Auto within 10%% of the fastest on %d; the five largest ratios:\n" % (len(worst), len(worst) - len(over)))
    for w, key, m in worst[:5]:
        print("- %s n=%d scene %g R=%g: Auto/fastest %.3f (fastest %s)" % (key[0], key[1], key[2], key[3], w, m))


if __name__ == "__main__":
    main()
