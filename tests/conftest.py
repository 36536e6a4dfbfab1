"""Shared pytest set-up: deterministic hypothesis runs everywhere (CI and local)."""

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
