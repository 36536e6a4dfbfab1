"""Shared pytest set-up: deterministic hypothesis runs everywhere (CI and local), the long tests first."""

import os
from collections import Counter

from hypothesis import HealthCheck, settings

settings.register_profile(
    "inagg",
    derandomize=True,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", parent=settings.get_profile("inagg"), derandomize=False, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "inagg"))


def pytest_collection_modifyitems(config, items):
    """Run the FPGA build first, then the tests that build RTL, then those that run on another file's
    builds, in collection order; then the other files, those with the most tests first.

    Under pytest-xdist (``make test`` runs two workers, handing out whole files in this order) the
    long builds then overlap the many short tests instead of ending the run alone on one core, a
    file that reuses a build starts after the file that makes it (started beside it, its worker
    would wait for the build's lock, idle), and the run ends on small files, so both workers end
    at about the same time (xdist's own reordering, which ``make test`` turns off, sorts every file
    that way).
    """
    tests_in = Counter(item.path for item in items)

    def rank(item):
        if item.get_closest_marker("synth"):
            return 0, 0
        if item.get_closest_marker("cocotb"):
            return (2 if item.get_closest_marker("reuses_build") else 1), 0
        return 3, -tests_in[item.path]

    items.sort(key=rank)
