"""The two client processes that the switch-service tests run against `inagg switch serve`, on any backend.

The owner creates job A and all-reduces on it once per line it reads; the
intruder creates a job of its own, then tries job A's control operations with
its own token and sends two frames that name job A (without its key) or a worker it lacks.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from inagg.host.service import ENV_SWITCH

OWNER = r"""
import json, os, sys, threading
import numpy as np
from inagg.host import allreduce
from inagg.host.service import SwitchClient, join
from inagg.host.worker import Timing

timing = json.loads(os.environ["CLIENT_TIMING"])      # Timing's keywords, or null for the service's default
timing = None if timing is None else Timing(**timing)
client = SwitchClient()                         # INAGG_SWITCH
ticket = client.create_job(2, window=4)
print(json.dumps({"job": ticket.job.job, "token": ticket.token}), flush=True)
groups = [join(ticket, r, timing=timing) for r in range(2)]
rng = np.random.default_rng(ticket.job.job)
for line in sys.stdin:                          # one all-reduce per line, until stdin closes
    data = [rng.integers(-99, 99, 1000).astype(np.float32) for _ in range(2)]
    out = [None, None]
    threads = [threading.Thread(target=lambda r: out.__setitem__(r, allreduce(data[r], groups[r])), args=(r,))
               for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"ok": all(np.array_equal(o, data[0] + data[1]) for o in out)}), flush=True)
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
for op, key, fields in [("remove_job", mine.token, {}), ("counters", "0" * 32, {}),
                        ("attach", mine.token, {"rank": 0, "endpoint": ["127.0.0.1", 9], "session": client.session})]:
    try:
        client.request(op, key=key, job=victim, **fields)
    except ServiceError as e:
        out["refused"].append(str(e))
g = join(mine, 0)
sw, me = mine.switch, mine.job.workers[0]
def frame(qpn, rkey):
    return wire.build(eth_dst=wire.mac_bytes(sw.mac), eth_src=wire.mac_bytes(me.mac), ip_src=wire.ip_bytes(me.ip),
                      ip_dst=wire.ip_bytes(sw.ip), udp_sport=0xC000, opcode=Opcode.UC_RDMA_WRITE_ONLY, dest_qpn=qpn,
                      psn=0, va=0, rkey=rkey, payload=bytes(sw.chunk_bytes))
before = client.counters(mine.job.job, mine.token)
g.port.send(frame(switch_qpn(victim, 0), mine.job.rkey))                          # the victim's QPN, our R_Key
g.port.send(frame(switch_qpn(victim, int(os.environ["ABSENT_WORKER"])), mine.job.rkey))  # no such worker
deadline = time.monotonic() + float(os.environ["COUNT_WAIT"])
while time.monotonic() < deadline:
    after = client.counters(mine.job.job, mine.token)
    if after["service"].get("foreign_qpn", 0) - before["service"].get("foreign_qpn", 0) == 2:
        break
    time.sleep(0.02)
out["delta"] = {k: after["switch"][k] - before["switch"][k] for k in after["switch"] or {}  # None: the RTL's
                if after["switch"][k] != before["switch"][k]}
out["foreign_qpn"] = after["service"].get("foreign_qpn", 0) - before["service"].get("foreign_qpn", 0)
print(json.dumps(out), flush=True)
"""

OPS = ("remove_job", "counters", "attach")


@dataclass
class ServiceRun:
    """What one run of the two clients against a served switch left (it stopped with exit status 0):
    job A, the intruder's view, the log."""

    job_a: int
    seen: dict
    log: str


def _spawn(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _readline(p: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, f"no answer from the client process within {timeout} s"
    line = p.stdout.readline()
    assert line, f"the client process died: {p.stderr.read()}"
    return json.loads(line)


@pytest.fixture
def two_clients(tmp_path):
    """Run ``inagg <argv> --listen ... --vxlan ...``, the owner and the intruder; check what must hold on any backend.

    Returns a function ``run(argv, *, timing, absent_worker, start_wait, answer_wait, count_wait, on_listening)``
    (``timing`` the owner's :class:`~inagg.host.worker.Timing` keywords, None for the service's default, ``absent_worker`` a worker index job A lacks,
    ``on_listening(log_text)`` called once the service listens) that returns a :class:`ServiceRun`, the
    service stopped by SIGTERM.
    """
    def run(argv: list[str], *, timing: dict | None = None, absent_worker: int, start_wait: float,
            answer_wait: float, count_wait: float, on_listening=lambda text: None) -> ServiceRun:
        log = open(tmp_path / "serve.log", "w+")
        serve = subprocess.Popen([sys.executable, "-m", "inagg.cli", *argv, "--listen", "127.0.0.1:0",
                                  "--vxlan", "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=log)
        owner = intruder = None
        try:
            deadline = time.monotonic() + start_wait
            while not (m := re.search(r"listening: control ([\d.]+:\d+)", open(log.name).read())):
                assert serve.poll() is None and time.monotonic() < deadline, open(log.name).read()
                time.sleep(0.05)
            on_listening(open(log.name).read())
            env = {ENV_SWITCH: m.group(1), "CLIENT_TIMING": json.dumps(timing)}
            owner = _spawn(OWNER, env)
            a = _readline(owner, answer_wait)["job"]
            owner.stdin.write("go\n")
            owner.stdin.flush()
            assert _readline(owner, answer_wait) == {"ok": True}

            intruder = _spawn(INTRUDER, {**env, "VICTIM_JOB": str(a), "ABSENT_WORKER": str(absent_worker),
                                         "COUNT_WAIT": str(count_wait)})
            seen = _readline(intruder, answer_wait)
            assert intruder.wait(30) == 0
            assert seen["refused"] == [f"inagg switch service refused {op}: job {a}: wrong signature" for op in OPS]
            # The service drops and counts the frames that name another QPN than the endpoint's: job A's, and a
            # worker job A lacks; the switch never sees them.
            assert seen["foreign_qpn"] == 2 and seen["delta"] == {}

            owner.stdin.write("again\n")  # job A is intact
            owner.stdin.flush()
            assert _readline(owner, answer_wait) == {"ok": True}
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
        for op in OPS:
            assert re.search(rf"WARNING control 127\.0\.0\.1:\d+: refused {op} on job {a}: wrong signature", text)
        assert re.search(rf"job {a} torn down: its owner's control connection 127\.0\.0\.1:\d+ closed", text)
        assert re.search(rf"job {seen['own_job']} torn down: its owner's control connection", text)
        return ServiceRun(a, seen, text)

    return run
