"""epic.deep_ep without a GPU: DeepEP's names and signatures, the environment variables (each
in a fresh interpreter: the module reads them on import), and what is refused by name."""

import inspect
import os
import subprocess
import sys

import pytest

import epic
import epic.deep_ep as deep_ep
from epic import _deepep_env

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(HERE, "..", "..", "python")

# DeepEP V2's module-level names (deep_ep/__init__.py), V1's Buffer and Config included.
DEEPEP_NAMES = ["ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "topk_idx_t",
                "get_physical_domain_size", "get_logical_domain_size", "Buffer", "Config"]
# Every EP_* variable DeepEP V2 reads (its README and sources).
DEEPEP_VARIABLES = ["EP_BUFFER_DEBUG", "EP_SUPPRESS_NCCL_CHECK", "EP_AVOID_RECORD_STREAM",
                    "EP_NUM_TOPK_IDX_BITS", "EP_NIC_NAME", "EP_OVERRIDE_RDMA_SL", "EP_DISABLE_GIN",
                    "EP_REUSE_NCCL_COMM", "EP_NUM_MAX_LOCAL_RANKS", "EP_JIT_DEBUG",
                    "EP_JIT_CACHE_DIR", "EP_JIT_NVCC_COMPILER", "EP_JIT_CPP_STANDARD",
                    "EP_JIT_PRINT_COMPILER_COMMAND", "EP_JIT_PTXAS_VERBOSE", "EP_JIT_PTXAS_CHECK",
                    "EP_JIT_WITH_LINEINFO", "EP_JIT_DUMP_ASM", "EP_JIT_DUMP_PTX",
                    "EP_JIT_DUMP_SASS", "EP_GIN_GDAKI_DEBUG"]


def run(code, **env):
    """`code` in a fresh interpreter with `env` added; (returncode, stdout, stderr)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("EP_", "EPIC_CACHE"))}
    full.update(env, PYTHONPATH=PYTHON)
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_deepeps_names_are_there():
    for name in DEEPEP_NAMES:
        assert name in dir(deep_ep), name
    assert issubclass(deep_ep.ElasticBuffer, epic.ElasticBuffer)
    assert deep_ep.__version__.startswith("2.1.0+epic")
    assert inspect.signature(deep_ep.ElasticBuffer.__init__) == \
        inspect.signature(epic.ElasticBuffer.__init__)


def test_v1_buffer_and_config():
    """DeepEP V1's normal-mode Buffer: its signatures, its static configs, what it refuses."""
    params = list(inspect.signature(deep_ep.Buffer.__init__).parameters)
    assert params[:5] == ["self", "group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode"]
    dispatch = list(inspect.signature(deep_ep.Buffer.dispatch).parameters)
    assert dispatch == ["self", "x", "handle", "num_tokens_per_rank", "num_tokens_per_rdma_rank",
                        "is_token_in_rank", "num_tokens_per_expert", "topk_idx", "topk_weights",
                        "expert_alignment", "num_worst_tokens", "config", "previous_event",
                        "async_finish", "allocate_on_comm_stream"]
    combine = list(inspect.signature(deep_ep.Buffer.combine).parameters)
    assert combine == ["self", "x", "handle", "topk_weights", "bias", "config", "previous_event",
                       "async_finish", "allocate_on_comm_stream"]
    deep_ep.Buffer.set_num_sms(24)
    assert deep_ep.Buffer.get_dispatch_config(8).num_sms == 24
    assert deep_ep.Buffer.get_combine_config(8).num_sms == 24
    deep_ep.Buffer.set_num_sms(20)
    with pytest.raises(ValueError, match="num_sms: must be >= 1"):
        deep_ep.Config(0)
    # Low-latency mode: DeepEP V1's signatures (test_v1_low_latency_api.py has the rest).
    assert list(inspect.signature(deep_ep.Buffer.low_latency_dispatch).parameters) == [
        "self", "x", "topk_idx", "num_max_dispatch_tokens_per_rank", "num_experts",
        "cumulative_local_expert_recv_stats", "dispatch_wait_recv_cost_stats", "use_fp8",
        "round_scale", "use_ue8m0", "async_finish", "return_recv_hook"]
    assert list(inspect.signature(deep_ep.Buffer.low_latency_combine).parameters) == [
        "self", "x", "topk_idx", "topk_weights", "handle", "use_logfmt", "zero_copy",
        "async_finish", "return_recv_hook", "out", "combine_wait_recv_cost_stats"]
    assert deep_ep.Buffer.is_sm90_compiled() is True
    for name in ("capture", "get_local_buffer_tensor", "get_low_latency_rdma_size_hint",
                 "clean_low_latency_buffer",
                 "get_next_low_latency_combine_buffer", "low_latency_update_mask_buffer",
                 "low_latency_query_mask_buffer", "low_latency_clean_mask_buffer"):
        assert callable(getattr(deep_ep.Buffer, name)), name
    with pytest.raises(ValueError, match="the buffer needs bytes"):
        deep_ep.Buffer(epic.VirtualWorld(2))
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        deep_ep.Nothing  # noqa: B018


def test_every_deepep_variable_has_a_status():
    assert sorted(_deepep_env.VARIABLES) == sorted(DEEPEP_VARIABLES)
    for name, (status, what) in _deepep_env.VARIABLES.items():
        assert status in ("honoured", "not applicable") and what, name


def test_the_cache_directory_and_communicator_reuse_become_epics():
    code = "import os, epic.deep_ep; print(os.environ['EPIC_CACHE_DIR'], " \
           "os.environ['EPIC_REUSE_NCCL_COMM'])"
    rc, out, err = run(code, EP_JIT_CACHE_DIR="/tmp/ep-cache", EP_REUSE_NCCL_COMM="0")
    assert rc == 0, err
    assert out.split() == ["/tmp/ep-cache", "0"]
    # epic's own setting wins.
    rc, out, err = run("import os, epic.deep_ep; print(os.environ['EPIC_CACHE_DIR'])",
                       EP_JIT_CACHE_DIR="/tmp/ep-cache", EPIC_CACHE_DIR="/tmp/epic-cache")
    assert rc == 0 and out.strip() == "/tmp/epic-cache", err


def test_variables_that_do_not_apply_are_named_once():
    rc, out, err = run("import epic.deep_ep", EP_NIC_NAME="mlx5_1", EP_DISABLE_GIN="1")
    assert rc == 0, err
    assert err.count("do not apply to epic") == 1
    assert "EP_DISABLE_GIN (" in err and "EP_NIC_NAME (" in err
    rc, out, err = run("import epic.deep_ep")
    assert rc == 0 and "do not apply" not in err


def test_topk_idx_bits():
    rc, out, err = run("import epic._deepep_env as e; print(e.topk_idx_bits())",
                       EP_NUM_TOPK_IDX_BITS="32")
    assert rc == 0 and out.strip() == "32", err
    rc, out, err = run("import epic.deep_ep", EP_NUM_TOPK_IDX_BITS="12")
    assert rc != 0 and "EP_NUM_TOPK_IDX_BITS='12': top-k ids are 8, 16, 32 or 64-bit" in err


def test_flags_read_the_environment(monkeypatch):
    for name, flag in (("EP_AVOID_RECORD_STREAM", _deepep_env.avoid_record_stream),
                       ("EP_BUFFER_DEBUG", _deepep_env.buffer_debug),
                       ("EP_JIT_DUMP_PTX", _deepep_env.dump_ptx),
                       ("EP_JIT_DUMP_SASS", _deepep_env.dump_sass)):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv("EP_JIT_DUMP_ASM", raising=False)
        assert not flag(), name
        monkeypatch.setenv(name, "1")
        assert flag(), name
        monkeypatch.setenv(name, "0")
        assert not flag(), name
    monkeypatch.setenv("EP_JIT_DUMP_ASM", "1")
    assert _deepep_env.dump_ptx() and _deepep_env.dump_sass()
