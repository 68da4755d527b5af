"""Every module of the epic package imports on its own, first, in a fresh interpreter: a
circular import between the call modules (buffer imports _combine/_dispatch/_layout, which
import buffer) shows only when a module other than epic's usual first one is imported first."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import epic

MODULES = sorted(
    f"epic.{m.name}" for m in pkgutil.walk_packages([str(Path(epic.__file__).parent)])
    if not m.name.startswith("_C") and not m.name.startswith("_ir")
    and not m.name.endswith("__main__"))


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_first(module):
    run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                         text=True, timeout=120)
    if run.returncode and "No module named 'torch'" in run.stderr:
        pytest.skip(f"{module} needs PyTorch, which this machine lacks")
    assert run.returncode == 0, run.stderr[-2000:]
