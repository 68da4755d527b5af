"""Fills the kernel cache with what test_elastic_buffer.py launches.

Runs where the compiler is (tools/device/prepare.sh, EPIC_CACHE_DIR set): the
GPU machine has no LLVM/MLIR, so every configuration the Python API tests
use is compiled here, through the same epic._C.Runtime the ElasticBuffer
asks. The set covers every variant of the tests' configurations.
"""

import itertools
import sys
import time

import epic._C as C

H, TMAX, K = 512, 96, 6
LAYOUTS = [("bf16", False, 1, 0), ("f8E4M3FN", True, 128, H // 128), ("bf16", True, 4, 0),
           ("f8E4M3FN", False, 1, H // 128)]


def configs(ranks):
    for dtype, expand, alignment, packs in LAYOUTS:
        spec = dict(num_ranks=ranks, num_experts=8 * ranks, num_topk=K, hidden=H, dtype=dtype,
                    num_scale_packs=packs, expert_alignment=alignment, do_expand=expand,
                    num_max_tokens_per_rank=TMAX)
        for zero_padding in ([False, True] if expand else [False]):
            for weights, cached in ((False, False), (True, False), (False, True)):
                yield (spec, dict(weights=weights, cached=cached, zero_padding=zero_padding),
                       "dispatch")
        for weights, biases in itertools.product([False, True], [0, 1, 2]):
            yield spec, dict(weights=weights, biases=biases), "combine"


def ragged_configs(ranks):
    """test_ragged_hidden_round_trip_and_kernel_times: hidden 1032, bf16, plain and expanded."""
    for expand in (False, True):
        spec = dict(num_ranks=ranks, num_experts=8 * ranks, num_topk=K, hidden=1032,
                    dtype="bf16", num_scale_packs=0, expert_alignment=1, do_expand=expand,
                    num_max_tokens_per_rank=TMAX)
        yield spec, dict(weights=True, cached=False, zero_padding=False), "dispatch"
        yield spec, dict(weights=False, cached=True, zero_padding=False), "dispatch"
        yield spec, dict(weights=True, biases=0), "combine"


def window_configs(ranks):
    """test_window_outputs_*: FP8 plain and expanded (alignment 128, zero padding), outputs in
    the window: dispatches with and without weights, the combine reading x in place."""
    for expand in (False, True):
        spec = dict(num_ranks=ranks, num_experts=8 * ranks, num_topk=K, hidden=H,
                    dtype="f8E4M3FN", num_scale_packs=H // 128,
                    expert_alignment=128 if expand else 1, do_expand=expand,
                    num_max_tokens_per_rank=TMAX)
        for weights in (True, False):
            yield spec, dict(weights=weights, cached=False, zero_padding=expand,
                             window_outputs=True), "dispatch"
        yield spec, dict(weights=True, biases=0, window_outputs=True), "combine"


def two_node_configs():
    """test_two_nodes_*: 2 nodes x 2 GPUs, BF16 plain (hybrid: also a combine without weights,
    test_two_nodes_hybrid_deterministic_rows_in_reference_order's)."""
    for hybrid in (False, True):
        spec = dict(num_ranks=4, num_experts=32, num_topk=K, hidden=H, dtype="bf16",
                    num_scale_packs=0, expert_alignment=1, do_expand=False,
                    num_max_tokens_per_rank=TMAX, num_scaleup_ranks=2, hybrid=hybrid)
        yield spec, dict(weights=True, cached=False, zero_padding=False), "dispatch"
        yield spec, dict(weights=True, biases=0), "combine"
        if hybrid:
            yield spec, dict(weights=False, biases=0), "combine"


def main():
    runtime = C.Runtime("virtual", "", "")
    start, count = time.time(), 0
    for ranks in (2, 8):
        for spec, variant, kind in itertools.chain(configs(ranks), ragged_configs(ranks),
                                                   window_configs(ranks)):
            runtime.kernels(spec, variant, kind)
            count += 1
    for spec, variant, kind in two_node_configs():
        runtime.kernels(spec, variant, kind)
        count += 1
    # The world of 8 that stages rows in the window (the kernels processes run).
    staged = C.Runtime("virtual", "", "", staged=True)
    for spec, variant, kind in itertools.chain(configs(8), ragged_configs(8)):
        staged.kernels(spec, variant, kind)
        count += 1
    print(f"prepare_buffer_kernels: {count} kernel sets in {runtime.cache_dir} "
          f"({time.time() - start:.1f} s)")


if __name__ == "__main__":
    sys.exit(main())
