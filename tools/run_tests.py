#!/usr/bin/env python3
"""Runs every test runner of epic and prints one summary.

Runners: lit (IR tests under test/), the GoogleTest binary (test/unit) and
pytest (test/python). Each writes JUnit XML, which is counted here, so the
summary does not depend on any runner's console format. Prints a line per
runner and, last, `N passed, N failed` (with `, N skipped` when any were).
Exits non-zero if any test failed or any runner could not run.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def count_junit(path):
    """(passed, failed, skipped) of a JUnit XML file."""
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def run(name, cmd, xml, env=None):
    print(f"==> {name}: {' '.join(map(str, cmd))}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if not xml.exists():
        print(f"{name}: runner exited with {proc.returncode} and wrote no results", flush=True)
        return 0, 1, 0
    passed, failed, skipped = count_junit(xml)
    if proc.returncode != 0 and failed == 0:
        failed = 1  # the runner failed outside any test (e.g. a crash or a collection error)
    return passed, failed, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=ROOT / "build", type=Path)
    args = parser.parse_args()
    build = args.build_dir.resolve()
    if not (build / "bin" / "epic-opt").exists():
        sys.exit(f"error: {build}/bin/epic-opt not found; build first (./install.sh)")

    # Test this checkout's Python package, whichever checkout `pip install -e` last pointed at.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, EPIC_BUILD_DIR=str(build), PYTHONPATH=pythonpath)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results["lit"] = run(
            "lit", ["lit", "-sv", f"--xunit-xml-output={tmp / 'lit.xml'}", build / "test"],
            tmp / "lit.xml", env)
        gtest = [0, 0, 0]
        for binary in ("epic-unit-tests", "epic-runtime-tests"):
            xml = tmp / f"{binary}.xml"
            counts = run(binary, [build / "bin" / binary, f"--gtest_output=xml:{xml}"], xml, env)
            gtest = [g + c for g, c in zip(gtest, counts)]
        results["gtest"] = tuple(gtest)
        results["pytest"] = run(
            "pytest", [sys.executable, "-m", "pytest", "-q", "test/python",
                       f"--junitxml={tmp / 'pytest.xml'}"],
            tmp / "pytest.xml", env)

    print()
    total = [0, 0, 0]
    for name, counts in results.items():
        passed, failed, skipped = counts
        print(f"{name}: {passed} passed, {failed} failed, {skipped} skipped")
        total = [t + c for t, c in zip(total, counts)]
    line = f"{total[0]} passed, {total[1]} failed"
    if total[2]:
        line += f", {total[2]} skipped"
    print(line)
    return 1 if total[1] or total[0] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
