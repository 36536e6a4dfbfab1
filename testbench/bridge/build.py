"""Verilate :class:`~inagg.testbench.bridge.harness.BridgeHarness` once per parameter set; run cocotb modules on it.

A thin caller of :func:`inagg.testbench.sim.build`: each parameter set (and
the choice of waveforms) gets its own folder ``sim_build/bridge_<params>[_fst|_vcd]``
at the top of the repository, rebuilt only when the Verilog changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inagg.models.geometry import SwitchGeometry
from inagg.models.job import SwitchSpec
from inagg.testbench import sim
from inagg.testbench.bridge.harness import RING_DEPTH
from inagg.testbench.sim import WAVE_FORMATS, check_fst, wave_format

__all__ = ["HarnessParams", "TOPLEVEL", "WAVE_FORMATS", "wave_format", "check_fst", "build", "run"]

TOPLEVEL = "inagg_bridge"


@dataclass(frozen=True)
class HarnessParams:
    """One harness build: the switch's geometry and the depths of the rings around it.

    Parameters
    ----------
    switch : SwitchGeometry
        The switch inside (:class:`~inagg.models.geometry.SwitchGeometry`), without an exception path; with
        ``augmented`` it takes Mode III jobs.
    depth:
        Rows per ring.
    order_depth:
        Entries of the order log.
    """

    switch: SwitchGeometry
    depth: int = RING_DEPTH
    order_depth: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.switch, SwitchGeometry):
            raise TypeError(f"switch must be a SwitchGeometry, not {type(self.switch).__name__}")
        if self.switch.exception is not None:
            raise ValueError("the bridge harness builds no exception path: give a switch without one")

    @classmethod
    def for_switch(cls, spec: SwitchSpec, *, width: int, jobs: int, workers: int, augmented: bool = False,
                   **kw) -> "HarnessParams":
        """The harness of a switch described by ``spec``, built for job numbers below ``jobs`` (``augmented``:
        with Mode III)."""
        return cls(SwitchGeometry.for_spec(spec, width=width, jobs=jobs, workers=workers, augmented=augmented), **kw)

    @property
    def params(self) -> dict[str, int]:
        """The build's parameter set: :class:`BridgeHarness`'s keywords, named in its folder."""
        g = self.switch
        # Named only when set, so a build without Mode III keeps the folder (and the cache) it always had.
        return dict(ports=g.ports, width=g.width, slots=g.slots, chunk_bytes=g.chunk_bytes, jobs=g.jobs,
                    workers=g.workers, depth=self.depth, order_depth=self.order_depth,
                    **({"augmented": True} if g.augmented else {}))

    @property
    def rings(self):
        """The rings' :class:`~inagg.testbench.bridge.harness.RingGeometry`."""
        from inagg.testbench.bridge.harness import RingGeometry

        return RingGeometry(self.switch.ports, self.switch.width, self.switch.chunk_bytes, self.depth, self.order_depth,
                            self.switch.augmented)


# The model's C++ is compiled with -O3 rather than Verilator's default -Os (-O2: 1.45x the cycles per second, -O3
# with X values resolved at build time another 10%). -rdynamic exports the VPI's array functions from the
# executable, which cocotb's library does not use, for vpi.RowMemory.
_OPTIMIZE = ("-O3", "--x-assign", "fast", "--x-initial", "fast", "-CFLAGS", "-O3", "-LDFLAGS", "-rdynamic")
# A traced build is for reading the waveforms of a short run, whose time goes to writing the trace: it keeps
# Verilator's default optimisation, which halves its compile (the 2-port W = 64 harness with FST tracing: 45 s
# of compiler CPU time against 85 s with -O3), and the same X handling, so it behaves as the untraced build.
_OPTIMIZE_TRACED = ("--x-assign", "fast", "--x-initial", "fast", "-LDFLAGS", "-rdynamic")


def build(params: HarnessParams, *, waves: str | None = None):
    """Verilate the harness of ``params`` (tracing in format ``waves``, "fst" or "vcd"); return (runner, build folder)."""
    from inagg.testbench.bridge.harness import BridgeHarness

    g = params.rings
    # What the testbench reaches through VPI: the harness's ports and rings, nothing inside the switch; it writes
    # only the ingress rings.
    public = sim.Public(writable=tuple(g.ring_names[:g.ports]), readable=tuple(g.ring_names[g.ports:]))
    made = sim.build("bridge", params.params, BridgeHarness, toplevel=TOPLEVEL, public=public, optimize=_OPTIMIZE,
                     optimize_traced=_OPTIMIZE_TRACED, waves=waves)
    return made.runner, made.folder


def run(runner, folder: Path, test_module: str, *, waves_file: str | os.PathLike | None = None,
        env: dict[str, str] | None = None) -> None:
    """Run the cocotb tests of ``test_module`` (an importable module) on a build of :func:`build`; raise if any failed.

    ``waves_file`` names the waveform file of the run (the build must trace in its format).
    """
    sim.Build(runner, Path(folder), TOPLEVEL).run(test_module, waves_file=waves_file, env=env)
