"""The P4 profile of the protocol (``docs/protocol.md`` section 8) as a model switch.

A P4 switch cannot promote a lane to FP32. In this profile a lane is a
**sticky saturating** INT32 sum:

* the first contribution is stored as is;
* a lane that holds ``INT32_MIN`` or ``INT32_MAX`` (a *pinned* lane) keeps
  its value;
* any other lane becomes ``acc + x`` clamped to the INT32 range.

A result goes out as INT32 lanes, and ImmDt bit 30 (SATURATED) is set when a
lane of it is pinned. Because a pinned lane never moves, an overflow at any
point of the chunk's arrival order shows in the final lanes, so the flag is
a function of the emitted payload alone (the P4 programs compute it there)
and no overflow goes unflagged. A lane that merely reaches a bound exactly
is flagged too: that costs a resend with a smaller scale, never a wrong sum.
While SATURATED is clear the result is the exact integer sum, equal to what
:class:`~inagg.models.switch.ModelSwitch` emits.

A P4 target parses one fixed frame layout, so after checks 1-8 of
``docs/protocol.md`` section 5 a datagram whose IPv4 total length is not a
contribution's of ``C`` bytes is ``DROP_BAD_LENGTH``. A target that cannot
compute the ICRC (:data:`TNA`) skips check 9 and sends its results with the
ICRC field zero, never with a stale one; see ``docs/p4.md``.

:class:`P4Target` states each target's limits; :class:`P4ProfileSwitch` is
the reference its test vectors (``p4/tests/vectors``) come from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inagg.models import arith, wire
from inagg.models.icrc import icrc
from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import CONTRIB_HDR_LEN, ETH_LEN, ICRC_LEN, Counter
from inagg.models.switch import ModelSwitch

__all__ = ["P4Target", "V1MODEL", "TNA", "TARGETS", "saturating_accumulate", "pinned", "P4ProfileSwitch"]

_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class P4Target:
    """What one P4 target of the P4 profile can do.

    Parameters
    ----------
    name:
        The P4 architecture: ``"v1model"`` (BMv2 ``simple_switch``) or ``"tna"`` (Tofino).
    checks_icrc:
        The data plane checks the ICRC of contributions and computes a fresh
        one for every result. When False, check 9 is skipped and results carry
        an ICRC field of zero.
    chunk_bytes:
        The chunk sizes its program is built for.
    max_workers:
        Workers per job (the width of the slot's worker bitmap register).
    """

    name: str
    checks_icrc: bool
    chunk_bytes: tuple[int, ...]
    max_workers: int

    def validate(self, spec: SwitchSpec) -> None:
        """Raise ValueError when the P4 program of this target cannot be built for ``spec``."""
        if spec.chunk_bytes not in self.chunk_bytes:
            raise ValueError(f"the {self.name} program is built for chunk_bytes in {self.chunk_bytes}, "
                             f"not {spec.chunk_bytes}")
        if spec.exception is not None:
            raise ValueError(f"the {self.name} program has no exception path: give a SwitchSpec with exception=None")

    def validate_job(self, job: JobSpec) -> None:
        """Raise ValueError when ``job`` does not fit this target's slot registers."""
        if len(job.workers) > self.max_workers:
            raise ValueError(f"the {self.name} program takes at most {self.max_workers} workers per job, "
                             f"not {len(job.workers)}")


# BMv2 parses a whole chunk into header fields and hashes it with CRC-32, so
# it keeps the full frame checks; Tofino adds 32 lanes per pipeline pass and
# has no hash wide enough for the ICRC (docs/p4.md).
V1MODEL = P4Target("v1model", checks_icrc=True, chunk_bytes=(256, 1024), max_workers=64)
TNA = P4Target("tna", checks_icrc=False, chunk_bytes=(256,), max_workers=32)
TARGETS = {t.name: t for t in (V1MODEL, TNA)}


def pinned(words: np.ndarray) -> np.ndarray:
    """True where an INT32 lane (as int32 or its uint32 bits) sits at a bound of the INT32 range."""
    w = np.asarray(words).view(np.int32)
    return (w == _I32_MIN) | (w == _I32_MAX)


def saturating_accumulate(state: arith.LaneState, x: np.ndarray, first: bool = False) -> None:
    """Add contribution ``x`` into ``state`` with the P4 profile's sticky saturating INT32 sum, in place."""
    x = np.asarray(x, np.int32)
    if x.shape != state.words.shape:
        raise ValueError(f"contribution has {x.size} lanes, the slot {state.words.size}")
    if first:
        state.words[:] = x.view(np.uint32)
        return
    acc = state.words.view(np.int32)
    s = np.clip(acc.astype(np.int64) + x, _I32_MIN, _I32_MAX).astype(np.int32)
    state.words[:] = np.where(pinned(acc), acc, s).view(np.uint32)


class P4ProfileSwitch(ModelSwitch):
    """The Mode II model switch with the P4 profile's arithmetic and frame checks.

    Its slot rules, ingress-port binding and R_Key check are the model
    switch's: the programs compare the ingress port with the port of the
    QPN's ``workers`` entry, and keep one first bit per slot ("Liveness").

    Parameters
    ----------
    target:
        A :class:`P4Target` (:data:`V1MODEL` or :data:`TNA`); the switch and
        every job added are checked against its limits.
    spec:
        The switch; see :class:`~inagg.models.job.SwitchSpec`.
    """

    def __init__(self, target: P4Target, spec: SwitchSpec | None = None):
        if not isinstance(target, P4Target):
            raise TypeError(f"target must be a P4Target, not {type(target).__name__}")
        spec = spec or SwitchSpec(chunk_bytes=target.chunk_bytes[0])
        target.validate(spec)
        super().__init__(spec)
        self.target = target
        # IPv4 total length of a contribution: the one layout the P4 parser knows.
        self.contrib_total = CONTRIB_HDR_LEN - ETH_LEN + spec.chunk_bytes + ICRC_LEN

    def add_job(self, job: JobSpec) -> None:
        self.target.validate_job(job)
        super().add_job(job)

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        if not 0 <= port < self.spec.ports:
            raise ValueError(f"port {port} does not exist: the switch has {self.spec.ports} ports")
        f = bytes(frame)
        if self._other_layout(f):
            self.counters[Counter.RX_FRAMES] += 1
            return self._count(Counter.DROP_BAD_LENGTH)
        if not self.target.checks_icrc and not isinstance(wire.check_datagram(f), Counter):
            # Without check 9 a frame is taken as if its ICRC were right.
            end = ETH_LEN + self.contrib_total
            f = f[:end - ICRC_LEN] + icrc(f[:end - ICRC_LEN]) + f[end:]
        return super().receive(port, f)

    def _other_layout(self, f: bytes) -> bool:
        """True for a frame that passes checks 1-8 but is not a contribution's length."""
        total = wire.check_datagram(f)
        return not isinstance(total, Counter) and total != self.contrib_total

    def _accumulate(self, lanes: arith.LaneState, x: np.ndarray, first: bool) -> None:
        saturating_accumulate(lanes, x, first=first)

    def _lanes_out(self, lanes: arith.LaneState) -> tuple[bytes, bool, bool]:
        return lanes.words.view(np.int32).astype(">i4").tobytes(), False, bool(pinned(lanes.words).any())

    def _result(self, job, worker, slot):
        port, frame = super()._result(job, worker, slot)
        if not self.target.checks_icrc:
            frame = frame[:-ICRC_LEN] + bytes(ICRC_LEN)
        return port, frame
