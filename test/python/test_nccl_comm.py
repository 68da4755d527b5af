"""Which NCCL communicator a torch.distributed ElasticBuffer runs on (epic._nccl), without a GPU
or torch: PyTorch's is split only when torch's NCCL is exactly the NCCL epic loaded, and every
other case says why epic makes its own."""

import sys
import types

import pytest

from epic import _nccl

EPIC = 22809  # the NCCL_VERSION_CODE epic loaded in these tests


def test_version_codes_of_both_encodings():
    assert _nccl.version_triple(22809) == (2, 28, 9)
    assert _nccl.version_triple(23007) == (2, 30, 7)
    assert _nccl.version_triple(2708) == (2, 7, 8)  # NCCL_VERSION below 2.9


@pytest.mark.parametrize("torch_version", [(2, 28, 7), (2, 27, 9), (2, 29, 9), (3, 28, 9)])
def test_any_other_release_is_refused_by_name(torch_version):
    reason = _nccl.torch_nccl_mismatch(torch_version, EPIC)
    assert reason is not None
    assert f"torch's NCCL is {'.'.join(map(str, torch_version))} but epic's is 2.28.9" in reason


def test_the_same_release_is_accepted():
    assert _nccl.torch_nccl_mismatch((2, 28, 9), EPIC) is None


def test_no_torch_nccl_is_refused():
    assert "torch reports no NCCL version" in _nccl.torch_nccl_mismatch(None, EPIC)


def _fake_torch(nccl_version, comm_ptr=0x1234):
    """torch and torch.distributed as far as epic._nccl uses them; records the calls."""
    calls = []
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")

    class Tensor:
        def __init__(self, values):
            self.values = values

        def item(self):
            return self.values[0]

    def version():
        if isinstance(nccl_version, Exception):
            raise nccl_version
        return nccl_version

    torch.cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=version),
                                       current_device=lambda: 0)
    torch.device = lambda *args: args
    torch.tensor = lambda values, device=None: Tensor(values)
    torch.distributed = dist
    dist.ReduceOp = types.SimpleNamespace(MIN="min")
    dist.barrier = lambda group=None: calls.append("barrier")
    dist.all_reduce = lambda tensor, op=None, group=None: calls.append(
        ("all_reduce", tensor.values))

    class Backend:
        def _comm_ptr(self):
            calls.append("comm_ptr")
            return comm_ptr

    group = types.SimpleNamespace(_get_backend=lambda device: Backend())
    return torch, dist, group, calls


class _FakeC:
    @staticmethod
    def nccl_loaded_version():
        return EPIC


@pytest.fixture
def fake_torch(monkeypatch):
    def install(*args, **kwargs):
        torch, dist, group, calls = _fake_torch(*args, **kwargs)
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
        return group, calls
    monkeypatch.delenv("EPIC_REUSE_NCCL_COMM", raising=False)
    return install


def test_the_same_release_splits_pytorchs_communicator(fake_torch):
    group, calls = fake_torch((2, 28, 9))
    assert _nccl.pytorch_comm(group, _FakeC) == (0x1234, "")
    assert "comm_ptr" in calls and ("all_reduce", [1]) in calls


@pytest.mark.parametrize("version", [(2, 28, 7), 22807, AttributeError("no nccl")])
def test_another_release_never_touches_pytorchs_communicator(fake_torch, version):
    group, calls = fake_torch(version)
    ptr, reason = _nccl.pytorch_comm(group, _FakeC)
    assert ptr == 0
    assert "comm_ptr" not in calls  # the pointer is not even asked for
    assert ("all_reduce", [0]) in calls  # every rank learns that this one makes its own
    assert "epic's is 2.28.9" in reason


def test_opting_out_says_so(fake_torch, monkeypatch):
    group, calls = fake_torch((2, 28, 9))
    monkeypatch.setenv("EPIC_REUSE_NCCL_COMM", "0")
    assert _nccl.pytorch_comm(group, _FakeC) == (0, "EPIC_REUSE_NCCL_COMM=0")
    assert "comm_ptr" not in calls
