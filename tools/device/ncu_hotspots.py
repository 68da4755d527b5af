"""The SASS lines where a kernel's warps stall most, from an Nsight Compute report's source
page (``ncu -i REPORT --page source --csv --print-source sass > FILE``): per kernel the top
lines by warp-stall samples, with their share and instruction.

    python3 tools/device/ncu_hotspots.py FILE [--top 25]
"""

import argparse
import csv
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--listing", help="also write every line (samples, address, "
                        "instruction) in program order to this file")
    args = parser.parse_args()
    kernel, rows, tables = None, [], []
    with open(args.csv, newline="") as f:
        for line in f:
            # One table per kernel, each after a line "Kernel Name","<name>".
            if line.startswith('"Kernel Name"') or not line.startswith('"'):
                if rows:
                    tables.append((kernel, rows))
                fields = next(csv.reader([line])) if line.strip() else []
                kernel, rows = (fields[1] if len(fields) > 1 else line.strip()), []
                continue
            rows.append(line)
    if rows:
        tables.append((kernel, rows))
    listing = open(args.listing, "w") if args.listing else None
    for kernel, lines in tables:
        reader = csv.DictReader(lines)
        stall = next((c for c in reader.fieldnames or []
                      if c.startswith("Warp Stall Sampling (All")), None)
        if stall is None:
            print(f"{kernel}: no warp-stall samples column ({reader.fieldnames})")
            continue
        entries = []
        for row in reader:
            try:
                entries.append((float(row[stall] or 0), row.get("Address", ""),
                                row.get("Source", "")))
            except ValueError:
                continue
        total = sum(e[0] for e in entries) or 1.0
        if listing:
            listing.write(f"== {kernel}\n")
            for samples, address, source in entries:
                listing.write(f"{int(samples):6d} {address:>8}  {source}\n")
        print(f"== {kernel}: {int(total)} samples")
        for samples, address, source in sorted(entries, reverse=True)[:args.top]:
            print(f"{100 * samples / total:6.2f}%  {address:>8}  {source}")
    if listing:
        listing.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
