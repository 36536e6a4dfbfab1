"""The model checker explores every interleaving of the CI scope, and finds broken protocols."""

import pytest

from inagg.host import checker
from inagg.host.checker import Scope, Violation, check
from inagg.host.worker import Timing
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob, TranslatedJob
from inagg.models.terminated import TerminatedJob
from inagg.models.switch import ModelSwitch


@pytest.mark.parametrize("scope, states", [
    (Scope(workers=2, chunks=3, window=2, faults=1), 1577),
    (Scope(workers=2, chunks=3, window=2, faults=1, promote=True), 1577),
    (Scope(workers=3, chunks=3, window=2, faults=1), 13385),
])
def test_every_run_ends_with_the_exact_aggregate(scope, states):
    r = check(scope)
    assert r.states == states and r.final_states >= 1 and r.transitions > r.states


def test_early_resends_keep_every_run_exact():
    # Resending a chunk as soon as the next chunk's result overtakes it: still no duplicate sum, no lost chunk.
    timing = Timing(timeout=1.0, backoff=2.0, max_timeout=4.0, tries=5, early=1)
    r = check(Scope(workers=2, chunks=3, window=2, faults=1), timing=timing)
    assert r.final_states >= 1 and r.states > 1577


def test_spurious_timeouts_keep_every_run_exact():
    # The estimated timeout may undercut a round trip: a resend then races its original, besides a fault.
    r = check(Scope(workers=2, chunks=2, window=1, faults=1, spurious=1))
    assert r.final_states >= 1 and r.states > check(Scope(workers=2, chunks=2, window=1, faults=1)).states


def test_a_worker_whose_tries_a_spurious_timeout_spends_is_found():
    # No fault at all: only the clock running ahead of the frames in flight fires the timer that gives up.
    with pytest.raises(Violation, match=r"after 1 tries(.|\n)*with frames in flight"):
        check(Scope(workers=2, chunks=1, faults=0, spurious=1), timing=Timing(timeout=1.0, max_timeout=1.0, tries=1))


def test_a_stray_far_future_chunk_never_wedges_a_slot():
    """Liveness: a contribution of chunk 2**31 delivered at any point of every run, even with a fault."""
    r = check(Scope(workers=2, chunks=2, window=1, faults=1, stray=True))
    assert r.final_states >= 1


def test_a_switch_whose_slots_a_stray_wedges_is_found(monkeypatch):
    """The rule before issue 21: a FREE slot took the stray for good (``DROP_STALE`` for the run's chunk)."""
    monkeypatch.setattr(checker.Slot, "first", property(lambda self: False, lambda self, v: None))
    with pytest.raises(Violation, match="no result for chunk 0"):
        check(Scope(workers=2, chunks=1, window=1, faults=0, stray=True))


def test_a_worker_that_gives_up_too_early_is_found():
    with pytest.raises(Violation, match=r"no result for chunk \d+ after 1 tries(.|\n)*trace:(.|\n)*lose"):
        check(Scope(workers=2, chunks=2, faults=1), timing=Timing(timeout=1.0, max_timeout=1.0, tries=1))


def test_a_switch_that_does_not_resend_results_is_found(monkeypatch):
    real = ModelSwitch._contribute

    def forgetful(self, job, worker, chunk, payload):
        slot = self._locate(job.spec, chunk)
        if not isinstance(slot, int) and slot.state == 2 and slot.chunk == chunk and slot.bitmap >> worker & 1:
            return []  # the resend of a DONE slot's result, left out
        return real(self, job, worker, chunk, payload)

    monkeypatch.setattr(ModelSwitch, "_contribute", forgetful)
    with pytest.raises(Violation, match="no result for chunk"):
        check(Scope(workers=2, chunks=1, faults=1))


@pytest.mark.parametrize("kw, match", [
    (dict(workers=5), "workers must be an integer in 1..4, not 5"),
    (dict(chunks=0), "chunks must be an integer in 1..8, not 0"),
    (dict(faults=5), "faults must be an integer in 0..4, not 5"),
    (dict(spurious=4), "spurious must be an integer in 0..3, not 4"),
    (dict(workers=3, promote=True), r"promote needs exactly 2 workers"),
    (dict(stray=True, mode=Mode.TRANSLATED), r"stray needs the UC mode"),
])
def test_scope_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Scope(**kw)


def test_state_budget_is_enforced():
    with pytest.raises(RuntimeError, match="more than 10 states: choose a smaller scope"):
        checker.check(Scope(workers=2, chunks=3, faults=1), max_states=10)


@pytest.mark.parametrize("scope", [Scope(workers=2, chunks=2, window=1, faults=1, mode=Mode.TRANSLATED),
                                   Scope(workers=2, chunks=2, window=1, faults=0, mode=Mode.AUGMENTED)], ids=str)
def test_rc_modes_end_with_the_exact_aggregate_and_terminate(scope):
    r = check(scope)
    assert r.final_states >= 1 and r.transitions > r.states


def test_a_mode_iii_switch_that_frees_a_result_before_the_slowest_ack_is_found(monkeypatch):
    monkeypatch.setattr(AugmentedJob, "free_on_first_ack", True)
    # The shortest counterexample: the slot is reused while the slower worker's result is still in flight,
    # where the fault the scope allows can lose it.
    with pytest.raises(Violation, match=r"no longer holds result PSN 0, which worker 1 lacks\ntrace:(.|\n)*"
                                        r"switch <- w0 ACK PSN 0\n  switch <- w0 contribution PSN 2$"):
        check(Scope(workers=2, chunks=3, window=1, faults=1, mode=Mode.AUGMENTED))


def test_scope_refuses_a_mode_that_is_not_a_mode():
    with pytest.raises(ValueError, match="mode must be UC, TERMINATED, TRANSLATED or AUGMENTED, not 'I'"):
        Scope(mode="I")


def test_mode_i_ends_with_the_exact_aggregate_and_terminates():
    r = check(Scope(workers=2, chunks=2, window=1, faults=0, mode=Mode.TERMINATED))
    assert (r.states, r.transitions, r.final_states) == (4224, 17254, 1)


def test_a_mode_i_switch_that_frees_a_result_before_every_host_acked_it_is_found(monkeypatch):
    monkeypatch.setattr(TerminatedJob, "free_on_first_ack", True)
    # The requester keeps only the result's header: once the slot is free, a lost result cannot be sent again.
    with pytest.raises(Violation, match=r"no longer holds result PSN 0, which worker 1 lacks\ntrace:\n"
                                        r"  switch <- w0 contribution PSN 0\n  switch <- w1 contribution PSN 0\n"
                                        r"  w0 <- result PSN 0\n  switch <- w0 ACK PSN 0$"):
        check(Scope(workers=2, chunks=2, window=1, faults=0, mode=Mode.TERMINATED))


def test_an_off_by_one_in_the_mode_ii_shadow_wipe_is_found(monkeypatch):
    def late_wipe(self, w, psn):
        self.entries[(psn + len(self.entries) // 2 + 1) % len(self.entries)].bitmap &= ~(1 << w)
        return []

    monkeypatch.setattr(TranslatedJob, "_in_order", late_wipe)
    with pytest.raises(Violation, match=r"worker \d: RC retry count exceeded: PSN 2 unacknowledged(.|\n)*trace:"):
        check(Scope(workers=2, chunks=3, window=1, faults=0, mode=Mode.TRANSLATED))
