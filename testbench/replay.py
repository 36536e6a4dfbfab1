"""Replay what the RTL saw into the model switch, in the order the RTL's slot engine took it.

Frames travel from each port to the slot engine in order, but the engine
merges the ports in an order that depends on timing. The RTL reports that
order (the port of every contribution its engine takes); :func:`replay`
feeds each port's frames to :class:`~inagg.models.switch.ModelSwitch` in
that merged order. Which frames the engine takes is the model's own
decision: a frame reached the engine when one of the slot-rule counters
moved. A Mode II ACK never does: it leaves its port for the ACK
reflectors, and the model sends its reflection when it takes the ACK.

With an exception path the engine takes a diverted frame twice: where it
diverts (reported with :data:`DIVERTED`), which the model must not see yet,
and where it comes back to its overflow slot or is refused (reported as
port ``ports``, the exception path's input), which is where the model
takes it: the oldest diverted frame not taken yet. Whether a diverted frame
passed the ingress checks is asked of a second model with the same jobs
(those checks are stateless).

A teardown (the RTL's ``torn`` strobe) is an entry :class:`RemoveJob`, a
job installed later an :class:`AddJob`, both where they took effect; a
frame that passed its port's checks before its job was torn down and that
the engine then dropped is reported with :data:`GONE`.

Mode III adds what only its timing decides (the switch's ``hop`` stream):
:class:`AckTaken` where a host's ACK of results from a port took effect
(the model takes that port's next Mode III ACK there; the ACKs of a port
keep their order, but not their place among its contributions, which go
another way; one whose job was torn down on its way is ``gone``), :class:`TimerRanOut` where a child's ACK timer ran out
(``AugmentedJob.expire``), and :data:`RESENT` where a result a NAK or a
timer asked for went out (:data:`SKIPPED` where the RTL found it ACKed by
every child by then and sent nothing): the model's results sent again
wait from the ACK or timer that asked for them to these entries, one each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inagg.models.frame import BTH, CONTRIBUTION, Opcode
from inagg.models.job import JobSpec, Mode
from inagg.models.protocol import Counter, split_qpn
from inagg.models.switch import ModelSwitch

__all__ = ["ENGINE_COUNTERS", "reached_engine", "is_ack", "mode_iii_ack", "take_ack", "take_back", "DIVERTED", "GONE",
           "RESENT", "SKIPPED", "RemoveJob", "AddJob", "AckTaken", "TimerRanOut", "is_hop", "take_hop", "replay",
           "assert_frames_match"]

_OPCODE = BTH.slice("opcode", CONTRIBUTION.offset("bth"))
_DQPN = BTH.slice("dqpn", CONTRIBUTION.offset("bth"))

ENGINE_COUNTERS = (Counter.RX_CONTRIB, Counter.DUP_CONTRIB, Counter.DROP_STALE, Counter.DROP_WINDOW,
                   Counter.DROP_COLLISION, Counter.EXC_REFUSED, Counter.DROP_PSN_AHEAD, Counter.DROP_BUFFER_BUSY)
DIVERTED = 1 << 16
"""Flag of an ``order`` entry: the engine took this frame of the port and diverted it."""
GONE = 1 << 17
"""Flag of an ``order`` entry: the engine took this frame of the port and dropped it, its job torn down."""


@dataclass(frozen=True)
class RemoveJob:
    """An ``order`` entry: ``ModelSwitch.remove_job(job)`` took effect here."""

    job: int


@dataclass(frozen=True)
class AddJob:
    """An ``order`` entry: ``spec`` was installed here."""

    spec: JobSpec


@dataclass(frozen=True)
class AckTaken:
    """An ``order`` entry: the next Mode III ACK of results from ``port`` took effect here; ``gone``: its job
    was torn down after the port's checks, and the model drops it as a frame of a job that is gone."""

    port: int
    gone: bool = False


@dataclass(frozen=True)
class TimerRanOut:
    """An ``order`` entry: the ACK timer of child ``worker`` of Mode III job ``job`` ran out here."""

    job: int
    worker: int


RESENT = object()
"""An ``order`` entry: the oldest result the model sent again (after a NAK or a timer) went out here."""
SKIPPED = object()
"""An ``order`` entry: the oldest result the model sent again did not go out: by the time the RTL came to
send it, every child (the one that asked too) had ACKed it and its slot held another result. The model's
frame is dropped and its count taken back (``HOP_RESENDS``, ``TX_RESULTS``): the model sends a result again
at once, the RTL as it reaches the slot."""

_DROPS = tuple(c for c in Counter if c.name.startswith("DROP_"))
# How the model drops a frame whose job is gone: a UC frame names no job, an RC one (Modes II and III) has
# an opcode that only a job of its mode takes.
_GONE = (Counter.DROP_UNKNOWN_QPN, Counter.DROP_BAD_OPCODE)


def mode_iii_ack(model: ModelSwitch, frame: bytes) -> bool:
    """Whether ``frame`` is an RC ACK to the switch QPN of a Mode III job the model has."""
    if len(frame) < CONTRIBUTION.offset("bth") + BTH.size or frame[_OPCODE] != bytes([Opcode.RC_ACK]):
        return False
    split = split_qpn(int.from_bytes(frame[_DQPN], "big"))
    job = None if split is None else model.jobs.get(split[0])
    return job is not None and job.spec.mode is Mode.AUGMENTED


def take_back(model: ModelSwitch) -> None:
    """A result the model sent again went nowhere in the RTL (:data:`SKIPPED`): take back its counts."""
    model.counters[Counter.HOP_RESENDS] -= 1
    model.counters[Counter.TX_RESULTS] -= 1


def take_ack(model: ModelSwitch, port: int, acks: deque, gone: bool = False) -> list[tuple[int, bytes]]:
    """Feed ``port``'s Mode III ACKs to ``model`` up to the first its checks pass (with ``gone``: the first
    it drops as one of a job that is gone); those before were dropped at the port. Return what the model
    sends for it; None if no ACK of the port is that one."""
    while acks:
        counters = _GONE if gone else _DROPS
        before = [model.counters[c] for c in counters]
        sent = model.receive(port, acks.popleft())
        if ([model.counters[c] for c in counters] != before) == gone:
            return sent
    return None


def is_hop(entry) -> bool:
    """Whether ``entry`` of a Mode III order is one of the hop's (an ACK, a timer, a result sent again or not)."""
    return isinstance(entry, (AckTaken, TimerRanOut)) or entry is RESENT or entry is SKIPPED


def take_hop(model: ModelSwitch, entry, acks: Sequence[deque] | Mapping[int, deque],
             again: deque) -> list[tuple[int, bytes]]:
    """Let ``model`` follow the hop's ``entry`` (:func:`is_hop`) where the RTL's order put it.

    ``acks`` holds each port's Mode III ACKs not yet taken, ``again`` the results the model sent again that
    have not yet gone out of the RTL. Returns the results that go out at this entry (a :data:`RESENT`'s);
    raises ``LookupError`` saying what the RTL did that the model cannot follow.
    """
    if isinstance(entry, AckTaken):
        sent_again = take_ack(model, entry.port, acks[entry.port], entry.gone)
        if sent_again is None:
            raise LookupError(f"takes an ACK from port {entry.port}, where the model finds none left")
        again.extend(sent_again)
        return []
    if isinstance(entry, TimerRanOut):
        again.extend(model.modes[entry.job].expire(entry.worker))
        return []
    if not again:
        raise LookupError("sends a result again that the model does not")
    sent = again.popleft()
    if entry is RESENT:
        return [sent]
    take_back(model)
    return []


def reached_engine(model: ModelSwitch, port: int, frame: bytes, out: dict[int, list[bytes]]) -> bool:
    """Feed ``frame`` of ``port`` to ``model``, appending what it sends to ``out`` (lists by port); whether the
    frame reached the slot engine (a slot-rule counter moved), rather than being dropped or passed on at its
    port's checks."""
    before = [model.counters[c] for c in ENGINE_COUNTERS]
    bad_address = model.counters[Counter.DROP_BAD_ADDRESS]
    for p, f in model.receive(port, frame):
        out[p].append(f)
    if [model.counters[c] for c in ENGINE_COUNTERS] != before:
        return True
    if model.counters[Counter.DROP_BAD_ADDRESS] == bad_address:
        return False
    # Mode II's engine counts a contribution of another chunk than its slot holds as the ingress
    # checks count a bad VA. Those checks are stateless, and the engine's needs a held slot: a
    # switch with the same jobs and every slot empty tells them apart.
    fresh = ModelSwitch(model.spec)
    for job in model.jobs.values():
        fresh.add_job(job.spec)
    fresh.receive(port, frame)
    return fresh.counters[Counter.DROP_BAD_ADDRESS] == 0


def replay(model: ModelSwitch, sent: dict[int, list[bytes]], order: list) -> dict[int, list[bytes]]:
    """Feed ``sent`` (frames per port, in sending order) to ``model`` as the RTL's ``order`` merged them.

    ``order`` holds a port for each frame the engine took, ``port | DIVERTED``
    for one it diverted, ``model.spec.ports`` where the oldest diverted
    frame came back or was refused, ``port | GONE`` for a frame the engine
    dropped because its job's teardown had taken effect, and
    :class:`RemoveJob` and :class:`AddJob` where the jobs changed (a frame
    that never reached the engine is fed to the model with the next entry
    of its port that did, so no such frame may be sent across one of
    these). Returns the frames the model sends, per port. Raises ``AssertionError`` when the order cannot be the RTL's: it
    names a port that has no frame left the model would take, a diverted
    frame that is not there, or frames that the model would take are left
    over.
    """
    queues = {p: deque(f for f in frames if not mode_iii_ack(model, f)) for p, frames in sent.items()}
    acks = {p: deque(f for f in sent.get(p, ()) if mode_iii_ack(model, f)) for p in range(model.spec.ports)}
    out: dict[int, list[bytes]] = {p: [] for p in range(model.spec.ports)}
    diverted: deque[tuple[int, bytes]] = deque()
    again: deque[tuple[int, bytes]] = deque()  # results the model sent again, not yet out of the RTL
    probe = None
    for n, entry in enumerate(order):
        if is_hop(entry):
            try:
                for p, f in take_hop(model, entry, acks, again):
                    out[p].append(f)
            except LookupError as e:
                raise AssertionError(f"the RTL's entry #{n} {e}") from None
            continue
        if isinstance(entry, (RemoveJob, AddJob)):
            for m in (model, probe) if probe is not None else (model,):
                if isinstance(entry, RemoveJob):
                    m.remove_job(entry.job)
                else:
                    m.add_job(entry.spec)
            continue
        port = entry & ~(DIVERTED | GONE)
        if port == model.spec.ports:
            if not diverted or not reached_engine(model, *diverted.popleft(), out):
                raise AssertionError(f"the RTL's contribution #{n} is a diverted frame the model does not have")
            continue
        q = queues.get(port, deque())
        while True:
            if not q:
                raise AssertionError(f"the RTL's contribution #{n} came from port {port}, "
                                     "where the model finds none left")
            frame = q.popleft()
            if entry & GONE:
                gone = [model.counters[c] for c in _GONE]
                if reached_engine(model, port, frame, out):
                    raise AssertionError(f"the RTL's contribution #{n} found its job gone, the model takes it")
                if [model.counters[c] for c in _GONE] != gone:
                    break
            elif entry & DIVERTED:
                if probe is None:
                    probe = ModelSwitch(model.spec)
                    for job in model.jobs.values():
                        probe.add_job(job.spec)
                if reached_engine(probe, port, frame, {p: [] for p in range(model.spec.ports)}):
                    diverted.append((port, frame))
                    break
                model.receive(port, frame)
            elif reached_engine(model, port, frame, out):
                break
    if diverted:
        raise AssertionError(f"{len(diverted)} diverted frames never came back")
    for port, q in acks.items():
        if take_ack(model, port, q) is not None:
            raise AssertionError(f"the model takes an ACK of port {port} that the RTL's engine never took")
    if again:
        raise AssertionError(f"the model sent {len(again)} results again that the RTL did not")
    for port, q in queues.items():
        for frame in q:
            if reached_engine(model, port, frame, out):
                raise AssertionError(f"the model takes a frame of port {port} that the RTL's engine never took")
    return out


def is_ack(frame: bytes) -> bool:
    """Whether ``frame`` (from the switch) is an RC ACK or NAK, which a port's egress puts between results as
    it comes: a port's ACKs and its results each keep the model's order, not their merge."""
    return frame[_OPCODE] == bytes([Opcode.RC_ACK])


def _of_kind(frames: list[bytes], acks: bool) -> list[bytes]:
    """The RC ACK frames of ``frames`` (``acks``) or the others, in order."""
    return [f for f in frames if is_ack(f) == acks]


def assert_frames_match(received: dict[int, list[bytes]], expected: dict[int, list[bytes]]) -> None:
    """Every port's frames the RTL sent are the model's (:func:`replay`), byte for byte: its results in the
    model's order and its reflected Mode II ACKs in the model's order. The two orders are each the
    model's, not their merge: a port's egress puts a reflected ACK between results as it comes."""
    for p, want_all in expected.items():
        for kind, acks in (("frame", False), ("ACK", True)):
            got, want = _of_kind(received[p], acks), _of_kind(want_all, acks)
            for n, (g, w) in enumerate(zip(got, want)):
                assert g == w, f"port {p} {kind} {n} differs from the model:\n  rtl   {g.hex()}\n  model {w.hex()}"
            assert len(got) == len(want), f"port {p}: RTL sent {len(got)} {kind}s, the model {len(want)}"
