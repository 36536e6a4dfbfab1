"""The whole switch in the Amaranth simulator against the model switch, and its parameter checks."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable

from inagg.hdl.switch import Switch, generate_verilog
from inagg.models.geometry import SwitchGeometry
from inagg.models.job import ExceptionSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.testbench.amaranth_switch import cycle, simulate
from inagg.testbench.traffic import bad_frames, contribution, lanes, make_job, strays

CHUNK = 256


def _spec(ports=2):
    return SwitchSpec(ports=ports, slots=16, chunk_bytes=CHUNK)


@pytest.mark.parametrize("width", [64, 512])
def test_bad_input_is_counted_and_never_added(width):
    """Every check of protocol.md section 5 fails once, between good contributions on the same slot; then
    worker 0's good contribution on worker 1's port (DROP_UNKNOWN_QPN: ingress-port binding)."""
    spec = _spec()
    job = make_job(spec, 1, 2, 0, 4)
    rng = np.random.default_rng(width)
    bad = bad_frames(spec, job, rng)
    good = [contribution(spec, job, w, 0, lanes(rng, spec)) for w in range(2)]
    padded = good[1] + bytes(7)  # Ethernet padding after the ICRC is not part of the datagram
    traffic = ([(0, good[0])] + [(0, f) for _, f, _ in bad] + [(1, contribution(spec, job, 0, 1, lanes(rng, spec)))]
               + [(1, padded)])
    run = simulate(spec, [job], traffic, width=width)
    run.assert_matches()
    for name, _, counter in bad:
        assert run.counters[counter] > 0, name
    assert run.counters[Counter.DROP_UNKNOWN_QPN] == sum(c is Counter.DROP_UNKNOWN_QPN for _, _, c in bad) + 1
    assert run.counters[Counter.COMPLETED] == 1
    assert run.counters[Counter.RX_FRAMES] == len(traffic)


def test_scenario_at_256_bits():
    """Two jobs, chunks out of order, a duplicate, a resend, a stale and an early chunk, slow egress."""
    spec = _spec()
    jobs = [make_job(spec, 0, 3, 0, 4), make_job(spec, 2, 2, 8, 2)]
    rng = np.random.default_rng(7)
    t = []
    for c in (1, 0, 2):
        for j in jobs:
            for w in range(len(j.workers)):
                t.append((j.workers[w].port, contribution(spec, j, w, c, lanes(rng, spec))))
    t.append(t[0])                                                           # duplicate: resend
    t.append((0, contribution(spec, jobs[1], 0, 2 + 2, lanes(rng, spec))))   # next generation of a done slot
    t.append((0, contribution(spec, jobs[1], 0, 2, lanes(rng, spec))))       # stale now
    t.append((0, contribution(spec, jobs[0], 0, 9, lanes(rng, spec))))       # too far ahead
    run = simulate(spec, jobs, t, width=256, pause=lambda p: cycle([0, 1, 1, 0]),
                   gaps=lambda p: cycle([0, 0, 0, 1]))
    run.assert_matches()
    for c in (Counter.TX_RESENDS, Counter.DROP_STALE, Counter.DROP_WINDOW):
        assert run.counters[c] == 1, c.name


def test_back_to_back_on_one_slot():
    """Contributions to one slot with no idle cycle between them, from both ports."""
    spec = _spec()
    job = make_job(spec, 0, 8, 0, 2)
    rng = np.random.default_rng(3)
    t = [(w % 2, contribution(spec, job, w, c, lanes(rng, spec))) for c in range(2) for w in range(8)]
    run = simulate(spec, [job], t, width=512)
    run.assert_matches()
    assert run.counters[Counter.COMPLETED] == 2


@pytest.mark.parametrize("width", [64, 512])
def test_a_stray_chunk_on_a_free_slot_does_not_hold_it(width):
    """Slot liveness (protocol.md section 3): strays take FREE slots, the job's chunks take them back."""
    spec = _spec()
    job = make_job(spec, 1, 2, 0, 4)
    traffic, counts = strays(spec, job, np.random.default_rng(width))
    run = simulate(spec, [job], traffic, width=width)
    run.assert_matches()
    assert {c: run.counters[c] for c in counts} == counts


@pytest.mark.parametrize("kwargs, message", [
    (dict(ports=0), r"^Port count must be an integer in 1\.\.64, not 0$"),
    (dict(width=100), r"^Data width must be one of \(64, 256, 512\), not 100$"),
    (dict(slots=12), r"^Slot count must be a power of two from 2 to 65536, not 12$"),
    (dict(chunk_bytes=100), r"^Chunk size must be one of \(256, 512, 1024, 2048, 4096\), not 100$"),
    (dict(jobs=0), r"^Job count must be an integer in 1\.\.64, not 0$"),
    (dict(workers=65), r"^Workers per job must be an integer in 1\.\.64, not 65$"),
    (dict(convert_latency=5), r"^Conversion latency must be an integer from 1 to 4, not 5$"),
    (dict(add_latency=0), r"^Adder latency must be an integer from 1 to 6, not 0$"),
    (dict(exc_table=3), r"^Exception table must be 0 \(no exception path\) or a power of two from 2 to 65536, "
                        r"not 3$"),
    (dict(exc_table=4, exc_max_kicks=1025), r"^Exception kick-out bound must be an integer from 0 to 1024, not 1025$"),
    (dict(exc_table=4, exc_stash=-1), r"^Exception stash must be an integer from 0 to 64, not -1$"),
    (dict(exc_table=4, divert_frames=0), r"^Divert queue frames must be an integer from 1 to 64, not 0$"),
    (dict(exc_table=32768), r"^65540 overflow slots exceed the slot engine's 65536$"),
])
def test_parameters_are_checked(kwargs, message):
    params = dict(ports=2, width=64, slots=16, chunk_bytes=CHUNK)
    params.update(kwargs)
    with warnings.catch_warnings():
        # The refused switch was never meant to be elaborated.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=message) as refused:
            Switch(**params)
        del refused
        gc.collect()


def test_a_geometry_or_its_keywords_build_the_same_switch():
    geometry = SwitchGeometry(ports=2, width=64, slots=16, chunk_bytes=CHUNK, exception=ExceptionSpec(4, 8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        flat = Switch(ports=2, width=64, slots=16, chunk_bytes=CHUNK, exc_table=4, exc_max_kicks=8, exc_stash=2)
        assert flat.geometry == geometry and Switch(geometry).space == flat.space == 16 + 10
        with pytest.raises(TypeError, match=r"^Switch takes a SwitchGeometry or its keywords, not "):
            Switch(geometry, ports=2)
        gc.collect()


def test_fp32_latencies_reach_the_slot_engine():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        assert Switch(ports=2, width=64, slots=16, chunk_bytes=CHUNK).engine.lag == 1 + 1 + 2
        assert Switch(ports=2, width=64, slots=16, chunk_bytes=CHUNK, convert_latency=3, add_latency=4).engine.lag == 8
        gc.collect()


def test_verilog_ports_are_axi_names():
    text = generate_verilog("top", ports=2, width=64, slots=4, chunk_bytes=CHUNK, jobs=1, workers=2)
    header = text[text.index("module top"):text.index(";")]
    for name in ("clk", "rst", "s0_axis_tdata", "s1_axis_tkeep", "s1_axis_tready", "m0_axis_tvalid",
                 "m1_axis_tlast", "s_axil_awaddr", "s_axil_rdata", "s_axil_bresp", "order_valid", "order_port"):
        assert f" {name}" in header or f"({name}" in header, name
