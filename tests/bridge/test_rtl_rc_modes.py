"""Modes II and III on the Verilated RTL switch: RC workers inside the simulation, exact sums under link faults,
frame for frame the model switch's.

Mode II runs on the build test_rtl_allreduce.py uses (3 ports, 512-bit beats, 32 slots); Mode III on the same
geometry built with Mode III (``augmented``), cached in sim_build/ beside it.
"""

import json

import numpy as np
import pytest

from inagg import cli
from inagg.host.controller import plan
from inagg.host.link import Faults
from inagg.models.job import Mode
from inagg.models.protocol import Counter

pytestmark = pytest.mark.cocotb

WORKERS, WINDOW, WIDTH = 3, 16, 512


def test_mode_ii_demo_under_faults_is_frame_for_frame_the_model(capsys):
    rc = cli.main(["demo", "--switch", "rtl", "--mode", "II", "--workers", str(WORKERS), "--window", str(WINDOW),
                   "--size", "32KiB", "--loss", "0.02", "--dup", "0.02", "--reorder", "0.05", "--compare", "--json",
                   "--no-progress"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["mode"] == "II" and s["switch"] == "rtl"
    c = s["rtl"]["compare"]
    assert c["differences"] == 0, "\n".join(c["first"])
    counters = s["switch_counters"]
    # Every result and every reflected ACK the RTL sent was compared.
    assert c["frames_compared"] == counters["TX_RESULTS"] + counters["ACK_REFLECTED"]
    assert counters["COMPLETED"] == 32 + 2 and counters["ACK_REFLECTED"] > 0 and counters["DUP_CONTRIB"] > 0
    assert s["drops"]["link"]["lost"] > 0 and s["drops"]["link"]["duplicated"] > 0
    assert s["packets"]["retransmissions"] > 0


def test_mode_iii_under_faults_is_exact_and_frame_for_frame_the_model():
    import dataclasses

    from inagg.testbench.bridge.run import run_rtl

    p = plan([WORKERS], window=WINDOW)
    p = dataclasses.replace(p, jobs=tuple(dataclasses.replace(j, mode=Mode.AUGMENTED) for j in p.jobs))
    rng = np.random.default_rng(11)
    # Integers on the grid of the agreed scale: the sum is exact, so any wrong lane shows.
    n = 8 * 1024  # 32 KiB per worker
    data = {w.port: rng.integers(-1000, 1000, n).astype(np.float32) for w in p.jobs[0].workers}
    out = run_rtl(p, data, width=WIDTH, faults=Faults(loss=0.02, dup=0.02, reorder=0.05), seed=4, compare=True)
    ref = np.sum(list(data.values()), axis=0, dtype=np.float64).astype(np.float32)
    for port, result in out.results.items():
        assert np.array_equal(result, ref), f"worker on port {port}"
    c = out.counters
    # Every result, and every ACK and NAK of the switch's own, the model's, with the hop's ACKs, timers and
    # resends placed where the RTL's order log says they took effect.
    assert out.difference_count == 0, "\n".join(map(str, out.differences))
    assert out.frames_compared == c[Counter.TX_RESULTS] + c[Counter.ACK_SENT] + c[Counter.NAK_SENT]
    assert c[Counter.COMPLETED] == n * 4 // 1024 + 2 and c[Counter.ACK_REFLECTED] == 0
    for counter in (Counter.ACK_SENT, Counter.NAK_SENT, Counter.HOP_RESENDS, Counter.DUP_CONTRIB,
                    Counter.DROP_PSN_AHEAD):
        assert c[counter] > 0, counter.name
    assert out.link["lost"] > 0 and out.link["duplicated"] > 0 and out.bridge == {}


@pytest.mark.netns
def test_mode_ii_workers_in_namespaces_reach_the_rtl_frame_for_frame_the_model(capsys):
    from inagg.host.netns import NetnsUnavailable, require_root

    try:
        require_root()
    except NetnsUnavailable as e:
        pytest.skip(str(e))
    rc = cli.main(["demo", "--switch", "rtl", "--mode", "II", "--net", "netns", "--workers", str(WORKERS),
                   "--window", str(WINDOW), "--size", "16KiB", "--loss", "0.02", "--compare", "--json",
                   "--no-progress"])
    s = json.loads(capsys.readouterr().out)
    assert rc == 0 and s["ok"] and s["net"] == "netns"
    assert s["rtl"]["compare"]["differences"] == 0, "\n".join(s["rtl"]["compare"]["first"])
    assert s["switch_counters"]["COMPLETED"] == 16 + 2 and s["switch_counters"]["ACK_REFLECTED"] > 0
