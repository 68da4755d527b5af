"""ElasticBuffer's AGRS and PP APIs without a GPU: DeepEP's size formulas (and epic's window on
top), and the arguments refused by name before anything runs. The sessions and channels
themselves run on the GPU (test/gpu/test_agrs.py, test_pp.py, collectives_distributed.py)."""

import numpy as np
import pytest

import epic
from epic import _C
from epic import reference as ref

BF16 = np.dtype("float16")  # any dtype with itemsize 2 (a torch.dtype on a GPU machine)


def test_session_bytes_follow_deepeps_formula():
    world = epic.VirtualWorld(8)
    # DeepEP's test_agrs.py: (32, 64, 2048) bf16 on 8 ranks is 64 MiB.
    assert epic.ElasticBuffer.get_agrs_num_max_session_bytes(world, (32, 64, 2048), BF16) == \
        64 << 20
    # Each gathered tensor 32-byte aligned: 8 x 3 x 2 = 48 -> 64, 8 x 5 x 2 = 80 -> 96.
    assert epic.ElasticBuffer.get_agrs_num_max_session_bytes(world, [(3,), (5,)], BF16) == 160
    assert epic.ElasticBuffer.get_agrs_num_max_session_bytes(world, [(3,), (5,)], BF16) == \
        ref.agrs_num_max_session_bytes(8, [(3,), (5,)], 2)


def test_buffer_hint_adds_the_window_control_region():
    world = epic.VirtualWorld(8)
    offset = _C.Buffer.AGRS_DATA_OFFSET
    assert offset > 0 and offset % 4096 == 0
    assert epic.ElasticBuffer.get_agrs_buffer_size_hint(world, 64 << 20) == (64 << 20) + (2 << 20)
    assert epic.ElasticBuffer.get_agrs_buffer_size_hint(world, (2 << 20) - offset) == 2 << 20
    assert epic.ElasticBuffer.get_agrs_buffer_size_hint(world, (2 << 20) - offset + 1) == 4 << 20


def test_bad_arguments_are_named():
    world = epic.VirtualWorld(4)
    with pytest.raises(TypeError, match="dtype: expected a torch.dtype"):
        epic.ElasticBuffer.get_agrs_num_max_session_bytes(world, (3,), float)
    with pytest.raises(TypeError, match=r"shapes\[1\]: expected a shape"):
        epic.ElasticBuffer.get_agrs_num_max_session_bytes(world, [(3,), (-1,)], BF16)
    with pytest.raises(ValueError, match="num_max_session_bytes: must be a positive int"):
        epic.ElasticBuffer.get_agrs_buffer_size_hint(world, 0)
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        epic.ElasticBuffer.get_agrs_buffer_size_hint(object(), 1 << 20)
    buffer = epic.ElasticBuffer(world, num_bytes=4 << 20)
    with pytest.raises(TypeError, match="one entry per rank"):
        buffer.all_gather([np.ones(3)] * 3)
    with pytest.raises(TypeError, match=r"t\[0\]: expected a torch.Tensor, got ndarray"):
        buffer.all_gather([np.ones(3)] * 4)
    with pytest.raises(TypeError, match=r"t\[0\]\[0\]: expected a torch.Tensor, got str"):
        buffer.all_gather([["x"], ["x"], [1], [2]])
    with pytest.raises(TypeError, match="enabled: expected a bool"):
        with buffer.agrs_new_session(enabled=1):
            pass
    with pytest.raises(TypeError, match="num_max_all_gathers_per_session: expected an int"):
        buffer.agrs_set_config(1 << 20, 2.0)


def test_pp_buffer_hint_holds_the_slots_after_the_control_region():
    offset = _C.Buffer.AGRS_DATA_OFFSET
    # DeepEP's test_pp.py: 4096 x 7168 bf16, 4 in flight; epic keeps slots from both neighbours.
    tensor = 4096 * 7168 * 2
    assert _C.Buffer.pp_region_bytes(tensor, 4) == 2 * 4 * tensor
    hint = epic.ElasticBuffer.get_pp_buffer_size_hint(tensor, 4)
    assert hint % (2 << 20) == 0 and hint >= offset + 8 * tensor
    assert hint - (2 << 20) < offset + 8 * tensor
    # Slots are 32-byte aligned.
    assert _C.Buffer.pp_region_bytes(33, 1) == 2 * 64
    with pytest.raises(ValueError, match="num_max_inflight_tensors: must be >= 1"):
        epic.ElasticBuffer.get_pp_buffer_size_hint(1024, 0)
    with pytest.raises(TypeError, match="num_max_tensor_bytes: expected an int"):
        epic.ElasticBuffer.get_pp_buffer_size_hint(1.5, 2)
    buffer = epic.ElasticBuffer(epic.VirtualWorld(2), num_bytes=4 << 20)
    with pytest.raises(TypeError, match="one tensor \\(or None\\) per rank"):
        buffer.pp_send([np.ones(3)], [1, 0])
    with pytest.raises(ValueError, match="num_sms: must be >= 0"):
        buffer.pp_recv([None, None], [1, 0], num_sms=-1)
