"""Writes epic._limits (python/epic/_limits.py) from EPLimits.def, the one source of the bounds
of an expert-parallel configuration (run by the build; the file is not checked in).

    python3 tools/gen_limits.py <EPLimits.def> <out.py>
"""

import re
import sys

LINE = re.compile(r'^EP_LIMIT\((\w+),\s*"([^"]*)",\s*"([^"]*)",\s*(-?\d+),\s*(-?\d+)\)\s*$')


def main(source, out):
    limits = []
    with open(source) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                name, field, argument, low, high = m.groups()
                limits.append((name, field, argument, int(low), int(high)))
    if not limits:
        sys.exit(f"gen_limits: no EP_LIMIT lines in {source}")
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper() for name, *_ in limits]
    text = ['"""The bounds of an expert-parallel configuration (generated from EPLimits.def by',
            'tools/gen_limits.py at build time: edit the .def, not this file)."""', ""]
    for s, (_, field, argument, low, high) in zip(snake, limits):
        text += [f"# {field} ({argument})", f"MIN_{s} = {low}", f"MAX_{s} = {high}"]
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
