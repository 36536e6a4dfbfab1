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
from pathlib import Path

import numpy as np

from ...host.controller import Plan
from ...host.link import Faults
from ...host.worker import Timing
from .bridge import CLOCK_NS
from .build import HarnessParams, build, run
from .session import JOB_ENV, Job, Outcome

__all__ = ["harness_params", "rtl_timing", "run_rtl"]


def harness_params(plan: Plan, width: int, **kw) -> HarnessParams:
    """The smallest harness that holds ``plan``: its ports and slots, its job numbers and workers per job."""
    return HarnessParams.for_switch(plan.switch, width=width, jobs=max(j.job for j in plan.jobs) + 1,
                                    workers=max(len(j.workers) for j in plan.jobs), **kw)


def rtl_timing(plan: Plan, width: int) -> Timing:
    """Retransmission timers in simulated seconds for ``plan`` at ``width`` bits.

    The slot engine takes one beat per cycle from all ports together, so
    the longest queue a contribution can meet is every worker's full
    window: ``window * workers * chunk beats`` cycles. The first timeout is
    twice that, so a timeout means a loss, not a queue.
    """
    beats = plan.switch.chunk_bytes * 8 // width
    drain = sum(j.window * len(j.workers) for j in plan.jobs) * beats * CLOCK_NS * 1e-9
    return Timing(timeout=2 * drain, max_timeout=32 * drain, tries=30)


def run_rtl(plan: Plan, data: dict[int, np.ndarray], *, width: int = 512, faults: Faults | None = None,
            seed: int = 0, timing: Timing | None = None, compare: bool = False,
            waves: str | os.PathLike | None = None, pcap: str | None = None) -> Outcome:
    """All-reduce ``data`` (float32, by worker port) through the RTL switch configured with ``plan``.

    ``compare`` runs the model switch on the same traffic (see
    :class:`~inagg.testbench.bridge.compare.LiveCompare`); ``waves`` names an
    FST file for the run's waveforms; ``pcap`` a capture of every frame on
    the link. Raises ``AssertionError`` when the simulation fails (the
    simulator's log says why).
    """
    params = harness_params(plan, width)
    runner, folder = build(params, waves=waves is not None)
    with tempfile.TemporaryDirectory(prefix="inagg-rtl-") as tmp:
        job = Job(plan=plan, harness=params.__dict__.copy(), data=data, timing=timing or rtl_timing(plan, width),
                  faults=faults or Faults(), seed=seed, compare=compare, pcap=pcap, out=str(Path(tmp) / "out.pkl"))
        path = Path(tmp) / "job.pkl"
        with open(path, "wb") as f:
            pickle.dump(job, f)
        run(runner, folder, "inagg.testbench.bridge.session", waves_file=waves, env={JOB_ENV: str(path)})
        with open(job.out, "rb") as f:
            return pickle.load(f)
