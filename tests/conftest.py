"""Shared pytest set-up: deterministic hypothesis runs everywhere (CI and local), the long tests first."""

import os

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
    """Run the FPGA build first, then the tests that build RTL, each group in collection order otherwise.

    Under pytest-xdist (``make test`` runs two workers) the long builds then overlap the many short
    tests instead of ending the run alone on one core.
    """
    def rank(item):
        return 0 if item.get_closest_marker("synth") else 1 if item.get_closest_marker("cocotb") else 2

    items.sort(key=rank)
