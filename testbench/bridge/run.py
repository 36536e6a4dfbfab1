"""Run workers' all-reduces on the Verilated RTL switch from an ordinary Python process.

cocotb runs inside the simulator, so :func:`run_rtl` builds the harness
(once per parameter set, cached), pickles a :class:`~inagg.testbench.bridge.session.Job`
into a temporary folder, runs the simulator on
:mod:`inagg.testbench.bridge.session`, and returns the
:class:`~inagg.testbench.bridge.session.Outcome` it wrote.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inagg.host.controller import Plan
from inagg.host.link import Faults
from inagg.host.rc_worker import RC_MODES
from inagg.host.worker import Timing
from inagg.models.job import Mode
from inagg.models.protocol import MAX_WORKERS, Counter
from inagg.testbench.bridge.bridge import CLOCK_NS
from inagg.testbench.bridge.build import HarnessParams, build, run, wave_format
from inagg.testbench.bridge.session import JOB_ENV, Job, Outcome, read_progress

__all__ = ["harness_params", "rtl_timing", "rtl_hop_timeout", "netns_timing", "run_rtl"]


def harness_params(plan: Plan, width: int, **kw) -> HarnessParams:
    """The smallest harness that holds ``plan``: its ports and slots, its job numbers and workers per job, and
    Mode III when a job of the plan runs it."""
    return HarnessParams.for_switch(plan.switch, width=width, jobs=max(j.job for j in plan.jobs) + 1,
                                    workers=max(len(j.workers) for j in plan.jobs),
                                    augmented=any(j.mode is Mode.AUGMENTED for j in plan.jobs), **kw)


def _drain_cycles(plan: Plan, width: int) -> int:
    """Cycles the slot engine takes for every worker's full window (one beat a cycle from all ports together):
    the longest queue a frame into the switch can meet."""
    beats = plan.switch.chunk_bytes * 8 // width
    return sum(j.window * len(j.workers) for j in plan.jobs) * beats


def rtl_timing(plan: Plan, width: int) -> Timing:
    """Retransmission timers in simulated seconds for ``plan`` at ``width`` bits.

    The slot engine takes one beat per cycle from all ports together, so
    the longest queue a contribution can meet is every worker's full
    window: ``window * workers * chunk beats`` cycles. The first timeout is
    twice that, so a timeout means a loss, not a queue. A plan of RC jobs
    (Modes II and III) gets eight times that: an RC QP's timeout does not
    back off, and its Go-Back-N sends the whole window again, so every
    early timeout costs a window (3 workers, window 16, 64 KiB, 2 % loss
    and duplication, 5 % reordering in Mode III: at twice the queue 227
    chunks sent again and 21,761 cycles, at eight times 31 and 14,838).
    """
    drain = _drain_cycles(plan, width) * CLOCK_NS * 1e-9
    if any(j.mode in RC_MODES for j in plan.jobs):
        drain *= 4
    return Timing(timeout=2 * drain, max_timeout=32 * drain, tries=30)


def rtl_hop_timeout(plan: Plan, width: int) -> int:
    """The ``HOP_TIMEOUT`` register (cycles) of a Mode III ``plan`` at ``width`` bits, with the workers inside
    the simulation on :func:`rtl_timing`.

    A result can wait behind every worker's window of results on its way
    out (the emitters send a completed chunk's results one worker after
    another), and the child's ACK of it behind every worker's window of
    contributions on its way in: twice the engine's drain of every
    worker's window, and one round of the timers' visits (3 cycles per
    (job, child) of the tables), so a timer that runs out means a lost
    result or ACK, not a queue. That is a quarter of the workers' first
    timeout, so a slot held by a lost result is sent again before the
    contribution refused for it (``DROP_BUFFER_BUSY``, not ACKed) times
    out at its host. (One drain was too short: 4 workers, 256 KiB, window
    128, loss and duplication 1 %, reordering 2 %: 7,614 results sent
    again and 242,559 cycles, against 3,711 and 130,024 at two, four,
    eight and sixteen drains, where no timer ran out early.)
    """
    visits = 3 * (max(j.job for j in plan.jobs) + 1) * MAX_WORKERS
    return 2 * _drain_cycles(plan, width) + visits


_START_TIMEOUT = 120.0  # seconds for the simulator to come up and create the TAP devices
_PROGRESS_POLL = 0.2  # seconds between two looks at the simulation's progress file


def netns_timing(plan: Plan) -> Timing:
    """Real-time retransmission timers for workers in namespaces in front of the simulated switch.

    The simulation takes a few hundred microseconds of wall-clock time per
    packet (``docs/results/emulation.md``): the first timeout allows 2 ms
    for each packet of every worker's full window, and a quarter second at
    least.
    """
    packets = sum(j.window * len(j.workers) for j in plan.jobs)
    timeout = max(0.25, 2e-3 * packets)
    return Timing(timeout=timeout, max_timeout=8 * timeout, tries=20)


def run_rtl(plan: Plan, data: dict[int, np.ndarray], *, width: int = 512, net: str = "memory",
            faults: Faults | None = None, seed: int = 0, timing: Timing | None = None, compare: bool = False,
            waves: str | os.PathLike | None = None, pcap: str | None = None,
            progress: Callable[[int], None] | None = None) -> Outcome:
    """All-reduce ``data`` (float32, by worker port) through the RTL switch configured with ``plan``.

    ``net`` is ``"memory"`` (the workers run inside the simulation, in
    simulated time) or ``"netns"`` (each worker a process in its own
    namespace behind a TAP device, on the real clock; needs root).
    ``compare`` runs the model switch on the same traffic (see
    :class:`~inagg.testbench.bridge.compare.LiveCompare`); ``waves`` names a
    waveform file for the run (``.fst``, or ``.vcd``); ``pcap`` a capture of every frame on
    the link. ``progress(n)``, when given, is called from another thread a
    few times a second while the simulation runs: ``n`` is the chunks the
    workers completed (with ``net="netns"``: the result frames the switch
    sent). Raises ``AssertionError`` when the simulation fails (the
    simulator's log says why) and what a worker raises.
    """
    if net not in ("memory", "netns"):
        raise ValueError(f"net must be 'memory' or 'netns', not {net!r}")
    if net == "netns":
        from inagg.host.netns import require_root

        require_root()
        timing = timing or netns_timing(plan)
    params = harness_params(plan, width)
    if params.switch.augmented and net != "memory":
        # The hop timers count the simulator's cycles, which the workers' real clock in namespaces does not keep.
        raise ValueError("Mode III runs on the RTL over the memory network")
    runner, folder = build(params, waves=wave_format(waves) if waves is not None else None)
    with tempfile.TemporaryDirectory(prefix="inagg-rtl-") as tmp:
        tmp = Path(tmp)
        job = Job(plan=plan, rings=params.rings, data=data if net == "memory" else {},
                  timing=timing or rtl_timing(plan, width), faults=faults or Faults(), seed=seed, compare=compare,
                  hop_timeout=rtl_hop_timeout(plan, width) if params.switch.augmented else None,
                  pcap=pcap, out=str(tmp / "out.pkl"), net=net, tag=uuid.uuid4().hex[:6],
                  ready=str(tmp / "ready"), stop=str(tmp / "stop"),
                  progress=str(tmp / "progress") if progress is not None else "")
        with open(tmp / "job.pkl", "wb") as f:
            pickle.dump(job, f)
        env = {JOB_ENV: str(tmp / "job.pkl")}

        def simulate() -> None:
            run(runner, folder, "inagg.testbench.bridge.session", waves_file=waves, env=env)

        done = threading.Event()
        watcher = None
        if progress is not None:
            watcher = threading.Thread(target=_watch, args=(job.progress, progress, done), name="inagg-rtl-progress")
            watcher.start()
        try:
            if net == "memory":
                simulate()
                workers = None
            else:
                workers = _netns_workers(job, data, simulate)
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        with open(job.out, "rb") as f:
            out: Outcome = pickle.load(f)
    if workers is not None:
        out.results = {p: w.result for p, w in workers.items()}
        out.exponents = {p: w.exponent for p, w in workers.items()}
        out.stats = {p: w.stats for p, w in workers.items()}
        out.to_switch = out.counters[Counter.RX_FRAMES]
        out.to_hosts = out.counters[Counter.TX_RESULTS]
    return out


def _watch(path: str, progress: Callable[[int], None], done: threading.Event) -> None:
    """Hand ``progress`` every new count the simulation writes to ``path`` until ``done`` is set, and the last."""
    last = None
    while True:
        finished = done.wait(_PROGRESS_POLL)
        count = read_progress(path)
        if count is not None and count != last:
            progress(count)
            last = count
        if finished:
            return


@dataclass
class _WorkerOutcome:
    result: np.ndarray
    exponent: int
    stats: dict


def _netns_workers(job: Job, data: dict[int, np.ndarray], simulate) -> dict[int, _WorkerOutcome]:
    """Run the simulator in a thread; once its TAP devices are up, one worker process per port; collect them."""
    import multiprocessing as mp

    from inagg.host.tap import TapTopology

    failure: list[BaseException] = []

    def sim() -> None:
        try:
            simulate()
        except BaseException as e:  # reported by the caller
            failure.append(e)

    thread = threading.Thread(target=sim, name="inagg-rtl-sim")
    thread.start()
    procs, conns = [], {}
    try:
        deadline = time.monotonic() + _START_TIMEOUT
        while not os.path.exists(job.ready):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the RTL simulation did not bring its TAP devices up") from (failure or [None])[0]
            time.sleep(0.05)
        names = TapTopology(job.plan, tag=job.tag)  # the namespace names only; the simulator created them
        ctx = mp.get_context("fork")  # the children inherit the data instead of receiving it pickled
        for spec in job.plan.jobs:
            for r, w in enumerate(spec.workers):
                parent, child = ctx.Pipe()
                conns[w.port] = parent
                procs.append(ctx.Process(target=_worker, name=f"inagg-rtl-worker{w.port}",
                                         args=(names.worker_ns(w.port), names.worker_if, job.plan.switch, spec, r,
                                               data[w.port], job.timing, child)))
                procs[-1].start()
        outcomes = {}
        for port, conn in conns.items():
            kind, value = conn.recv()
            if kind == "error":
                raise value
            outcomes[port] = value
        return outcomes
    finally:
        Path(job.stop).touch()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        thread.join()
        if failure:
            raise failure[0]


def _worker(ns, ifname, switch, job, rank, data, timing, conn) -> None:
    from inagg.host import netns
    from inagg.host.api import Group, allreduce

    try:
        netns.enter(ns)
        group = Group(switch, job, rank, netns.PacketPort(ifname), timing=timing)
        result = allreduce(data, group)
        conn.send(("ok", _WorkerOutcome(result, group.last_exponent, dict(group.worker.stats))))
    except Exception as e:  # the parent raises it
        conn.send(("error", e))
