#!/usr/bin/env python3
"""Sets a headline run (figure,median_ms) beside the committed figures and the end-to-end issue's
targets. Every figure more than 10% slower than its committed value is marked.

    compare_headline.py MEASURED.csv [COMMITTED.csv]

COMMITTED defaults to headline-H100.csv beside this script. Prints a Markdown table (paste it into
a closing note) and exits 0; the last line counts the marked figures.
"""
import csv
import os
import sys

SLOWER = 1.10


def read(path):
    with open(path, newline="") as f:
        return {row["figure"]: float(row["median_ms"]) for row in csv.DictReader(f) if row.get("figure")}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    measured = read(sys.argv[1])
    committed_path = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(__file__), "headline-H100.csv")
    committed = read(committed_path) if os.path.exists(committed_path) else {}

    marked = 0
    print("| figure | committed ms | measured ms | measured / committed | |")
    print("|---|---|---|---|---|")
    for name in list(committed) + [n for n in measured if n not in committed]:
        old, new = committed.get(name), measured.get(name)
        ratio = new / old if old and new is not None else None
        mark = ""
        if new is None:
            mark = "not measured"
        elif ratio is not None and ratio > SLOWER:
            mark = "**more than 10% slower**"
            marked += 1
        fmt = lambda v: "" if v is None else f"{v:.3f}"
        print(f"| {name} | {fmt(old)} | {fmt(new)} | {'' if ratio is None else f'{ratio:.2f}'} | {mark} |")

    # The end-to-end issue's targets, from this run alone.
    def get(name):
        return measured.get(name)

    targets = [
        ("filter / engine end to end, 4M", get("filter_4M_e2e"), get("filter_engine_4M_e2e"), "ratio", 1.15),
        ("engine end to end - device-resident, 4M (ms)", get("engine_4M_e2e"), get("engine_4M_device"), "difference", 2.0),
        ("periodic / open end to end, 4M", get("periodic_4M_e2e"), get("engine_4M_e2e"), "ratio", 1.25),
        ("64M end to end / device-resident", get("engine_64M_e2e"), get("engine_64M_device"), "ratio", 1.4),
        ("1e9 end to end / device-resident", get("engine_1e9_e2e"), get("engine_1e9_device"), "ratio", 1.4),
    ]
    print()
    print("| target | this run | limit | |")
    print("|---|---|---|---|")
    for label, a, b, kind, limit in targets:
        if a is None or b is None:
            print(f"| {label} | not measured | {limit} | |")
            continue
        value = a / b if kind == "ratio" else a - b
        print(f"| {label} | {value:.2f} | {limit} | {'met' if value <= limit else 'missed'} |")
    print()
    print(f"{marked} figure(s) more than 10% slower than {os.path.basename(committed_path)}")


if __name__ == "__main__":
    main()
