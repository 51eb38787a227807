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

# Benchmarking in ONNX Runtime's global thread pool makes every later session of the
# process that wants its own threads fail; tests share processes, so they use
# per-session pools (test_bench checks the global pool in a subprocess).
os.environ.setdefault("EINOPT_THREAD_POOL", "per-session")
