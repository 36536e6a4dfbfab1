"""Switch state per job per mode, read off the model switch's own structures (``docs/protocol.md`` section 9).

:func:`job_state` installs one job of a mode on a
:class:`~inagg.models.switch.ModelSwitch` and counts the bits of every field
the model keeps for it: the lane words of each slot, every other field of a
slot, one value per child for a list field of the job, the job's own fields.
Configuration (addresses, the job's spec) is not state. A field the model
gains without a width here fails the count, so the table in
``docs/results/modes.md`` cannot silently leave state out.

:data:`STATE_OF` maps each mode the model switch implements to its counting
function; a mode the switch gains adds one entry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from inagg.models.job import JobSpec, Mode, SwitchSpec, WorkerSpec
from inagg.models.protocol import CHUNK_BYTES_DEFAULT, CHUNK_MOD, MAX_WORKERS, QPN_JOB_BITS
from inagg.models.rc import PSN_BITS, Requester, Responder
from inagg.models.switch import ModelSwitch, SlotState
from inagg.models.terminated import TerminatedJob

__all__ = ["JobState", "STATE_OF", "TIMER_BITS", "job_state", "window_for"]

# A timer is a deadline on the switch's clock; the model keeps it as a float, a switch as a counter this wide.
TIMER_BITS = 32
# Fields of a job's objects that are its configuration (fixed when the job is installed), not protocol state.
_CONFIG = frozenset({"spec", "switch", "all", "to", "up", "timeout", "data_in", "data_out", "up_data",
                     "down_data", "senders", "receivers", "need"})


@dataclass(frozen=True)
class JobState:
    """The bits of switch state one job holds: slot lanes, the rest of each slot, per child, per job."""

    mode: Mode
    workers: int
    slots: int
    lane_bytes: int       # the slots' 32-bit lane words
    slot_bits: int        # per slot beside its lanes: key, bitmaps, count, flags, promotion bits
    child_bits: int       # per child (worker or child switch): PSNs, flags, timers
    job_bits: int         # per job: PSNs, flags and timers kept once

    @property
    def total_bytes(self) -> int:
        """Every bit of the job's state, in whole bytes."""
        return self.lane_bytes + -(-(self.slots * self.slot_bits + self.workers * self.child_bits
                                     + self.job_bits) // 8)


def _widths(n: int) -> tuple[dict[str, int], dict[str, int]]:
    """Bits of each state field the models keep as a Python int or bool: per slot, and per child or per job.

    A slot's bitmaps have a bit per child; its count reaches MAX_WORKERS; a PSN is RC's 24 bits; a chunk a
    32-bit serial number; a job number the QPN's job field.
    """
    slot = {"state": max(SlotState).bit_length(), "job": QPN_JOB_BITS, "chunk": CHUNK_MOD.bit_length() - 1,
            "psn": PSN_BITS, "bitmap": n, "acked": n, "count": MAX_WORKERS.bit_length(), "first": 1, "done": 1,
            "held": 1}
    job = {"result_psn": PSN_BITS, "expected": PSN_BITS, "acked": PSN_BITS, "nak_sent": 1, "timers": TIMER_BITS,
           "next_result": PSN_BITS, "up_start": PSN_BITS, "up_next": PSN_BITS, "up_timer": TIMER_BITS,
           "parent_expected": PSN_BITS, "parent_nak": 1, "forwarded": PSN_BITS}
    return slot, job


def _field_bits(owner: object, fields: dict[str, object], widths: dict[str, int]) -> tuple[int, int]:
    """(bits per child, bits once) of ``fields``: a list holds one value per child, anything else is one value.

    A field neither configuration nor in ``widths`` is an error, so that state a model gains is counted or
    the table fails, never silently left out.
    """
    per_child = once = 0
    for name, value in fields.items():
        if name in _CONFIG:
            continue
        if name not in widths:
            raise KeyError(f"{type(owner).__name__}.{name}: no width for this state field")
        if isinstance(value, list):
            per_child += widths[name]
        else:
            once += widths[name]
    return per_child, once


def _slot_bits(slot: object, widths: dict[str, int]) -> tuple[int, int]:
    """(lane bytes, other bits) of one slot (:class:`~inagg.models.switch.Slot` or :class:`Entry`)."""
    lanes = slot.lanes
    fields = {f.name: getattr(slot, f.name) for f in dataclasses.fields(slot) if f.name != "lanes"}
    per_child, once = _field_bits(slot, fields, widths)
    assert per_child == 0, "a slot holds no per-child list"
    # Promotion flags are one bit per lane in the slot memory (numpy keeps a byte per bool).
    return lanes.words.nbytes, once + lanes.promoted.size


def _job_of(mode: Mode, workers: int, window: int, chunk_bytes: int) -> tuple[ModelSwitch, JobSpec]:
    """A model switch holding one job of ``mode`` with ``workers`` workers and a region of ``2 * window`` slots.

    The addresses are placeholders: they are configuration, not counted. The job's objects have every field
    they have on a tree too.
    """
    region = 2 * window
    switch = ModelSwitch(SwitchSpec(ports=workers, slots=region, chunk_bytes=chunk_bytes))
    specs = tuple(WorkerSpec(port=p, mac=f"02:00:00:00:01:{p:02x}", ip=f"10.0.0.{p + 1}", qpn=0x1_0000 + p,
                             rkey=0x5E5E_0000 + p, result_va=0) for p in range(workers))
    job = JobSpec(job=1, rkey=0x4A0B_0001, slot_base=0, slots=region, workers=specs, mode=mode)
    switch.add_job(job)
    return switch, job


def _uc_state(workers: int, window: int, chunk_bytes: int) -> JobState:
    """A UC job: its region of the switch's fast slots and its per-worker result PSNs."""
    sw, spec = _job_of(Mode.UC, workers, window, chunk_bytes)
    slot_w, job_w = _widths(workers)
    region = sw.fast[spec.slot_base:spec.slot_base + spec.slots]
    lane_bytes, slot_bits = _slot_bits(region[0], slot_w)
    j = sw.jobs[spec.job]
    per_child, once = _field_bits(j, vars(j), job_w)
    return JobState(Mode.UC, workers, len(region), lane_bytes * len(region), slot_bits, per_child, once)


def _rc_state(mode: Mode):
    def state(workers: int, window: int, chunk_bytes: int) -> JobState:
        """A Mode II or III job: its :class:`~inagg.models.modes.Entry` slots, per-child and per-job fields."""
        sw, spec = _job_of(mode, workers, window, chunk_bytes)
        slot_w, job_w = _widths(workers)
        j = sw.modes[spec.job]
        lane_bytes, slot_bits = _slot_bits(j.entries[0], slot_w)
        per_child, once = _field_bits(j, {k: v for k, v in vars(j).items() if k != "entries"}, job_w)
        return JobState(mode, workers, len(j.entries), lane_bytes * len(j.entries), slot_bits, per_child, once)
    return state


# What Mode I's RC endpoints hold that is not switch state (docs/protocol.md section 9): their
# configuration, the model's statistics, and copies a hardware switch does not keep.
_RC_NOT_STATE = frozenset({
    "window", "mtu", "timeout", "retries", "rnr_retries", "ack_every", "rnr_timer",  # configuration, fixed at install
    "stats",                  # the model's tallies; the switch counts in its global Counter registers
    "_parts", "_msg_va",      # Responder.receive()'s message buffer: Mode I places packets with take()
    # The per-result header copies: unsent (never any, the window is every slot), sent and not ACKed,
    # and their last PSNs. A hardware switch derives them from the ring: the j-th result has PSN
    # j mod 2**24 on every QP, and its chunk and flags are in its slot.
    "_queue", "_sent", "_ends",
})


def _rc_widths(job: TerminatedJob) -> dict[str, int]:
    """Bits of each state field of Mode I's responders and requesters (section 9's Mode I paragraph)."""
    ack_every = {r.ack_every for r in job.responders}
    retries = {q.retries for q in job.requesters}
    rnr = {q.rnr_retries for q in job.requesters}
    assert len(ack_every) == len(retries) == len(rnr) == 1, "every QP of a job has the same configuration"
    return {
        # Responder: expected PSN, MSN, "NAK sent", the open message's next VA, and the packets since its
        # last ACK, which count up to ack_every - 1 (0 bits when every packet is ACKed, as in Mode I).
        "expected": PSN_BITS, "msn": PSN_BITS, "_nak_sent": 1, "_va": 64,
        "_unacked": (ack_every.pop() - 1).bit_length(),
        # Requester: next PSN, oldest unACKed PSN, results completed, retries left, its ACK timer, and
        # "a NAK's Go-Back-N is under way": _nak_psn is None or the oldest unACKed PSN, so one bit; RNR
        # retries left (3 bits, 7 meaning no limit) and "the timer is an RNR NAK's delay".
        "next_psn": PSN_BITS, "una": PSN_BITS, "completed": 32, "_left": retries.pop().bit_length(),
        "_timer": TIMER_BITS, "_nak_psn": 1, "_rnr_left": rnr.pop().bit_length(), "_rnr_wait": 1,
    }


def _endpoint_bits(endpoint: Responder | Requester, widths: dict[str, int]) -> int:
    """The bits of one RC endpoint's state: every field but those of :data:`_RC_NOT_STATE`."""
    per_child, once = _field_bits(endpoint, {k: v for k, v in vars(endpoint).items() if k not in _RC_NOT_STATE},
                                  widths)
    assert per_child == 0, "an RC endpoint holds no per-child list"
    return once


def _terminated_state(workers: int, window: int, chunk_bytes: int) -> JobState:
    """A Mode I job: its slots, per host QP its responder and requester, once its ring and ACKed count."""
    sw, spec = _job_of(Mode.TERMINATED, workers, window, chunk_bytes)
    slot_w, _ = _widths(workers)
    j = sw.modes[spec.job]
    lane_bytes, slot_bits = _slot_bits(j.slots[0], slot_w)
    rc_w = _rc_widths(j)
    qp_bits = _endpoint_bits(j.responders[0], rc_w) + _endpoint_bits(j.requesters[0], rc_w)
    # The ring holds up to R slot indices; its head is the ACKed count mod R, so beside the indices it
    # keeps only how many it holds (0..R).
    r = len(j.slots)
    job_w = {"order": r * (r - 1).bit_length() + r.bit_length(), "released": 32}
    # A switch below the root of a tree is its parent's RC peer: one more requester and responder, counted
    # once (none at the one switch of section 9's table).
    up = [e for e in (j.up_requester, j.up_responder) if e is not None]
    per_child, once = _field_bits(j, {k: v for k, v in vars(j).items()
                                      if k not in ("slots", "responders", "requesters", "up_requester",
                                                   "up_responder")}, job_w)
    assert per_child == 0, "a Mode I job's per-QP state is in its responders and requesters"
    once += sum(_endpoint_bits(e, rc_w) for e in up)
    return JobState(Mode.TERMINATED, workers, r, lane_bytes * r, slot_bits, qp_bits, once)


# One function per mode the model switch implements, in the table's order.
STATE_OF = {
    Mode.UC: _uc_state,
    Mode.TERMINATED: _terminated_state,
    Mode.TRANSLATED: _rc_state(Mode.TRANSLATED),
    Mode.AUGMENTED: _rc_state(Mode.AUGMENTED),
}


def window_for(link_bps: float, rtt: float, chunk_bytes: int) -> int:
    """The window of docs/protocol.md section 9: ceil(B * T / (8 * C)) chunks, up to a power of two."""
    w = math.ceil(link_bps * rtt / (8 * chunk_bytes))
    return 1 << (w - 1).bit_length()


def job_state(mode: Mode, *, workers: int, window: int, chunk_bytes: int = CHUNK_BYTES_DEFAULT) -> JobState:
    """The switch state one job of ``mode`` holds, read off the model switch's own structures.

    ``window`` chunks outstanding per worker (the job's region is ``2 * window`` slots). ``KeyError`` for a
    mode without a function in :data:`STATE_OF`.
    """
    if mode not in STATE_OF:
        raise KeyError(f"no state function for mode {mode.name} (add one to STATE_OF)")
    return STATE_OF[mode](workers, window, chunk_bytes)
