"""The tree checker's partial-order reduction keeps every verdict: the same final states as the full
exploration on small scopes, and every known mutation still found (here, and with ``reduce`` in
test_tree_checker.py and test_rc_collectives.py)."""

import pytest

from inagg.host import checker, tree_checker
from inagg.host.checker import Violation
from inagg.host.tree_checker import TreeScope, check_tree
from inagg.models.job import Collective, Mode
from inagg.models.modes import AugmentedJob
from inagg.models.terminated import TerminatedJob


def _finals(monkeypatch, scope: TreeScope, reduce: bool):
    """The exploration's counts and the keys of its final states, each number in them replaced by the
    value it stands for (numbers are a run's own: ``names`` lists the values in the order numbered)."""
    finals, real = set(), checker._check_final

    def record(s, expect, trace):
        real(s, expect, trace)
        prints, flight, *rest = s.key()
        values = list(s.names)
        finals.add((tuple(values[n] for n in prints), tuple(values[n] for n in flight), *rest))

    monkeypatch.setattr(checker, "_check_final", record)
    return check_tree(scope, reduce=reduce), finals


@pytest.mark.parametrize("scope", [
    TreeScope(spec, chunks=c, window=w, faults=f, mode=m, reorder=False, quiet=q, collective=k)
    for m in (Mode.TRANSLATED, Mode.AUGMENTED)
    for k in (Collective.ALLREDUCE, Collective.REDUCE, Collective.BROADCAST)
    for spec, w, c, f, q in (("2x2", 1, 1, 1, True), ("2x2", 1, 1, 0, False), ("2x1", 1, 2, 0, True))
] + [
    # Mode I, whose invariant reads what a rank expects as Mode III's does; a duplication on any hop.
    TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.TERMINATED, reorder=False),
    TreeScope("2x1", chunks=2, window=1, faults=1, mode=Mode.TERMINATED, reorder=False, quiet=True),
    *(TreeScope("2x1", chunks=1, window=1, faults=0, duplicates=1, mode=m, reorder=False, quiet=True)
      for m in (Mode.TERMINATED, Mode.TRANSLATED, Mode.AUGMENTED)),
], ids=str)
def test_the_reduced_exploration_reaches_the_same_final_states(monkeypatch, scope):
    full, full_finals = _finals(monkeypatch, scope, reduce=False)
    reduced, reduced_finals = _finals(monkeypatch, scope, reduce=True)
    assert reduced_finals == full_finals and reduced.final_states == full.final_states
    assert reduced.states < full.states and reduced.transitions < full.transitions


def test_reordering_links_are_explored_in_full():
    # A rank's next frame is not fixed when its link reorders: the reduction does not apply.
    scope = TreeScope("2x1", chunks=1, window=1, faults=1, mode=Mode.TRANSLATED)
    full, reduced = check_tree(scope), check_tree(scope, reduce=True)
    assert (reduced.states, reduced.transitions) == (full.states, full.transitions)


@pytest.mark.parametrize("collective", [Collective.ALLREDUCE, Collective.BROADCAST])
def test_the_reduction_still_finds_a_result_freed_at_the_first_ack(monkeypatch, collective):
    monkeypatch.setattr(AugmentedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"^switch \d no longer holds result PSN 0, which its child \d lacks\ntrace:"):
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False, quiet=True,
                             collective=collective), reduce=True)


def test_the_reduction_still_finds_a_mode_i_result_freed_at_the_first_ack(monkeypatch):
    monkeypatch.setattr(TerminatedJob, "free_on_first_ack", True)
    with pytest.raises(Violation, match=r"^switch \d no longer holds result PSN 0, which its child \d lacks\ntrace:"):
        check_tree(TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.TERMINATED, reorder=False), reduce=True)


@pytest.mark.parametrize("scope", [
    TreeScope("2x2", chunks=2, window=2, faults=0, mode=Mode.TRANSLATED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=1, window=1, faults=1, mode=Mode.TRANSLATED, reorder=False, quiet=False,
              collective=Collective.BROADCAST),
    TreeScope("2x2", chunks=2, window=1, faults=0, duplicates=1, mode=Mode.TRANSLATED, reorder=False, quiet=True,
              collective=Collective.REDUCE),
    # Mode III: switches with timers (due at any time in the second scope), results kept per hop.
    TreeScope("2x1", chunks=1, window=1, faults=1, mode=Mode.AUGMENTED, reorder=False, quiet=True),
    TreeScope("2x2", chunks=1, window=1, faults=0, mode=Mode.AUGMENTED, reorder=False, quiet=False,
              collective=Collective.BROADCAST),
], ids=str)
def test_the_switch_sets_reduce_further_and_keep_every_final_state(monkeypatch, scope):
    full, full_finals = _finals(monkeypatch, scope, reduce=False)
    reduced, reduced_finals = _finals(monkeypatch, scope, reduce=True)
    monkeypatch.setattr(tree_checker, "_switch_set", lambda *a: None)  # deliveries to ranks only
    ranks_only, _ = _finals(monkeypatch, scope, reduce=True)
    assert reduced_finals == full_finals and reduced.final_states == full.final_states
    assert reduced.states < ranks_only.states < full.states
