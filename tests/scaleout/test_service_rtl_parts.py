"""The pieces of the RTL service that need no simulator: the channel, a deferred switch behind the service, options."""

import logging
import select
import socket
import threading
import time

import numpy as np
import pytest

from inagg.host import allreduce
from inagg.host.roce import contribution
from inagg.host.service import ServiceError, SwitchBackendError, SwitchClient, SwitchService, join
from inagg.models.backend import SwitchBackend
from inagg.models.job import SwitchSpec
from inagg.models.switch import ModelSwitch

SPEC = SwitchSpec(ports=4, slots=32, chunk_bytes=256)


def test_channel_moves_messages_both_ways_at_once_without_deadlock():
    """Both ends flush more than the socket buffers hold at the same time, then read; every message arrives whole."""
    from inagg.testbench.bridge.realtime import FRAME, READ, _Channel

    a, b = socket.socketpair()
    ends = [_Channel(a), _Channel(b)]
    sizes = [1, 60, 1500, 9000, 0, 65535]
    sent = [(FRAME if i % 5 else READ, i, bytes([i % 256]) * sizes[i % len(sizes)]) for i in range(600)]
    for c in ends:
        for m in sent:
            c.send(*m)
    assert ends[0].pending > 4 << 20  # more than either socket buffers

    def talk(c):
        c.flush()
        while len(c.messages) < len(sent):
            select.select([c.sock], [], [], 1)
            c.fill()

    threads = [threading.Thread(target=talk, args=(c,), daemon=True) for c in ends]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert not any(t.is_alive() for t in threads)
    assert [list(c.messages) for c in ends] == [sent, sent]
    a.close()
    ends[1].fill()
    assert ends[1].closed


class DeferredSwitch(SwitchBackend):
    """The model switch with the RTL's interface: results come out of poll(), a removed job's slots are freed."""

    retired_slots = ()

    def __init__(self, spec):
        self.spec = spec
        self.model = ModelSwitch(spec)
        self.drops = {"oversize": 0}
        self.failing = False
        self.closed = False
        self._jobs = {}
        self._results = []
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)

    def fileno(self):
        return self._r.fileno()

    def receive(self, port, frame):
        self._check()
        self._results += self.model.receive(port, frame)
        self._w.send(b"!")
        return []

    def poll(self):
        self._check()
        try:
            self._r.recv(1 << 16)
        except BlockingIOError:
            pass
        out, self._results = self._results, []
        return out

    def add_job(self, job):
        self._check()
        self.model.add_job(job)
        self._jobs[job.job] = job

    def remove_job(self, job):
        self._check()
        self.model.remove_job(job)
        del self._jobs[job]

    @property
    def counters(self):
        self._check()
        return self.model.counters

    def close(self):
        self.closed = True
        self._r.close()
        self._w.close()

    def _check(self):
        if self.failing:
            raise SwitchBackendError("the test switch broke")


def test_a_deferred_switch_serves_allreduces_and_a_removed_jobs_region_is_reused():
    switch = DeferredSwitch(SPEC)
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0), switch=switch) as service, \
            SwitchClient(service.control_address) as client:
        t = client.create_job(2, window=4)
        groups = [join(t, r) for r in range(2)]
        data = [np.arange(500, dtype=np.float32) * (r + 1) for r in range(2)]
        out = [None, None]
        threads = [threading.Thread(target=lambda r: out.__setitem__(r, allreduce(data[r], groups[r])), args=(r,))
                   for r in range(2)]
        [x.start() for x in threads]
        [x.join() for x in threads]
        assert all(np.array_equal(o, data[0] + data[1]) for o in out)
        assert client.counters(t.job.job, t.token)["backend"] == {"oversize": 0}
        client.remove_job(t.job.job, t.token)
        assert [client.create_job(1, window=4).job.slot_base for _ in range(3)] == [0, 8, 16]
        with pytest.raises(ServiceError, match=r"^inagg switch service refused create_job: no free region of 16 "
                                               r"slots \(window 8\) in the switch's 32 slots$"):
            client.create_job(1, window=8)
        for g in groups:
            g.port.close()
    assert switch.closed


def test_a_failed_switch_refuses_every_request_and_counts_the_frames_it_drops(caplog):
    caplog.set_level(logging.INFO, logger="inagg.switch")
    switch = DeferredSwitch(SPEC)
    with SwitchService(SPEC, vxlan=("127.0.0.1", 0), switch=switch) as service, \
            SwitchClient(service.control_address) as client:
        t = client.create_job(1, window=4)
        g = join(t, 0)
        client.counters(t.job.job, t.token)  # the connection's nonce, which a signed request needs, is known
        switch.failing = True
        # A job's counters are the service's own tallies (they need no switch call): the frame finds the failure.
        g.port.send(bytes(contribution(t.switch, g.job, 0, 0, bytes(SPEC.chunk_bytes))))  # the rank's own QPN
        deadline = time.monotonic() + 10
        while service.stats["switch_failed"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for op, fields in [("counters", {"job": t.job.job, "key": t.token}), ("create_job", {"workers": 1}),
                           ("hello", {})]:
            with pytest.raises(ServiceError, match=f"^inagg switch service refused {op}: the switch failed: "
                                                   "the test switch broke$"):
                client.request(op, **fields)
        g.port.close()
    assert service.failure == "the test switch broke" and switch.closed
    assert "the switch failed: the test switch broke; every request is refused from now on" in caplog.text
    assert "switch counters: unavailable, the switch failed" in caplog.text


def test_the_rtl_switch_checks_its_parameters_before_it_builds():
    from inagg.testbench.bridge.realtime import RtlSwitch

    with pytest.raises(TypeError, match="^spec must be a SwitchSpec, not dict$"):
        RtlSwitch({})
    with pytest.raises(ValueError, match=r"^Data width must be one of \(64, 256, 512\), not 100$"):
        RtlSwitch(SPEC, width=100)
    with pytest.raises(ValueError, match=r"^Job count must be an integer in 1\.\.64, not 0$"):
        RtlSwitch(SPEC, jobs=0)


@pytest.mark.parametrize("argv, error", [
    (["--width", "64"], "inagg switch serve: error: --width and --jobs are options of --backend rtl"),
    (["--jobs", "4"], "inagg switch serve: error: --width and --jobs are options of --backend rtl"),
    (["--backend", "rtl", "--width", "128"], "argument --width: invalid choice: 128 (choose from 64, 256, 512)"),
    (["--backend", "rtl", "--jobs", "1"], "argument --jobs: expected an integer in 2..64, not '1'"),
    (["--backend", "fpga"], "argument --backend: invalid choice: 'fpga' (choose from 'fast', 'model', 'rtl')"),
])
def test_serve_refuses_rtl_options_it_cannot_use(capsys, argv, error):
    from inagg.cli import main

    try:
        rc = main(["switch", "serve", "--listen", "127.0.0.1:0", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2 and error in capsys.readouterr().err
