"""Every .mlir example parses, verifies and round-trips through epic-opt."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("EPIC_BUILD_DIR", ROOT / "build"))
EPIC_OPT = BUILD / "bin" / "epic-opt"
EXAMPLES = sorted((ROOT / "examples").rglob("*.mlir"))


def epic_opt(*args, stdin=None):
    if not EPIC_OPT.exists():
        pytest.fail(f"{EPIC_OPT} not found: build epic first (./install.sh) or set EPIC_BUILD_DIR")
    return subprocess.run([str(EPIC_OPT), *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


def test_there_are_examples():
    assert EXAMPLES, "examples/ holds no .mlir file"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_round_trips(path):
    printed = epic_opt(str(path))
    assert epic_opt("-", stdin=printed) == printed


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_canonicalizes(path):
    out = epic_opt(str(path), "--canonicalize")
    assert "ep." in out or "comm." in out


def test_epic_opt_lists_the_dialects():
    out = epic_opt("--help")
    line = next(line for line in out.splitlines() if line.startswith("Available Dialects:"))
    dialects = {name.strip() for name in line.split(":", 1)[1].split(",")}
    wanted = {"ep", "comm", "gpu", "nvvm", "llvm", "vector", "scf", "memref", "arith", "func", "cf"}
    assert wanted <= dialects, f"missing: {wanted - dialects}"


def test_invalid_config_is_rejected_with_a_named_parameter():
    bad = ("#c = #ep.config<ranks = 8, experts = 100, topk = 2, hidden = 64, dtype = bf16, "
           "max_tokens_per_rank = 8>\n"
           "func.func private @f() attributes {cfg = #c}\n")
    proc = subprocess.run([str(EPIC_OPT), "-"], input=bad, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "experts (100) must be divisible by ranks (8)" in proc.stderr
