"""The cocotb test that runs inside the Verilated harness: configure the switch, serve the workers, report.

:func:`inagg.testbench.bridge.run.run_rtl` starts the simulator on this
module with ``INAGG_BRIDGE_JOB`` naming a pickled :class:`Job`; the test
writes a pickled :class:`Outcome` to ``job.out``. The controller's
register writes (:func:`inagg.host.controller.register_writes`) go through
cocotbext-axi's AXI4-Lite manager, the counters are read back the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from pathlib import Path

import cocotb
import numpy as np
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from inagg.host.controller import Plan, register_writes
from inagg.host.link import Faults
from inagg.host.rc_worker import RC_MODES, RcWorker
from inagg.host.worker import AllReduce, Timing, Worker
from inagg.models import regmap as rm
from inagg.models.protocol import Counter
from inagg.testbench.bridge.bridge import CLOCK_NS, FrameBridge
from inagg.testbench.bridge.compare import Difference, LiveCompare
from inagg.testbench.bridge.harness import RingGeometry

__all__ = ["Job", "Outcome", "JOB_ENV", "ProgressFile", "read_progress"]

JOB_ENV = "INAGG_BRIDGE_JOB"
_PROGRESS_PERIOD = 0.1  # wall-clock seconds between two writes of the progress file


class ProgressFile:
    """A running count in the first 8 bytes of a file, for the process that started the simulator to poll.

    Calling it with a count writes it at most every ``_PROGRESS_PERIOD`` seconds of wall-clock time;
    :meth:`close` writes the last count.
    """

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._last = -_PROGRESS_PERIOD
        self._count: int | None = None
        self._written: int | None = None

    def __call__(self, count: int) -> None:
        self._count = count
        now = time.monotonic()
        if now - self._last >= _PROGRESS_PERIOD:
            self._write()
            self._last = now

    def _write(self) -> None:
        if self._count is not None and self._count != self._written:
            os.pwrite(self._fd, self._count.to_bytes(8, "little"), 0)
            self._written = self._count

    def close(self) -> None:
        self._write()
        os.close(self._fd)


def read_progress(path: str | os.PathLike) -> int | None:
    """The count a :class:`ProgressFile` last wrote at ``path``, or None before its first write."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
    except FileNotFoundError:
        return None
    return int.from_bytes(raw, "little") if len(raw) == 8 else None


@dataclass
class Job:
    """What the simulation is asked to do: a plan, each worker's data (by port), the link, the clock."""

    plan: Plan
    rings: RingGeometry
    data: dict[int, np.ndarray]
    timing: Timing
    faults: Faults = field(default_factory=Faults)
    hop_timeout: int | None = None  # the HOP_TIMEOUT register of a Mode III run, in cycles; None: left as reset
    seed: int = 0
    compare: bool = False
    pcap: str | None = None
    out: str = ""
    # The netns transport: the TAP topology's tag, and files that say it is up and that the workers are done.
    net: str = "memory"
    tag: str | None = None
    ready: str = ""
    stop: str = ""
    progress: str = ""  # a file for the count of completed chunks (ProgressFile), or none


@dataclass
class Outcome:
    """What the simulation brings back."""

    results: dict[int, np.ndarray]
    exponents: dict[int, int]
    stats: dict[int, Tally]
    counters: dict[Counter, int]
    bridge: dict
    link: dict
    to_switch: int
    to_hosts: int
    cycles: int
    wakes: int
    python_time: float
    wall_time: float
    cpu_time: float
    differences: list[Difference] | None
    difference_count: int = 0
    frames_compared: int = 0
    clock_ns: int = CLOCK_NS


@cocotb.test()
async def allreduce(dut):
    """Every worker of the plan all-reduces its data through the RTL switch."""
    from inagg.host.demo_run import pcap_writer

    with open(os.environ[JOB_ENV], "rb") as f:
        job: Job = pickle.load(f)
    bridge = FrameBridge(dut, job.rings)
    await bridge.start()
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
    for model in (axil.write_if, axil.read_if):
        model.log.setLevel(logging.WARNING)  # it logs every access at INFO
    assert await axil.read_dword(rm.RegMap.switch("ID")) == rm.ID_VALUE
    geometry = await axil.read_dword(rm.RegMap.switch("JOBS"))
    modes = rm.RegMap.decode_modes(await axil.read_dword(rm.RegMap.switch("MODES")))
    regmap = dataclasses.replace(rm.RegMap.from_jobs(geometry), modes=modes)
    for addr, value in register_writes(job.plan, regmap):
        await axil.write_dword(addr, value)
    if job.hop_timeout is not None:
        await axil.write_dword(rm.RegMap.switch("HOP_TIMEOUT"), job.hop_timeout)

    compare = LiveCompare(job.plan.switch, job.plan.jobs) if job.compare else None
    progress = ProgressFile(job.progress) if job.progress else None
    try:
        with pcap_writer(job.pcap) as capture:
            serve = _serve_netns if job.net == "netns" else _serve_memory
            fields = await serve(job, bridge, capture, compare, progress)
    finally:
        if progress is not None:
            progress.close()
    counters = {c: await axil.read_dword(regmap.counter(c)) for c in Counter}
    differences = compare.finish(counters) if compare is not None else None
    outcome = Outcome(**fields, counters=counters, bridge=dict(bridge.stats), differences=differences,
                      difference_count=compare.count if compare else 0,
                      frames_compared=compare.matched if compare else 0)
    with open(job.out, "wb") as f:
        pickle.dump(outcome, f)


async def _serve_memory(job: Job, bridge: FrameBridge, capture, compare, progress) -> dict:
    from inagg.testbench.bridge.memory import serve_memory

    ops = {}
    for spec in job.plan.jobs:
        for r, w in enumerate(spec.workers):
            kind = RcWorker if spec.mode in RC_MODES else Worker
            ops[w.port] = AllReduce(kind(job.plan.switch, spec, r, timing=job.timing), job.data[w.port])
    # Chunks done, counted as the model demo counts them: the results the workers took.
    tick = None if progress is None else (lambda: progress(sum(op.worker.stats["results"] for op in ops.values())))
    wall, cpu = time.perf_counter(), time.process_time()
    run = await serve_memory(bridge, ops, faults=job.faults, seed=job.seed, capture=capture, compare=compare,
                             progress=tick)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return dict(results={p: op.result() for p, op in ops.items()}, exponents={p: op.exponent for p, op in ops.items()},
                stats={p: op.worker.stats for p, op in ops.items()}, link=run.link, to_switch=run.to_switch,
                to_hosts=run.to_hosts, cycles=run.cycles, wakes=run.wakes, python_time=run.python_time,
                wall_time=wall, cpu_time=cpu)


async def _serve_netns(job: Job, bridge: FrameBridge, capture, compare, progress) -> dict:
    """Serve worker processes in namespaces (started by the caller once ``job.ready`` exists) until ``job.stop``."""
    from cocotb.simtime import get_sim_time

    from inagg.host.tap import TapTopology
    from inagg.testbench.bridge.bridge import CLOCK_NS
    from inagg.testbench.bridge.taps import serve_taps

    with TapTopology(job.plan, tag=job.tag) as topo:
        Path(job.ready).touch()
        start = round(get_sim_time("ns")) // CLOCK_NS
        wall, cpu = time.perf_counter(), time.process_time()
        link = await serve_taps(bridge, topo.taps, stop=lambda: os.path.exists(job.stop), faults=job.faults,
                                seed=job.seed, capture=capture, compare=compare, progress=progress)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # The workers report their own results and counters to the caller.
    return dict(results={}, exponents={}, stats={}, link=link, to_switch=0, to_hosts=0,
                cycles=round(get_sim_time("ns")) // CLOCK_NS - start, wakes=0, python_time=0.0, wall_time=wall, cpu_time=cpu)
