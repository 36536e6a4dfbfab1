"""The tree model checker explores every interleaving of small trees, and finds a broken tree rule."""

import pytest

from inagg.host.checker import Violation
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.models.switch import ModelSwitch, SlotState


@pytest.mark.parametrize("scope, states", [
    (TreeScope("2x1", chunks=2, window=2, faults=1), 1378),
    (TreeScope("2x2", chunks=1, window=1, faults=0), 49),
])
def test_every_run_on_a_tree_ends_with_the_exact_sum(scope, states):
    r = check_tree(scope)
    assert r.states == states and r.final_states >= 1 and r.transitions > r.states


def test_a_switch_that_does_not_resend_its_partial_is_found(monkeypatch):
    real = ModelSwitch._up

    def once(self, job, slot, event):
        return [] if slot.state == SlotState.SENT and event.name == "UP_RESENDS" else real(self, job, slot, event)

    monkeypatch.setattr(ModelSwitch, "_up", once)
    with pytest.raises(Violation, match=r"no result for chunk 0(.|\n)*trace:(.|\n)*lose result PSN 0 to s2:1"):
        check_tree(TreeScope("2x1", chunks=1, window=1, faults=1))


@pytest.mark.parametrize("kw, match", [
    (dict(spec="2x4"), "a checked tree has at most 4 ranks and depth 3, not 8 and 2"),
    (dict(chunks=5), "chunks must be an integer in 1..4, not 5"),
    (dict(window=3), "window must be a power of two >= 1, not 3"),
    (dict(faults=3), "faults must be an integer in 0..2, not 3"),
])
def test_tree_scope_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        TreeScope(**kw)
