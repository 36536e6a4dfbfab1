# amaranth: UnusedElaboratable=no
"""The harness's parameters and geometry, and the frames the bridge refuses to queue (no simulator needed)."""

import types

import pytest

from inagg.models.geometry import SwitchGeometry
from inagg.models.job import ExceptionSpec, SwitchSpec
from inagg.testbench.bridge.bridge import FrameBridge
from inagg.testbench.bridge.build import HarnessParams
from inagg.testbench.bridge.harness import RING_DEPTH, BridgeHarness, RingGeometry, frame_slot_bytes

PARAMS = dict(ports=2, width=64, slots=16, chunk_bytes=256, jobs=2, workers=2)


@pytest.mark.parametrize("depth", [1, 3, 128, True, "8"])
def test_ring_depth_must_be_a_power_of_two_from_2_to_64(depth):
    with pytest.raises(ValueError, match=rf"^Ring depth must be a power of two from 2 to 64, not {depth!r}$"):
        BridgeHarness(**PARAMS, depth=depth)


@pytest.mark.parametrize("order_depth", [8, 48, 8192])
def test_order_log_must_hold_8_entries_per_port(order_depth):
    with pytest.raises(ValueError, match=rf"^Order log depth must be a power of two from 16 to 4096, "
                                         rf"not {order_depth}$"):
        BridgeHarness(**PARAMS, order_depth=order_depth)


def test_the_width_is_checked_first():
    with pytest.raises(ValueError, match=r"^Data width must be one of \(64, 256, 512\), not 128$"):
        BridgeHarness(**{**PARAMS, "width": 128})


@pytest.mark.parametrize("width, chunk, row", [(64, 256, 336), (64, 1024, 1104), (512, 1024, 1152), (256, 4096, 4192)])
def test_a_row_holds_a_result_frame_in_whole_beats(width, chunk, row):
    assert frame_slot_bytes(width, chunk) == row
    g = RingGeometry(3, width, chunk)
    assert g.frame_bytes == row and g.beats == row * 8 // width and g.row_bits == row * 8 + width
    assert g.port_bits == 2 and g.ring_names == ["i0_ring", "i1_ring", "i2_ring", "o0_ring", "o1_ring", "o2_ring"]


def test_frames_no_port_carries_are_counted_not_queued():
    g = RingGeometry(2, 64, 256)
    dut = types.SimpleNamespace(status=None, control=None, alarm=None,
                                **{f"{d}{p}_ring": None for d in "io" for p in range(2)})
    bridge = FrameBridge(dut, g)
    assert bridge.send(0, bytes(g.frame_bytes)) and bridge.send(1, b"\x01")
    assert not bridge.send(0, bytes(g.frame_bytes + 1)) and not bridge.send(1, b"")
    assert bridge.stats == {"oversize": 1, "empty": 1} and bridge.backlog == 2


def test_the_progress_file_holds_the_last_count(tmp_path):
    from inagg.testbench.bridge.session import ProgressFile, read_progress

    path = tmp_path / "progress"
    assert read_progress(path) is None
    path.write_bytes(b"\x01\x02")  # a write under way
    assert read_progress(path) is None
    progress = ProgressFile(str(path))
    progress(3)
    assert read_progress(path) == 3
    progress(4)  # within the period, or not: close writes it
    progress.close()
    assert read_progress(path) == 4


def test_ring_rows_need_a_running_simulator():
    from inagg.testbench.bridge.vpi import RowMemory

    with pytest.raises(RuntimeError, match=r"^the VPI is reachable only inside a running simulator \(a cocotb test\)$"):
        RowMemory("inagg_bridge.i0_ring", 8, 9728)


def test_harness_params_are_the_switch_geometry_of_its_spec():
    spec = SwitchSpec(ports=3, slots=32, chunk_bytes=1024)
    params = HarnessParams.for_switch(spec, width=512, jobs=2, workers=3)
    assert params.switch == SwitchGeometry.for_spec(spec, width=512, jobs=2, workers=3)
    # The build folder's name: the harness's keywords, as before the geometry took them.
    assert params.params == dict(ports=3, width=512, slots=32, chunk_bytes=1024, jobs=2, workers=3, depth=RING_DEPTH,
                                 order_depth=256)
    assert params.rings == RingGeometry(3, 512, 1024, RING_DEPTH, 256)
    with pytest.raises(ValueError, match=r"^Data width must be one of \(64, 256, 512\), not 100$"):
        HarnessParams.for_switch(spec, width=100, jobs=2, workers=3)
    with pytest.raises(ValueError, match="^the bridge harness builds no exception path: give a switch without one$"):
        HarnessParams.for_switch(SwitchSpec(exception=ExceptionSpec(64)), width=64, jobs=2, workers=3)
    with pytest.raises(TypeError, match="^switch must be a SwitchGeometry, not dict$"):
        HarnessParams(PARAMS)


def test_a_mode_iii_harness_has_its_own_build_and_logs_the_hop():
    from inagg.testbench.bridge.harness import ENTRY_ACK, ENTRY_PORT, ENTRY_RESEND, ENTRY_TIMER, HOP_PAYLOAD_BITS
    from inagg.testbench.replay import RESENT, SKIPPED, AckTaken, TimerRanOut

    spec = SwitchSpec(ports=3, slots=32, chunk_bytes=1024)
    params = HarnessParams.for_switch(spec, width=512, jobs=2, workers=3, augmented=True)
    plain = HarnessParams.for_switch(spec, width=512, jobs=2, workers=3)
    assert params.params == {**plain.params, "augmented": True}
    assert params.rings == RingGeometry(3, 512, 1024, RING_DEPTH, 256, augmented=True)
    assert (params.rings.entry_bits, plain.rings.entry_bits) == (2 + HOP_PAYLOAD_BITS, 2)
    decoded = [FrameBridge._decode(k << HOP_PAYLOAD_BITS | v) for k, v in
               [(ENTRY_PORT, 2), (ENTRY_RESEND, 0), (ENTRY_RESEND, 1), (ENTRY_ACK, 1 << 1),
                (ENTRY_ACK, 2 << 1 | 1), (ENTRY_TIMER, 5 << 6 | 2)]]
    assert decoded == [2, RESENT, SKIPPED, AckTaken(1), AckTaken(2, gone=True), TimerRanOut(5, 2)]
