"""Shared test configuration.

Hypothesis runs derandomized (a fixed seed derived from each test), so CI is
deterministic; set HYPOTHESIS_PROFILE=explore to search with fresh seeds.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
