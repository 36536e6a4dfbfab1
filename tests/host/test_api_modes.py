"""The public API over EPIC's Modes I, II and III: RC queue pairs on threads over the in-process fabric."""

import re
import time

import numpy as np
import pytest

from inagg import host
from inagg.host.collectives import reference
from inagg.host.controller import plan
from inagg.host.link import Faults
from inagg.host.rc_worker import RcWorker
from inagg.host.worker import Worker
from inagg.models import quant, rc
from inagg.models.job import Collective, Mode
from inagg.models.protocol import Counter
from inagg.models.switch import ModelSwitch
from inagg.models.terminated import RESULT_RETRIES

RANKS, ROOT, AMAX = 4, 1, 4.0
# An RC queue pair has no backoff: timeout * tries (1 s) bounds a call that gets no answer.
RC = host.Timing(timeout=0.05, max_timeout=0.05, tries=20)
FAULTS = Faults(loss=0.05, dup=0.05, reorder=0.05, reorder_delay=2e-3)


def _plan(collective, mode, ranks=RANKS):
    return plan([ranks], window=4, chunk_bytes=256, collective=collective, root=ROOT, mode=mode)


def _call(collective: Collective, x: np.ndarray, g: host.Group):
    """The public function of ``collective`` on ``x``; returns (value, exponent of its sum or None)."""
    if collective is Collective.ALLREDUCE:
        return host.allreduce(x, g), g.last_exponent
    if collective is Collective.REDUCE:
        return host.reduce(x, g, amax=AMAX), quant.choose_exponent(AMAX, g.size)
    if collective is Collective.BROADCAST:
        return host.broadcast(x, g), None
    if collective is Collective.BARRIER:
        return host.barrier(g), None
    if collective is Collective.REDUCE_SCATTER:
        return host.reduce_scatter(x, g), g.last_exponent
    return host.allgather(x, g), None


def _check_exact(collective, data, values):
    exponents = {e for _, e in values.values()}
    assert len(exponents) == 1
    want = reference(collective, data, root=ROOT, exponent=exponents.pop())
    for r in range(len(data)):
        got = values[r][0]
        assert (got is None) == (want[r] is None)
        if got is not None:
            assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want[r].view(np.uint32))


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED], ids=["II", "III"])
@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
def test_each_collective_is_exact_over_rc_with_faults(on_threads, collective, mode):
    rng = np.random.default_rng(7)
    data = [np.clip(rng.standard_normal(150), -AMAX, AMAX).astype(np.float32) for _ in range(RANKS)]
    p = _plan(collective, mode)
    values, errors = on_threads(p, RC, lambda r, g: _call(collective, data[r], g), faults=FAULTS)
    assert not errors
    _check_exact(collective, data, values)


@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED], ids=["II", "III"])
@pytest.mark.parametrize("collective", [Collective.REDUCE, Collective.BROADCAST], ids=lambda c: c.value)
def test_calls_in_turn_where_ranks_wait_on_each_others_acks(on_threads, collective, mode):
    """A Broadcast's next results may reach a rank still ACKing the last ones again: the next call takes them."""
    rng = np.random.default_rng(10)
    data = [[np.clip(rng.standard_normal(n), -AMAX, AMAX).astype(np.float32) for n in (70, 200, 5)]
            for _ in range(RANKS)]
    values, errors = on_threads(_plan(collective, mode), RC,
                                lambda r, g: [_call(collective, a, g) for a in data[r]], faults=FAULTS, seed=11)
    assert not errors
    for call in range(3):
        _check_exact(collective, [d[call] for d in data], {r: values[r][call] for r in range(RANKS)})


def test_next_broadcast_results_reaching_a_rank_still_answering_are_kept(on_threads):
    """Without loss, a Broadcast's root never goes back (no NAK, no timeout): the results of its next call that
    reach the other ranks while they still answer for the last one are kept for the next call, not dropped."""
    slow = host.Timing(timeout=1.0, max_timeout=1.0, tries=5)  # no timer runs out on a busy machine either
    data = [np.full(100, r, np.float32) for r in range(3)]

    def calls(r, g):
        out = [host.broadcast(data[r], g) for _ in range(3)]
        return out, g.worker.requester.stats["retries"]

    values, errors = on_threads(_plan(Collective.BROADCAST, Mode.TRANSLATED, ranks=3), slow, calls)
    assert not errors
    assert all(np.array_equal(o, data[ROOT]) for r in range(3) for o in values[r][0])
    assert values[ROOT][1] == 0


class _AcksLostTo(ModelSwitch):
    """A model switch whose first ``copies`` ACKs of each PSN to ``port`` are lost on the way."""

    def __init__(self, spec, port: int, copies: int):
        super().__init__(spec, hop_timeout=0.05)
        self.port, self.copies, self.lost = port, copies, {}

    def receive(self, port, frame):
        out = []
        for p, f in super().receive(port, frame):
            r = rc.decode(f, self.spec.pkey)
            if p == self.port and isinstance(r[1], rc.Ack):
                self.lost[r[1].psn] = n = self.lost.get(r[1].psn, 0) + 1
                if n <= self.copies:
                    continue
            out.append((p, f))
        return out


class _AcksLostFrom(ModelSwitch):
    """A model switch that never gets the first ACK ``port`` sends of each PSN (``lost`` holds those PSNs)."""

    def __init__(self, spec, port: int, hop_timeout: float = 0.05):
        super().__init__(spec, hop_timeout=hop_timeout)
        self.port, self.lost = port, set()

    def receive(self, port, frame):
        r = rc.decode(frame, self.spec.pkey)
        if port == self.port and not isinstance(r, Counter) and isinstance(r[1], rc.Ack) and r[1].psn not in self.lost:
            self.lost.add(r[1].psn)
            return []
        return super().receive(port, frame)


def test_mode_i_rank_answers_between_calls_when_its_last_ack_is_lost(on_threads):
    """Rank 0's ACK of its last result is lost: the switch's result requester sends that result again after
    the call, and the rank must ACK it then, or after RESULT_RETRIES hop timeouts the requester's QP goes to
    error and the next call fails (RcRetryError on rank 0, RNR NAKs without end on the others)."""
    p = _plan(Collective.ALLREDUCE, Mode.TERMINATED, ranks=3)
    sw = _AcksLostFrom(p.switch, port=p.jobs[0].workers[0].port)
    data = [[np.full(100, r + c, np.float32) for c in range(2)] for r in range(3)]
    pause = (RESULT_RETRIES + 2) * sw.hop_timeout  # past the switch's last resend
    assert RC.timeout * RC.tries >= (RESULT_RETRIES + 1) * sw.hop_timeout  # the rule run() asks of a user

    def calls(r, g):
        first = _call(Collective.ALLREDUCE, data[r][0], g)
        time.sleep(pause)
        return [first, _call(Collective.ALLREDUCE, data[r][1], g)]

    values, errors = on_threads(p, RC, calls, switch=sw)
    assert not errors
    for call in range(2):
        _check_exact(Collective.ALLREDUCE, [d[call] for d in data], {r: values[r][call] for r in range(3)})
    assert sw.counters[Counter.QP_ERRORS] == 0 and sw.counters[Counter.HOP_RESENDS] > 0 and sw.lost


def test_the_between_calls_responder_ends_by_itself_and_on_close(on_threads):
    """A Mode I rank answers after its call until ``timeout * tries`` passes without a frame, or until close()
    (idempotent: the harness closes the groups again, and a context manager's exit is one)."""
    short = host.Timing(timeout=0.02, max_timeout=0.02, tries=5)
    x = np.ones(10, np.float32)

    def body(r, g):
        host.allreduce(x, g)
        after = g.answering
        t0 = time.monotonic()
        while g.answering and time.monotonic() - t0 < 5.0:
            time.sleep(0.005)
        ended = time.monotonic() - t0
        with g:
            host.allreduce(x, g)
            again = g.answering
        return after, ended, again, g.answering

    values, errors = on_threads(_plan(Collective.ALLREDUCE, Mode.TERMINATED, ranks=2), short, body)
    assert not errors
    for after, ended, again, closed in values.values():
        assert after and again and not closed
        assert 0.5 * short.timeout * short.tries < ended < 2.0


def test_the_next_call_takes_the_frames_its_responder_saw_first(on_threads):
    """A Mode I Broadcast's root starts its next call while the other ranks still answer for the last one: the
    first result of it that reaches such a rank ends that rank's responder and waits in ``group.early``; the
    rank's next call takes it before the results queued behind it (none comes out of order)."""
    p = _plan(Collective.BROADCAST, Mode.TERMINATED, ranks=3)
    sw = ModelSwitch(p.switch, hop_timeout=0.5)  # no result is sent again while a rank has yet to call
    x = np.arange(100, dtype=np.float32)

    def body(r, g):
        out = [host.broadcast(x, g)]
        if r != ROOT:
            t0 = time.monotonic()
            while g.answering and time.monotonic() - t0 < 5.0:
                time.sleep(0.005)
        kept = len(g.early)
        out.append(host.broadcast(x + 1, g))
        return out, kept, g.worker.stats["out_of_order"], len(g.early)

    values, errors = on_threads(p, RC, body, switch=sw)
    assert not errors
    for r, (out, kept, out_of_order, left) in values.items():
        assert np.array_equal(out[0], x) and np.array_equal(out[1], x + 1)
        assert (kept, out_of_order, left) == (0 if r == ROOT else 1, 0, 0)


class _BreakingPort:
    """A port that fails once ``broken`` is set, as a closed socket does."""

    def __init__(self, port):
        self.port, self.broken = port, False

    def send(self, frame):
        self.port.send(frame)

    def recv(self, timeout):
        if self.broken:
            raise OSError("port closed")
        return self.port.recv(timeout)


def test_an_error_the_responder_meets_is_raised_by_the_next_call(on_threads):
    """The port fails while only the responder uses it: the next call raises that error before it sends
    anything (the port works again by then), and the call after it runs."""
    x = np.ones(10, np.float32)

    def body(r, g):
        port = _BreakingPort(g.port)
        with host.Group(g.switch, g.job, r, port, timing=RC) as mine:
            host.allreduce(x, mine)
            port.broken = True
            t0 = time.monotonic()
            while mine.answering and time.monotonic() - t0 < 5.0:
                time.sleep(0.005)
            port.broken = False
            with pytest.raises(OSError, match="port closed"):
                host.allreduce(x, mine)
            return host.allreduce(x, mine)

    values, errors = on_threads(_plan(Collective.ALLREDUCE, Mode.TERMINATED, ranks=2), RC, body)
    assert not errors
    assert all(np.array_equal(v, 2 * x) for v in values.values())


def test_a_reduce_root_answers_late_results_after_acks_of_its_own_chunks(on_threads):
    """Mode II sends the root rank's ACK of each result to every sender, the root itself among them: the
    ACKs of its own chunks that come back while it answers late results must not end its wait, or a sender
    whose ACKs were lost is left with no one to ACK its chunk again."""
    p = _plan(Collective.REDUCE, Mode.TRANSLATED)
    sw = _AcksLostTo(p.switch, port=p.jobs[0].workers[3].port, copies=4)
    data = [np.full(150, r, np.float32) for r in range(RANKS)]
    values, errors = on_threads(p, RC, lambda r, g: _call(Collective.REDUCE, data[r], g), switch=sw)
    assert not errors
    _check_exact(Collective.REDUCE, data, values)
    assert max(sw.lost.values()) > 4


@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
def test_mode_i_collectives_are_exact_with_faults_and_calls_in_turn(on_threads, collective):
    """The switch ACKs every chunk it takes (no rank waits for another's ACKs): a rank's next call may start
    while the switch still sends the last one's results to another."""
    rng = np.random.default_rng(8)
    data = [[np.clip(rng.standard_normal(n), -AMAX, AMAX).astype(np.float32) for n in (200, 3)] for _ in range(3)]
    p = _plan(collective, Mode.TERMINATED, ranks=3)
    values, errors = on_threads(p, RC, lambda r, g: [_call(collective, a, g) for a in data[r]], faults=FAULTS)
    assert not errors
    for call in range(2):
        _check_exact(collective, [d[call] for d in data], {r: values[r][call] for r in range(3)})


@pytest.mark.parametrize("mode, kind", [(Mode.UC, Worker), (Mode.TERMINATED, RcWorker),
                                        (Mode.TRANSLATED, RcWorker), (Mode.AUGMENTED, RcWorker)])
def test_group_picks_the_worker_by_mode(mode, kind):
    p = _plan(Collective.ALLREDUCE, mode)
    assert type(host.Group(p.switch, p.jobs[0], 0, port=None).worker) is kind


def test_rc_group_refuses_what_a_queue_pair_cannot_do():
    p = _plan(Collective.ALLREDUCE, Mode.TRANSLATED)
    with pytest.raises(ValueError, match="PSNs start at 0: first_chunk must be 0"):
        host.Group(p.switch, p.jobs[0], 0, port=None, first_chunk=5)
    with pytest.raises(ValueError, match="accept_zero_icrc False"):
        host.Group(p.switch, p.jobs[0], 0, port=None, accept_zero_icrc=True)


@pytest.mark.parametrize("mode", [Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED], ids=["I", "II", "III"])
def test_dead_rank_raises_rc_retry_error_on_the_others(on_threads, mode):
    """Mode II's chunks are never ACKed (the requester runs out of retries); in Modes I and III the switch ACKs
    them, and the results that never come are what the call gives up on."""
    timing = host.Timing(timeout=0.02, max_timeout=0.02, tries=3)
    _, errors = on_threads(_plan(Collective.ALLREDUCE, mode, ranks=3), timing,
                           lambda r, g: host.allreduce(np.ones(10, np.float32), g), ranks=[0, 1])
    assert set(errors) == {0, 1}
    for r, e in errors.items():
        assert isinstance(e, host.RcRetryError) and isinstance(e, TimeoutError)
        assert str(e).startswith(f"job 1 worker {r}: ")


# Patience (timeout * tries) 0.4 s: the switch holds a busy slot for milliseconds at most while every rank is in,
# and half of it leaves a late rank's thread 0.2 s to be scheduled on a loaded machine.
_PATIENT = host.Timing(timeout=0.05, max_timeout=0.05, tries=8)
# 640 elements are 11 chunks of a Reduce, more than the job's 8 slots.
_LONG = np.ones(640, np.float32)


def test_mode_i_ranks_give_up_on_rnr_naks_when_a_rank_misses_a_call(on_threads):
    """Rank 2 takes no part in the second Reduce: the switch takes the other ranks' chunks into its 8 slots,
    then refuses the next one with RNR NAKs for as long as the slot holds a chunk rank 2 never completes. An
    RNR NAK spends no retry, so without a bound on them the other ranks would wait without end."""
    p = _plan(Collective.REDUCE, Mode.TERMINATED, ranks=3)
    sw = ModelSwitch(p.switch, hop_timeout=0.05)

    def body(r, g):
        host.reduce(_LONG, g, amax=AMAX)
        if r == 2:
            return None
        t0 = time.monotonic()
        with pytest.raises(host.RcRetryError) as e:
            host.reduce(_LONG, g, amax=AMAX)
        return time.monotonic() - t0, str(e.value)

    values, errors = on_threads(p, _PATIENT, body, switch=sw, hang=10.0)
    assert not errors
    for r in (0, 1):
        took, message = values[r]
        # Chunks 11-18 of the second call take the slots, chunk 19 finds chunk 11 in its slot.
        assert re.fullmatch(rf"job 1 worker {r}: no progress: the switch refused chunk 19 as not ready for "
                            r"0\.4\d* s \(another rank of the job is missing or failed\)", message), message
        assert took < 5 * _PATIENT.timeout * _PATIENT.tries
    assert sw.counters[Counter.RNR_NAK_SENT] > 0


def test_mode_i_ranks_wait_out_rnr_naks_for_a_rank_that_calls_late(on_threads):
    """Rank 2 calls half the patience late: the switch refuses the other ranks' chunks meanwhile, and every
    rank's Reduce succeeds once rank 2 is in."""
    p = _plan(Collective.REDUCE, Mode.TERMINATED, ranks=3)
    sw = ModelSwitch(p.switch, hop_timeout=0.05)
    data = [np.full(640, r, np.float32) for r in range(3)]

    def body(r, g):
        if r == 2:
            time.sleep(0.5 * _PATIENT.timeout * _PATIENT.tries)
        return _call(Collective.REDUCE, data[r], g)

    values, errors = on_threads(p, _PATIENT, body, switch=sw, hang=10.0)
    assert not errors
    _check_exact(Collective.REDUCE, data, values)
    assert sw.counters[Counter.RNR_NAK_SENT] > 0


class _TimedSwitch:
    """A data plane with one timer: it runs out ``after`` seconds past the first frame and sends ``b"late"``."""

    def __init__(self, after: float):
        self.after, self.due, self.clock = after, None, []

    def receive(self, port, frame):
        if self.due is None:
            self.due = self.clock[-1] + self.after
        return [(port, b"now")]

    @property
    def deadline(self):
        return self.due

    def on_timer(self, now):
        self.clock.append(now)
        if self.due is None or self.due > now:
            return []
        self.due = None
        return [(0, b"late")]


def test_fabric_tells_the_switch_the_time_and_runs_its_timer():
    sw = _TimedSwitch(0.05)
    with host.MemoryFabric(sw) as fabric:
        port = fabric.port(0)
        before = time.monotonic()
        port.send(b"x")
        assert port.recv(5.0) == b"now"
        assert port.recv(5.0) == b"late"
    assert sw.clock[0] >= before and sw.clock == sorted(sw.clock)


def test_mode_iii_hop_timers_repair_losses_in_real_time(on_threads):
    """Results lost on the hop are sent again by the switch (HOP_RESENDS): on a NAK, or, for the last ones
    before a pause, when its hop timer runs out on the fabric's thread."""
    p = _plan(Collective.ALLREDUCE, Mode.AUGMENTED)
    sw = ModelSwitch(p.switch, hop_timeout=0.05)
    rng = np.random.default_rng(9)
    data = [rng.standard_normal(300).astype(np.float32) for _ in range(RANKS)]
    values, errors = on_threads(p, RC, lambda r, g: (host.allreduce(data[r], g), g.last_exponent),
                                faults=Faults(loss=0.1), seed=2, switch=sw)
    assert not errors
    _check_exact(Collective.ALLREDUCE, data, values)
    assert sw.counters[Counter.HOP_RESENDS] > 0
