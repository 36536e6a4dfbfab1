"""Every switch backend through the one interface: the same small scenario, frame for frame against the model."""

from __future__ import annotations

import select
import time

import numpy as np
import pytest

from inagg.models import wire
from inagg.models.backend import DataPlane, SwitchBackend, backend_names, load_backend
from inagg.models.job import JobSpec, SwitchSpec, WorkerSpec
from inagg.models.p4profile import TNA, V1MODEL, P4ProfileSwitch
from inagg.models.protocol import Counter, Opcode
from inagg.models.switch import ModelSwitch

# The geometry of tests/scaleout/test_service_rtl.py, so the RTL backend shares its cached Verilator build.
SPEC = SwitchSpec(ports=3, slots=32, chunk_bytes=256)
RTL_OPTIONS = dict(width=64, jobs=4)
_MEMBERS = ("receive", "poll", "add_job", "remove_job", "fileno", "close")


def _job(rkey: int = 0xC0DE0001) -> JobSpec:
    workers = tuple(WorkerSpec(port=i, mac=f"02:00:00:01:00:{i:02x}", ip=f"10.0.0.{i + 1}", qpn=0x1000 + i,
                               rkey=0x5000 + i, result_va=0x100000 * (i + 1), result_psn=i) for i in range(2))
    return JobSpec(job=1, rkey=rkey, slot_base=0, slots=4, workers=workers)


def _frame(job: JobSpec, worker: int, chunk: int, lanes: np.ndarray, **kw) -> bytes:
    w = job.workers[worker]
    args = dict(eth_dst=wire.mac_bytes(SPEC.mac), eth_src=wire.mac_bytes(w.mac), ip_src=wire.ip_bytes(w.ip),
                ip_dst=wire.ip_bytes(SPEC.ip), udp_sport=0xC000 | worker, opcode=Opcode.UC_RDMA_WRITE_ONLY,
                dest_qpn=job.qpn(worker), psn=chunk, va=chunk * SPEC.chunk_bytes, rkey=job.rkey,
                payload=lanes.astype(">i4").tobytes())
    args.update(kw)
    return wire.build(**args)


def _traffic(job: JobSpec) -> list[tuple[int, bytes]]:
    """Two chunks of both workers, a duplicate of a completed chunk (answered with a resend), a wrong R_Key."""
    rng = np.random.default_rng(3)
    out = []
    for chunk in range(2):
        for w in range(2):
            out.append((w, _frame(job, w, chunk, rng.integers(-1 << 20, 1 << 20, SPEC.lanes, dtype=np.int32))))
    out.append(out[0])
    out.append((1, _frame(job, 1, 2, np.ones(SPEC.lanes, np.int32), rkey=0xBAD)))
    return out


def _exchange(switch: DataPlane, frames: list[tuple[int, bytes]], expect: int) -> list[tuple[int, bytes]]:
    """Send every frame; gather what the switch sends until ``expect`` frames came out (or 60 s passed)."""
    got = []
    for port, frame in frames:
        got += switch.receive(port, frame)
    got += switch.poll()
    fd = switch.fileno()
    deadline = time.monotonic() + 60
    while fd is not None and len(got) < expect and time.monotonic() < deadline:
        select.select([fd], [], [], 1.0)
        got += switch.poll()
    return got


def _by_port(frames):
    return {p: [f for q, f in frames if q == p] for p in sorted({p for p, _ in frames})}


def _rtl():
    from inagg.testbench import toolchain

    try:
        toolchain.activate()
    except toolchain.MissingTool as e:
        pytest.skip(str(e))
    return load_backend("rtl").open(SPEC, **RTL_OPTIONS)


BACKENDS = {
    "model": lambda: load_backend("model").open(SPEC),
    "fast": lambda: load_backend("fast").open(SPEC),
    "p4-v1model": lambda: P4ProfileSwitch(V1MODEL, SPEC),
    "p4-tna": lambda: P4ProfileSwitch(TNA, SPEC),
    "rtl": _rtl,
}


def test_every_registered_backend_is_in_the_scenario():
    assert set(backend_names()) <= set(BACKENDS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=(pytest.mark.cocotb, pytest.mark.reuses_build)) if n == "rtl"
                                  else n for n in BACKENDS])
def test_a_backend_runs_the_scenario_as_the_model_does(name):
    switch = BACKENDS[name]()
    try:
        assert isinstance(switch, SwitchBackend)
        for member in _MEMBERS:  # defined by the backend itself, not inherited from the Protocol's stubs
            assert getattr(type(switch), member) is not getattr(SwitchBackend, member), member
        assert switch.spec == SPEC
        job = _job()
        model = ModelSwitch(SPEC)
        model.add_job(job)
        switch.add_job(job)
        want = [out for port, frame in _traffic(job) for out in model.receive(port, frame)]
        if name == "p4-tna":  # no ICRC on Tofino: its results carry zero there (models/p4profile.py)
            want = [(p, f[:-4] + bytes(4)) for p, f in want]
        got = _exchange(switch, _traffic(job), len(want))
        assert _by_port(got) == _by_port(want)
        assert dict(switch.counters) == dict(model.counters)
        assert switch.counters[Counter.DROP_BAD_RKEY] == 1 and switch.counters[Counter.COMPLETED] == 2
        assert not any(dict(switch.drops).values())
        # The removed job's region is free again at once: the same job comes back on it.
        switch.remove_job(job.job)
        assert tuple(switch.retired_slots) == ()
        switch.add_job(_job(rkey=0xC0DE0002))
        with pytest.raises(ValueError):
            switch.add_job(_job(rkey=0xC0DE0002))
    finally:
        switch.close()


def test_an_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"^no switch backend 'fpga'; registered: fast, model, rtl$"):
        load_backend("fpga")
