"""The tree model checker explores every interleaving of small trees, UC and EPIC's Modes II and III, and finds
broken tree rules."""

import pytest

from inagg.host.checker import Violation
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob, TranslatedJob
from inagg.models.switch import ModelSwitch, SlotState
from inagg.models.tree import TreeCounter


@pytest.mark.parametrize("scope, states", [
    (TreeScope("2x1", chunks=2, window=2, faults=1), 1388),
    (TreeScope("2x2", chunks=1, window=1, faults=0), 49),
    (TreeScope("2x1", chunks=2, window=1, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=True), 562),
    (TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.TRANSLATED), 313),
    (TreeScope("2x1", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False, quiet=True), 1012),
    (TreeScope("2x1", chunks=1, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True), 1040),
], ids=str)
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
    (dict(mode="I"), r"mode must be a Mode \(UC, TERMINATED, TRANSLATED or AUGMENTED\), not 'I'"),
])
def test_tree_scope_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        TreeScope(**kw)


def test_a_mode_iii_tree_that_frees_a_result_before_the_slowest_child_acked_it_is_found(monkeypatch):
    monkeypatch.setattr(AugmentedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"^switch \d no longer holds result PSN 0, which its child \d lacks\ntrace:"
                                        r"(.|\n)*<- ACK PSN 0$"):
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.AUGMENTED, reorder=False))


@pytest.mark.parametrize("reduce", [False, True])  # the partial-order reduction must still find it
def test_a_mode_ii_tree_whose_shadow_wipe_is_one_slot_off_is_found(monkeypatch, reduce):
    scope = TreeScope("2x1", chunks=3, window=1, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True)
    assert check_tree(scope, reduce=reduce).final_states == 1  # the scope reuses a slot: PSN 2 takes PSN 0's
    monkeypatch.setattr(TranslatedJob, "shadow_skew", 1)
    with pytest.raises(Violation, match=r"^job 1 worker \d: RC retry count exceeded: PSN 2 unacknowledged(.|\n)*"
                                        r"trace:\n  s1:0 <- contribution PSN 0\n(.|\n)*<- contribution PSN 2\n") as e:
        check_tree(scope, reduce=reduce)
    assert e.value.states > 1


@pytest.mark.parametrize("reduce", [False, True])  # the partial-order reduction must still find it
def test_a_mode_ii_switch_that_does_not_resend_its_partial_is_found(monkeypatch, reduce):
    real = TranslatedJob._up

    def once(self, e, event):
        return [] if event is TreeCounter.UP_RESENDS else real(self, e, event)

    monkeypatch.setattr(TranslatedJob, "_up", once)
    with pytest.raises(Violation, match=r"RC retry count exceeded(.|\n)*trace:(.|\n)*lose "):
        check_tree(TreeScope("2x1", chunks=1, window=1, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=True),
                   reduce=reduce)
