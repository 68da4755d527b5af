"""tools/fuzz.py's judgement: what counts as a crash of a driver (the fuzzer itself runs in CI
from .ci/run with a time budget)."""

import pathlib
import random
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
import fuzz  # noqa: E402


def answer(returncode, stderr=b""):
    return subprocess.CompletedProcess([], returncode, b"", stderr)


def test_a_diagnostic_is_an_answer_and_a_signal_or_an_assertion_a_crash():
    assert not fuzz.crashed(answer(0))
    assert not fuzz.crashed(answer(1, b"<stdin>:3:5: error: 'ep.dispatch' op ..."))
    assert fuzz.crashed(answer(-11))  # SIGSEGV
    assert fuzz.crashed(answer(134))  # abort through a shell
    assert fuzz.crashed(answer(1, b"epic-opt: Assertion `x' failed."))
    assert fuzz.crashed(answer(1, b"LLVM ERROR: out of memory"))


def test_mutations_change_the_input_and_are_reproducible():
    case = "#c = #ep.config<ranks = 8, experts = 64, topk = 2, hidden = 128, dtype = bf16>\n"
    tokens = fuzz.TOKEN.findall(case)
    first = [fuzz.mutate_ir(random.Random(5), case, tokens) for _ in range(3)]
    again = [fuzz.mutate_ir(random.Random(5), case, tokens) for _ in range(3)]
    assert first == again and any(m != case for m in first)
