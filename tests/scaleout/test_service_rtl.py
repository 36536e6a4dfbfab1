"""The switch service on the Verilated RTL switch (``inagg switch serve --backend rtl``).

One Verilator build (3 ports, 64-bit beats, 32 slots of 256 bytes, 4 jobs), cached in sim_build/ and shared by
both tests; each test starts one simulator.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.service import ENV_SWITCH, ServiceError, SwitchClient, SwitchService, join
from inagg.host.worker import Timing
from inagg.models.job import SwitchSpec

pytestmark = pytest.mark.cocotb

PORTS, WIDTH, SLOTS, CHUNK, JOBS = 3, 64, 32, 256, 4
SERVE = ["switch", "serve", "--backend", "rtl", "--ports", str(PORTS), "--width", str(WIDTH), "--slots", str(SLOTS),
         "--chunk-bytes", str(CHUNK), "--jobs", str(JOBS)]
# The simulated switch takes about a millisecond of wall-clock time per contribution at W = 64.
TIMING = "Timing(timeout=0.5, max_timeout=2.0, tries=10)"

OWNER = rf"""
import json, sys, threading
import numpy as np
from inagg.host import allreduce
from inagg.host.service import SwitchClient, join
from inagg.host.worker import Timing

client = SwitchClient()                         # INAGG_SWITCH
ticket = client.create_job(2, window=4)
print(json.dumps({{"job": ticket.job.job, "token": ticket.token}}), flush=True)
groups = [join(ticket, r, timing={TIMING}) for r in range(2)]
rng = np.random.default_rng(ticket.job.job)
for line in sys.stdin:                          # one all-reduce per line, until stdin closes
    data = [rng.integers(-99, 99, 1000).astype(np.float32) for _ in range(2)]
    out = [None, None]
    threads = [threading.Thread(target=lambda r: out.__setitem__(r, allreduce(data[r], groups[r])), args=(r,))
               for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({{"ok": all(np.array_equal(o, data[0] + data[1]) for o in out)}}), flush=True)
"""

INTRUDER = r"""
import json, os, time
from inagg.host.service import ServiceError, SwitchClient, join
from inagg.models import wire
from inagg.models.protocol import Opcode, switch_qpn

victim = int(os.environ["VICTIM_JOB"])
client = SwitchClient()
mine = client.create_job(1, window=4)
out = {"own_job": mine.job.job, "refused": []}
for op, fields in [("remove_job", {"token": mine.token}), ("counters", {"token": "0" * 32}),
                   ("attach", {"token": mine.token, "rank": 0, "endpoint": ["127.0.0.1", 9]})]:
    try:
        client.request(op, job=victim, **fields)
    except ServiceError as e:
        out["refused"].append(str(e))
g = join(mine, 0)
sw, me = mine.switch, mine.job.workers[0]
def frame(qpn, rkey):
    return wire.build(eth_dst=wire.mac_bytes(sw.mac), eth_src=wire.mac_bytes(me.mac), ip_src=wire.ip_bytes(me.ip),
                      ip_dst=wire.ip_bytes(sw.ip), udp_sport=0xC000, opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=qpn,
                      psn=0, va=0, rkey=rkey, payload=bytes(sw.chunk_bytes))
before = client.counters(mine.job.job, mine.token)["switch"]
g.port.send(frame(switch_qpn(victim, 0), mine.job.rkey))     # the victim's QPN with our R_Key
g.port.send(frame(switch_qpn(victim, 2), mine.job.rkey))     # a worker the victim does not have
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    after = client.counters(mine.job.job, mine.token)["switch"]
    if after["RX_FRAMES"] - before["RX_FRAMES"] == 2:
        break
    time.sleep(0.05)
out["delta"] = {k: after[k] - before[k] for k in after if after[k] != before[k]}
print(json.dumps(out), flush=True)
"""


def _spawn(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _readline(p: subprocess.Popen, timeout: float = 60) -> dict:
    import select

    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, f"no answer from the client process within {timeout} s"
    line = p.stdout.readline()
    assert line, f"the client process died: {p.stderr.read()}"
    return json.loads(line)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_client_processes_two_jobs_and_a_wrong_token_on_the_rtl(tmp_path):
    """`inagg switch serve --backend rtl` as a process: job A's owner, and a second client that tries to touch job A."""
    log = open(tmp_path / "serve.log", "w+")
    serve = subprocess.Popen([sys.executable, "-m", "inagg.cli", *SERVE, "--listen", "127.0.0.1:0",
                              "--vxlan", "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=log)
    owner = intruder = None
    seen = None
    try:
        deadline = time.monotonic() + 600  # a changed geometry is built first
        while not (m := re.search(r"listening: control ([\d.]+:\d+)", open(log.name).read())):
            assert serve.poll() is None and time.monotonic() < deadline, open(log.name).read()
            time.sleep(0.2)
        sim = int(re.search(r"RTL switch running: simulator pid (\d+)", open(log.name).read()).group(1))
        env = {ENV_SWITCH: m.group(1)}
        owner = _spawn(OWNER, env)
        job_a = _readline(owner)
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert _readline(owner) == {"ok": True}

        intruder = _spawn(INTRUDER, {**env, "VICTIM_JOB": str(job_a["job"])})
        seen = _readline(intruder)
        assert intruder.wait(30) == 0
        a = job_a["job"]
        assert seen["refused"] == [f"inagg switch service refused {op}: job {a}: wrong token"
                                   for op in ("remove_job", "counters", "attach")]
        # The RTL drops and counts the frames that name job A without its key or worker.
        assert seen["delta"] == {"RX_FRAMES": 2, "DROP_BAD_RKEY": 1, "DROP_UNKNOWN_QPN": 1}

        owner.stdin.write("again\n")  # job A is intact
        owner.stdin.flush()
        assert _readline(owner) == {"ok": True}
        owner.stdin.close()
        assert owner.wait(30) == 0
    finally:
        for p in (owner, intruder):
            if p is not None and p.poll() is None:
                p.kill()
        serve.send_signal(signal.SIGTERM)
        rc = serve.wait(60)
    text = open(log.name).read()
    assert rc == 0, text
    assert not _alive(sim), "the simulator outlived the service"
    b = seen["own_job"]
    for op in ("remove_job", "counters", "attach"):
        assert re.search(rf"WARNING control 127\.0\.0\.1:\d+: refused {op} on job {a}: wrong token", text)
    assert re.search(rf"job {a} torn down: its owner's control connection 127\.0\.0\.1:\d+ closed", text)
    assert re.search(rf"job {b} torn down: its owner's control connection", text)
    assert "retired" not in text  # the removed jobs' slots were torn down, not retired
    # The summary's counters are read from the RTL's registers as the service stops.
    assert re.search(r"inagg.switch INFO stopped: .*'refused_requests': 3.*switch counters: RX_FRAMES \d+, .*"
                     r"DROP_UNKNOWN_QPN 1, DROP_BAD_RKEY 1$", text, re.M), text


def test_reused_regions_oversize_frames_and_a_crashed_simulator():
    """In one process: a removed job's slots serve the next job, too long a frame is counted, a killed simulator is
    reported."""
    from inagg.testbench.bridge.realtime import RtlSwitch

    spec = SwitchSpec(ports=PORTS, slots=SLOTS, chunk_bytes=CHUNK)
    rtl = RtlSwitch(spec, width=WIDTH, jobs=JOBS)
    service = SwitchService(spec, vxlan=("127.0.0.1", 0), switch=rtl).start()
    try:
        with SwitchClient(service.control_address) as client:
            timing = Timing(timeout=0.5, max_timeout=2.0, tries=10)
            first = client.create_job(1, window=8)
            assert (first.job.slot_base, first.job.slots) == (0, 16)
            g = join(first, 0, timing=timing)
            x = np.arange(300, dtype=np.float32)
            assert np.array_equal(allreduce(x, g), x)
            client.remove_job(first.job.job, first.token)
            second = client.create_job(1, window=8)  # the same job number and region, torn down in the RTL
            assert (second.job.job, second.job.slot_base) == (first.job.job, 0)
            g2 = join(second, 0, timing=timing)
            assert np.array_equal(allreduce(2 * x, g2), 2 * x)
            g2.port.send(bytes(rtl.geometry.frame_bytes + 1))
            deadline = time.monotonic() + 10
            while (c := client.counters(second.job.job, second.token))["backend"] != {"oversize": 1}:
                assert time.monotonic() < deadline, c
                time.sleep(0.05)

            os.kill(rtl.pid, signal.SIGKILL)
            reason = f"the switch failed: the RTL simulator \\(pid {rtl.pid}\\) exited: killed by SIGKILL"
            deadline = time.monotonic() + 10
            while True:  # the service notices at its next look at the simulator's socket
                try:
                    client.counters(second.job.job, second.token)
                except ServiceError as e:
                    assert re.fullmatch(f"inagg switch service refused counters: {reason}", str(e))
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with pytest.raises(ServiceError, match=f"^inagg switch service refused create_job: {reason}$"):
                client.create_job(1)
            g2.port.send(bytes(100))
            deadline = time.monotonic() + 10
            while service.stats["switch_failed"] < 1:  # dropped and counted
                assert time.monotonic() < deadline
                time.sleep(0.05)
            g.port.close()
            g2.port.close()
    finally:
        service.stop()
    assert service.failure is not None and not _alive(rtl.pid)
