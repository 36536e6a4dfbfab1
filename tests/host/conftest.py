"""Shared harness of the host tests: the ranks of one job on threads over the in-process fabric."""

import threading

import pytest

from inagg import host
from inagg.host.controller import Controller
from inagg.models.switch import ModelSwitch


HANG = 120.0
"""Seconds a rank's thread may run before the harness calls it a hang (the tests' bounds are far shorter)."""


def _on_threads(plan, timing, body, *, ranks=None, faults=None, seed=5, switch=None, hang=HANG):
    """``body(rank, group)`` for each rank of ``plan``'s first job (or of ``ranks``), each on a thread of its
    own, every group on one :class:`host.MemoryFabric` in front of ``switch`` configured with ``plan`` (by
    default a :class:`ModelSwitch` whose Mode I and III timers run out after 50 ms of real time); the groups
    are closed when every body has returned. A body still running after ``hang`` seconds fails the test
    (its thread is left behind: nothing can stop it).
    Returns ``(values, errors)``: what each rank's body returned, and what it raised, by rank."""
    sw_spec, job = plan.switch, plan.jobs[0]
    sw = ModelSwitch(sw_spec, hop_timeout=0.05) if switch is None else switch
    Controller(sw, plan).configure()
    values, errors = {}, {}
    with host.MemoryFabric(sw, faults=faults, seed=seed) as fabric:
        groups = [host.Group(sw_spec, job, r, fabric.port(w.port), timing=timing) for r, w in enumerate(job.workers)]

        def rank(r):
            try:
                values[r] = body(r, groups[r])
            except Exception as e:  # collected for the test to inspect
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,), daemon=True)
                   for r in (ranks or range(len(job.workers)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(hang)
            if t.is_alive():
                pytest.fail(f"a rank is still running after {hang} s: the API hangs")
        for g in groups:
            g.close()  # the ranks' responders end with the test, not a retry time after it
    return values, errors


@pytest.fixture(scope="session")
def on_threads():
    """``on_threads(plan, timing, body, ranks=None, faults=None, seed=5, switch=None, hang=HANG)``: see
    :func:`_on_threads`.
    Session-scoped (it holds no state), so hypothesis tests may use it."""
    return _on_threads
