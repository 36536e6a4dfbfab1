"""The tree model checker explores every interleaving of small trees, UC and EPIC's Modes II and III, and finds
broken tree rules."""

import dataclasses

import pytest

from inagg.host import tree_checker
from inagg.host.checker import Violation
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.models.job import Mode
from inagg.models.modes import AugmentedJob, TranslatedJob
from inagg.models.switch import ModelSwitch, SlotState
from inagg.models.terminated import TerminatedJob
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
    (dict(duplicates=-1), "duplicates must be an integer in 0..2, not -1"),
    (dict(mode="I"), r"mode must be a Mode \(UC, TERMINATED, TRANSLATED or AUGMENTED\), not 'I'"),
])
def test_tree_scope_is_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        TreeScope(**kw)


def test_a_mode_iii_tree_that_frees_a_result_before_the_slowest_child_acked_it_is_found(monkeypatch):
    # A freed result still in flight to the child that lacks it is not lost yet: losing that copy is.
    scope = TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False)
    assert check_tree(scope, reduce=True).final_states > 1
    monkeypatch.setattr(AugmentedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"^switch \d no longer holds result PSN 0, which its child \d lacks\ntrace:"
                                        r"(.|\n)*<- ACK PSN 0\n  lose result PSN 0 to s\d:\d$"):
        check_tree(scope)


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


@pytest.mark.parametrize("mode, states", [(Mode.UC, 140), (Mode.TERMINATED, 2737), (Mode.TRANSLATED, 364),
                                          (Mode.AUGMENTED, 2737)], ids=str)
def test_every_run_with_a_duplicated_frame_ends_with_the_exact_sum(mode, states):
    r = check_tree(TreeScope("2x1", chunks=1, window=1, faults=0, duplicates=1, mode=mode, reorder=False, quiet=True))
    assert r.states == states and r.final_states >= 1


@pytest.mark.parametrize("reduce", [False, True])
@pytest.mark.parametrize("mode", [Mode.TRANSLATED, Mode.AUGMENTED], ids=str)
def test_a_switch_that_adds_a_duplicate_again_is_found(monkeypatch, mode, reduce):
    scope = TreeScope("2x1", chunks=1, window=1, faults=0, mode=mode, reorder=False, quiet=True)
    monkeypatch.setattr(TranslatedJob, "add_duplicates", True)
    assert check_tree(scope, reduce=reduce).final_states >= 1  # without a duplicate on the wire nothing is wrong
    with pytest.raises(Violation, match=r"^rank \d took a wrong result for chunk 0\ntrace:(.|\n)*"
                                        r"duplicate contribution PSN 0 to s0:\d(.|\n)*rank \d <- result PSN 0$"):
        check_tree(dataclasses.replace(scope, duplicates=1), reduce=reduce)


def test_a_wrong_result_is_found_when_a_rank_takes_it_not_at_the_end(monkeypatch):
    scope = TreeScope("2x1", chunks=1, window=1, faults=0, duplicates=1, mode=Mode.TRANSLATED, reorder=False,
                      quiet=True)
    monkeypatch.setattr(TranslatedJob, "add_duplicates", True)
    with pytest.raises(Violation, match="took a wrong result") as taken:
        check_tree(scope)
    monkeypatch.setattr(tree_checker, "_check_taken", lambda *a: None)
    with pytest.raises(Violation, match="ends with a wrong aggregate") as final:
        check_tree(scope)
    assert taken.value.states < final.value.states
    assert str(taken.value).count("\n") < str(final.value).count("\n")


def test_a_mode_i_tree_that_frees_a_result_before_the_slowest_child_acked_it_is_found(monkeypatch):
    scope = TreeScope("2x1", chunks=2, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True)
    monkeypatch.setattr(TerminatedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"^switch 0 no longer holds result PSN 0, which its child \d lacks\ntrace:"
                                        r"(.|\n)*<- ACK PSN 0$") as held:
        check_tree(scope)
    # The final-state check alone finds it only after a loss, far later; without a loss not at all.
    monkeypatch.setattr(tree_checker, "_check_results_held", lambda *a: None)
    assert check_tree(dataclasses.replace(scope, chunks=1, faults=0)).final_states >= 1
    with pytest.raises(Violation, match="run ends with worker 1 missing results") as final:
        check_tree(scope)
    assert 10 * held.value.states < final.value.states
