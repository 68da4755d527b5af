"""ElasticBuffer.get_dispatch_layout on the H200 (the kernels of ep.dispatch_layout) against
epic.reference.dispatch_layout, on virtual worlds: exact counts and flags.

Run by tools/device/run.sh; the kernels come from the cache tools/device/prepare.sh fills
(`python test/gpu/test_dispatch_layout.py --prepare` there).
"""

import sys

import pytest

# (ranks, experts, top-k, token counts per rank)
CONFIGS = [(8, 64, 6, [96, 0, 17, 64, 1, 96, 33, 50]), (2, 4, 2, [5, 3]), (4, 256, 8, [7] * 4)]
TMAX = 96


def prepare():
    """Compiles every kernel this file launches into $EPIC_CACHE_DIR (no GPU needed)."""
    import epic._C as C

    runtime = C.Runtime("virtual", "", "")
    for ranks, experts, topk, _ in CONFIGS:
        spec = dict(num_ranks=ranks, num_experts=experts, num_topk=topk, hidden=128,
                    dtype="bf16", num_scale_packs=0, expert_alignment=1, do_expand=False,
                    num_max_tokens_per_rank=TMAX)
        for bits in (32, 64):
            runtime.kernels(spec, dict(topk_idx_bits=bits), "dispatch_layout")
    print(f"test_dispatch_layout: {2 * len(CONFIGS)} kernel sets in {runtime.cache_dir}")


if __name__ == "__main__" and "--prepare" in sys.argv:
    sys.exit(prepare())

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

import epic  # noqa: E402
from epic import reference as ref  # noqa: E402


@pytest.mark.parametrize("ranks, experts, topk, tokens", CONFIGS)
@pytest.mark.parametrize("idx_dtype", ["int64", "int32"])
def test_layout_equals_the_reference(ranks, experts, topk, tokens, idx_dtype):
    g = torch.Generator(device="cuda").manual_seed(ranks * 7 + topk)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(ranks), num_max_tokens_per_rank=TMAX,
                                hidden=128, num_topk=topk, explicitly_destroy=True)
    idxs = []
    for t in tokens:
        idx = torch.rand((t, experts), generator=g, device="cuda").topk(topk).indices
        idx[torch.rand((t, topk), generator=g, device="cuda") < 0.15] = -1  # masked slots
        idxs.append(idx.to(getattr(torch, idx_dtype)))
    per_rank, rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(idxs, experts)
    torch.cuda.synchronize()
    assert rdma is None
    for r in range(ranks):
        want = ref.dispatch_layout(idxs[r].cpu().numpy().astype("int64"), experts, ranks)
        assert per_rank[r].tolist() == want[0].tolist(), f"rank {r}: num_tokens_per_rank"
        assert per_expert[r].tolist() == want[1].tolist(), f"rank {r}: num_tokens_per_expert"
        assert in_rank[r].dtype == torch.bool
        assert in_rank[r].cpu().tolist() == want[2].tolist(), f"rank {r}: is_token_in_rank"
    # Again, on the communication stream after an event: the same answer.
    event = buffer.capture()
    per_rank2, _, per_expert2, in_rank2, done = buffer.get_dispatch_layout(
        idxs, experts, previous_event=event, async_finish=True)
    done.current_stream_wait()
    torch.cuda.synchronize()
    for r in range(ranks):
        assert torch.equal(per_rank2[r], per_rank[r]) and torch.equal(per_expert2[r], per_expert[r])
        assert torch.equal(in_rank2[r], in_rank[r])
    buffer.destroy()
