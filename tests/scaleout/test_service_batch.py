"""The switch service's batches (issue 24): a job's turn reaches the switch in one ``receive_batch`` call.

The batched path and the frame-by-frame path (``switch_batch=False``) must send every endpoint the frames the
reference switch sends for the same arrival order, and count the same; a flood must not hold the control
plane off, and no call may hand the switch more than a job's share of a turn.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from inagg.host.fastpath import ContribTemplate
from inagg.host.service import ENV_RANK, ENV_TICKET, Limits, SwitchClient, SwitchService, join
from inagg.host.vxlan import encap
from inagg.models.job import SwitchSpec
from inagg.models.protocol import ICRC_LEN
from inagg.models.switch import ModelSwitch

SPEC = SwitchSpec(ports=6, slots=64, chunk_bytes=256)


def _traffic(switch: SwitchSpec, job, rank: int, chunks: range) -> list[bytes]:
    """Rank ``rank``'s contributions for ``chunks``, lanes that tell rank and chunk apart."""
    lanes = np.array([[1000 * c + rank] * switch.lanes for c in chunks], np.int32).reshape(len(chunks), switch.lanes)
    frames = ContribTemplate(switch, job, rank).build(np.array(chunks), lanes)
    return [row.tobytes() for row in frames]


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _run(switch_batch: bool) -> dict:
    """One run of the same traffic; what each endpoint received, what the reference sends, and the counts."""
    with SwitchService(SPEC, switch_batch=switch_batch) as service, SwitchClient(service.control_address) as c:
        t = c.create_job(2, window=8)
        groups = [join(t, r) for r in range(2)]
        job = groups[0].job
        n = job.slots
        first = _traffic(t.switch, job, 0, range(n))
        second = _traffic(t.switch, job, 1, range(n))
        bad_icrc = bytearray(first[3])
        bad_icrc[-ICRC_LEN] ^= 1
        # Slot 2's chunk three generations on: a stray that takes the first generation's slot over
        # (docs/protocol.md, "Liveness"), so that rank 1's chunk 2 meets another chunk there.
        stray = _traffic(t.switch, job, 0, range(3 * n + 2, 3 * n + 3))[0]
        foreign = _traffic(t.switch, job, 1, range(5, 6))[0]         # rank 1's QPN from rank 0's endpoint
        # Rank 0's datagrams, in order, and which of them reach the switch (the service filters the others).
        datagrams = [(encap(f, t.vni), True) for f in first[:8]]
        datagrams += [(encap(bytes(bad_icrc), t.vni), True), (encap(first[2], t.vni), True),  # corrupt, duplicate
                      (b"\x08\0\0", False), (encap(first[4], t.vni + 1), False),            # not VXLAN, other VNI
                      (encap(foreign, t.vni), False), (encap(stray, t.vni), True)]
        datagrams += [(encap(f, t.vni), True) for f in first[8:]]
        sock = groups[0].port.sock
        for d, _ in datagrams:
            sock.send(d)
        # Every one of rank 0's datagrams is taken before rank 1 sends: one arrival order, whatever the timing.
        _wait(lambda: c.counters(t.job.job, t.token)["service"].get("rx_datagrams", 0) >= len(datagrams) - 2
              and not service._backlog, "rank 0's datagrams to be taken")
        for f in second:
            groups[1].port.send(f)
        model = ModelSwitch(t.switch)
        model.add_job(job)
        expected = [out for f in [d[8:] for d, ok in datagrams if ok] for out in model.receive(0, f)]
        expected += [out for f in second for out in model.receive(1, f)]
        got = {r: [] for r in range(2)}
        for r in range(2):
            want = sum(p == job.workers[r].port for p, _ in expected)
            while len(got[r]) < want and (frame := groups[r].port.recv(5.0)) is not None:
                got[r].append(frame)
            assert groups[r].port.recv(0.2) is None  # nothing more than the reference sends
        counts = c.counters(t.job.job, t.token)
        for g in groups:
            g.port.close()
    mine = {r: [f for p, f in expected if p == job.workers[r].port] for r in range(2)}
    return {"slots": n, "got": got, "expected": mine,
            "switch": {k: v for k, v in counts["switch"].items() if v}, "service": counts["service"],
            "model": {c.name: v for c, v in model.counters.items() if v}}


def test_batched_and_frame_by_frame_paths_send_the_reference_frames_and_count_alike():
    runs = {batch: _run(batch) for batch in (False, True)}
    for run in runs.values():
        assert run["got"] == run["expected"]
        assert run["switch"] == run["model"]
        assert {"DROP_BAD_ICRC", "DUP_CONTRIB", "TX_RESULTS"} <= set(run["switch"])
        assert run["switch"]["COMPLETED"] == run["slots"] - 1  # the stray's slot never completes
    assert runs[True]["service"] == runs[False]["service"]
    assert {"foreign_qpn", "rx_datagrams", "tx_datagrams"} <= set(runs[True]["service"])
    # The service-wide drops of datagrams that name no job (not VXLAN, another VNI) are not the job's to count.
    assert "not_vxlan" not in runs[True]["service"]


FLOOD = r"""
import os
from inagg.host.fastpath import ContribTemplate
from inagg.host.service import group_from_env
import numpy as np
g = group_from_env()
n = 4 * g.job.slots
frames = [r.tobytes() for r in ContribTemplate(g.switch, g.job, 0).build(np.arange(n), np.zeros((n, g.switch.lanes),
                                                                                                  np.int32))]
print("ready", flush=True)
while True:
    for f in frames:
        g.port.send(f)
"""


def test_a_flood_gets_batches_of_its_share_and_the_control_plane_answers():
    """However fast an endpoint sends, the switch takes at most ``job_frames`` of its job per call, and the loop
    comes back to the control endpoint between turns: requests are answered within a fraction of a second."""
    limits = Limits(job_frames=16)
    with SwitchService(SPEC, limits=limits) as service, SwitchClient(service.control_address) as owner:
        sizes = []
        take = service.switch.receive_batch

        def recording(frames):
            sizes.append(len(frames))
            return take(frames)

        service.switch.receive_batch = recording
        flood = owner.create_job(1, window=8)
        p = subprocess.Popen([sys.executable, "-c", FLOOD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, ENV_TICKET: flood.to_json(), ENV_RANK: "0"})
        try:
            assert p.stdout.readline().strip() == "ready"
            _wait(lambda: sum(sizes) > 1000, "the flood to reach the switch")
            waits = []
            for _ in range(20):
                t0 = time.perf_counter()
                owner.hello()
                waits.append(time.perf_counter() - t0)
            counts = owner.counters(flood.job.job, flood.token)["service"]
        finally:
            p.kill()
            p.wait()
    assert max(waits) < 0.5, waits
    assert max(sizes) == limits.job_frames  # batches, and none larger than the job's share of a turn
    assert counts["rx_datagrams"] > 1000


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_switch_batch_must_be_a_bool(value):
    with pytest.raises(TypeError, match="switch_batch must be a bool"):
        SwitchService(SPEC, switch_batch=value)
