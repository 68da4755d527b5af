"""Make ``epic`` importable when running ``pytest test/python`` from the repo root.

If the package is installed (``pip install -e python/``) that copy is used;
otherwise the source tree ``python/`` is put on ``sys.path``.
"""

import importlib.util
import pathlib
import sys

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[2] / "python"

if importlib.util.find_spec("epic") is None:
    sys.path.insert(0, str(PYTHON_DIR))
