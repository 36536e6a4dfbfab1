"""Run the model switch beside the RTL on the same traffic and report every frame that differs.

:class:`LiveCompare` is :func:`inagg.testbench.replay.replay` done as the
run goes, so a demo of any length needs no record of its frames: each frame
that entered an RTL port waits in that port's queue until the RTL's order
log names the port, then the model takes the port's frames up to the first
one that reaches its slot logic (the frames before it were dropped by the
port's checks, in the RTL as in the model, or were Mode II ACKs, which the
port passes to its reflector). What the model sends is matched, port by
port and in order, against what the RTL sent: a port's results in the
model's order, and its reflected ACKs in the model's order, each apart
(:func:`~inagg.testbench.replay.is_ack`), since the port's egress puts a
reflected ACK between results as it comes.

With Mode III the RTL's order also says where the hop's ACKs and timers
took effect and where its Go-Back-N frames went through the engine, and
the model takes them there as :func:`~inagg.testbench.replay.replay` does:
a port's Mode III ACKs wait apart from its contributions until an
:class:`~inagg.testbench.replay.AckTaken` of the port, a
:class:`~inagg.testbench.replay.TimerRanOut` runs the model's timer out,
and the results the model sends again wait for a
:data:`~inagg.testbench.replay.RESENT` (or
:data:`~inagg.testbench.replay.SKIPPED`) each.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inagg.models.job import JobSpec, SwitchSpec
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.testbench.replay import is_ack, is_hop, mode_iii_ack, reached_engine, take_ack, take_hop

__all__ = ["LiveCompare", "Difference"]


@dataclass(frozen=True)
class Difference:
    """One place where the RTL and the model disagree."""

    port: int
    index: int          # number among the port's results, or among its ACKs; -1 for a counter or an unmatched order
    what: str
    rtl: str = ""       # hex of the RTL's frame, or its counter value
    model: str = ""

    def __str__(self) -> str:
        head = f"port {self.port} frame {self.index}: {self.what}" if self.index >= 0 else self.what
        return head + (f"\n  rtl   {self.rtl}\n  model {self.model}" if self.rtl or self.model else "")


@dataclass
class LiveCompare:
    """The model switch fed in the RTL's arrival order; :attr:`differences` lists every disagreement."""

    spec: SwitchSpec
    jobs: tuple[JobSpec, ...]
    keep: int = 20  # differences kept in full (all are counted)
    differences: list[Difference] = field(default_factory=list)
    count: int = 0
    matched: int = 0

    def __post_init__(self) -> None:
        self.model = ModelSwitch(self.spec)
        for job in self.jobs:
            self.model.add_job(job)
        self._sent = [deque() for _ in range(self.spec.ports)]
        self._acks = [deque() for _ in range(self.spec.ports)]  # Mode III ACKs of results, not yet taken
        self._again: deque[tuple[int, bytes]] = deque()  # results the model sent again, not yet out of the RTL
        # By (port, is_ack): a port's results and its ACKs are matched apart, each in its own order.
        kinds = [(p, a) for p in range(self.spec.ports) for a in (False, True)]
        self._want = {k: deque() for k in kinds}
        self._got = {k: deque() for k in kinds}
        self._index = {k: 0 for k in kinds}

    def _differ(self, d: Difference) -> None:
        self.count += 1
        if len(self.differences) < self.keep:
            self.differences.append(d)

    def sent(self, port: int, frame: bytes) -> None:
        """``frame`` went into RTL port ``port``."""
        (self._acks if mode_iii_ack(self.model, frame) else self._sent)[port].append(frame)

    def _want_all(self, frames) -> None:
        for p, f in frames:
            self._want[p, is_ack(f)].append(f)

    def _take(self, port: int, frame: bytes) -> bool:
        out = {p: [] for p in range(self.spec.ports)}
        reached = reached_engine(self.model, port, frame, out)
        self._want_all((p, f) for p, frames in out.items() for f in frames)
        return reached

    def _hop(self, entry) -> None:
        """A Mode III entry of the RTL's order: an ACK or a timer took effect, or a result went again (or not)."""
        try:
            self._want_all(take_hop(self.model, entry, self._acks, self._again))
        except LookupError as e:
            self._differ(Difference(getattr(entry, "port", -1), -1, f"the RTL {e}"))

    def taken(self, ports: list) -> None:
        """The RTL's slot engine took a contribution from each of ``ports``, in this order (with Mode III, the
        entries of :meth:`_hop` among them)."""
        for port in ports:
            if is_hop(port):
                self._hop(port)
                continue
            q = self._sent[port]
            while True:
                if not q:
                    self._differ(Difference(port, -1, f"the RTL took a contribution from port {port} "
                                                      "where the model finds none left"))
                    break
                if self._take(port, q.popleft()):
                    break
        self._match()

    def received(self, port: int, frame: bytes) -> None:
        """The RTL sent ``frame`` on ``port``."""
        self._got[port, is_ack(frame)].append(frame)
        self._match()

    @staticmethod
    def _kind(ack: bool) -> str:
        return "an ACK" if ack else "a frame"

    def _match(self) -> None:
        for k, got in self._got.items():
            want = self._want[k]
            while got and want:
                g, w = got.popleft(), want.popleft()
                if g == w:
                    self.matched += 1
                else:
                    self._differ(Difference(k[0], self._index[k], f"the {'ACKs' if k[1] else 'frames'} differ",
                                            g.hex(), w.hex()))
                self._index[k] += 1

    def finish(self, rtl_counters: dict[Counter, int]) -> list[Difference]:
        """After the run: the rest of every port's frames go to the model, then frames and counters are compared.

        Returns :attr:`differences`.
        """
        for port, q in enumerate(self._sent):
            while q:
                if self._take(port, q.popleft()):
                    self._differ(Difference(port, -1, f"the model takes a frame of port {port} that the RTL's "
                                                      "engine never took"))
        for port, q in enumerate(self._acks):
            if take_ack(self.model, port, q) is not None:
                self._differ(Difference(port, -1, f"the model takes an ACK of port {port} that the RTL never took"))
        if self._again:
            self._differ(Difference(-1, -1, f"the model sent {len(self._again)} results again that the RTL did not"))
        self._match()
        for k, got in self._got.items():
            p, kind = k[0], self._kind(k[1])
            for g in got:
                self._differ(Difference(p, self._index[k], f"the RTL sent {kind} the model does not", g.hex()))
                self._index[k] += 1
            for w in self._want[k]:
                self._differ(Difference(p, self._index[k], f"the model sent {kind} the RTL does not", "", w.hex()))
                self._index[k] += 1
            got.clear()
            self._want[k].clear()
        for c in Counter:
            rtl, model = rtl_counters[c], self.model.counters[c] & 0xFFFFFFFF
            if rtl != model:
                self._differ(Difference(-1, -1, f"counter {c.name} differs", str(rtl), str(model)))
        return self.differences
