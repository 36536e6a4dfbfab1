"""Shared harness of the host tests: the ranks of one job on threads over the in-process fabric."""

import threading

import pytest

from inagg import host
from inagg.host.controller import Controller
from inagg.models.switch import ModelSwitch


def _on_threads(plan, timing, body, *, ranks=None, faults=None, seed=5):
    """``body(rank, group)`` for each rank of ``plan``'s first job (or of ``ranks``), each on a thread of its
    own, every group on one :class:`host.MemoryFabric` in front of a configured :class:`ModelSwitch`.
    Returns ``(values, errors)``: what each rank's body returned, and what it raised, by rank."""
    sw_spec, job = plan.switch, plan.jobs[0]
    sw = ModelSwitch(sw_spec)
    Controller(sw, plan).configure()
    values, errors = {}, {}
    with host.MemoryFabric(sw, faults=faults, seed=seed) as fabric:
        groups = [host.Group(sw_spec, job, r, fabric.port(w.port), timing=timing) for r, w in enumerate(job.workers)]

        def rank(r):
            try:
                values[r] = body(r, groups[r])
            except Exception as e:  # collected for the test to inspect
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in (ranks or range(len(job.workers)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return values, errors


@pytest.fixture(scope="session")
def on_threads():
    """``on_threads(plan, timing, body, ranks=None, faults=None, seed=5)``: see :func:`_on_threads`.
    Session-scoped (it holds no state), so hypothesis tests may use it."""
    return _on_threads
