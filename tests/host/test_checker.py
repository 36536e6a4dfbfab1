"""The model checker explores every interleaving of the CI scope, and finds broken protocols."""

import pytest

from inagg.host import checker
from inagg.host.checker import Scope, Violation, check
from inagg.host.worker import Timing
from inagg.models.switch import ModelSwitch


@pytest.mark.parametrize("scope, states", [
    (Scope(workers=2, chunks=3, window=2, faults=1), 1551),
    (Scope(workers=2, chunks=3, window=2, faults=1, promote=True), 1551),
    (Scope(workers=3, chunks=3, window=2, faults=1), 12722),
])
def test_every_run_ends_with_the_exact_aggregate(scope, states):
    r = check(scope)
    assert r.states == states and r.final_states >= 1 and r.transitions > r.states


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
    (dict(workers=3, promote=True), r"promote needs exactly 2 workers"),
])
def test_scope_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Scope(**kw)


def test_state_budget_is_enforced():
    with pytest.raises(RuntimeError, match="more than 10 states: choose a smaller scope"):
        checker.check(Scope(workers=2, chunks=3, faults=1), max_states=10)
