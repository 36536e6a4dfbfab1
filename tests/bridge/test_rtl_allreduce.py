"""Workers all-reduce through the Verilated RTL switch: exact sums under link faults, frame for frame as the model.

One Verilator build (3 ports, 512-bit beats, 32 slots), cached in sim_build/ and shared by every test here.
"""

import json

import numpy as np
import pytest

from inagg import cli
from inagg.host.controller import plan
from inagg.host.link import Faults
from inagg.models.protocol import Counter

pytestmark = pytest.mark.cocotb

WORKERS, WINDOW, WIDTH = 3, 16, 512


def test_allreduce_under_faults_is_exact_and_frame_for_frame_the_model():
    from inagg.testbench.bridge.run import run_rtl

    p = plan([WORKERS], window=WINDOW)
    rng = np.random.default_rng(8)
    # Integers on the grid of the agreed scale: the sum is exact, so any wrong lane shows.
    n = 48 * 1024  # 192 KiB per worker
    data = {w.port: rng.integers(-1000, 1000, n).astype(np.float32) for w in p.jobs[0].workers}
    faults = Faults(loss=0.02, dup=0.02, reorder=0.05, corrupt=0.01)
    seen = []
    out = run_rtl(p, data, width=WIDTH, faults=faults, seed=5, compare=True, progress=seen.append)
    ref = np.sum(list(data.values()), axis=0, dtype=np.float64).astype(np.float32)
    for port, result in out.results.items():
        assert np.array_equal(result, ref), f"worker on port {port}"
    assert out.difference_count == 0, "\n".join(map(str, out.differences))
    assert out.frames_compared == out.counters[Counter.TX_RESULTS] > WORKERS * n // 256
    assert out.link["lost"] > 0 and out.link["corrupted"] > 0 and out.link["duplicated"] > 0
    assert sum(s["resent"] for s in out.stats.values()) > 0
    assert out.counters[Counter.DROP_BAD_ICRC] > 0 and out.counters[Counter.DUP_CONTRIB] > 0
    assert out.bridge == {} and out.cycles > 0
    # The progress the caller saw: rising, ending at every result the workers took.
    assert seen == sorted(set(seen)) and seen[-1] == sum(s["results"] for s in out.stats.values())


def test_demo_on_the_rtl_prints_the_simulation_figures(capsys):
    rc = cli.main(["demo", "--switch", "rtl", "--workers", str(WORKERS), "--window", str(WINDOW), "--size", "8KiB",
                   "--compare", "--json"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["switch"] == "rtl"
    r = s["rtl"]
    assert r["width"] == WIDTH and r["cycles"] > 0 and r["packets_per_s"] > 0 and r["bridge_drops"] == {}
    assert r["compare"]["differences"] == 0 and r["compare"]["frames_compared"] == WORKERS * (8 + 2)


@pytest.mark.netns
def test_workers_in_namespaces_reach_the_rtl_through_tap_devices():
    from inagg.host.netns import NetnsUnavailable, require_root
    from inagg.testbench.bridge.run import run_rtl

    try:
        require_root()
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    p = plan([WORKERS], window=WINDOW)
    rng = np.random.default_rng(9)
    n = 16 * 1024  # 64 KiB per worker
    data = {w.port: rng.integers(-1000, 1000, n).astype(np.float32) for w in p.jobs[0].workers}
    out = run_rtl(p, data, width=WIDTH, net="netns", faults=Faults(loss=0.02), seed=3, compare=True)
    ref = np.sum(list(data.values()), axis=0, dtype=np.float64).astype(np.float32)
    for port, result in out.results.items():
        assert np.array_equal(result, ref), f"worker on port {port}"
    assert out.difference_count == 0, "\n".join(map(str, out.differences))
    assert out.link["lost"] > 0 and sum(s["resent"] for s in out.stats.values()) > 0
    assert out.to_switch == out.counters[Counter.RX_FRAMES] > WORKERS * n // 256
