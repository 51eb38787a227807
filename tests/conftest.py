"""Shared test configuration.

Hypothesis runs derandomized (a fixed seed derived from each test), so CI is
deterministic; set HYPOTHESIS_PROFILE=explore to search with fresh seeds.
"""

import os
import resource
import sys
import tempfile

import pytest
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

# The test workers already keep both cores busy: searches cost their candidates in their own process
# (tests/test_costprocess.py and the golden test cost them beside the search and check that nothing
# changes).
os.environ.setdefault("EINOPT_COST_PROCESS", "never")

# The measurement cache (timings and searches) of a test run starts empty and is the run's own:
# outcomes must not depend on what the user's cache holds from earlier runs.
os.environ["EINOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="einopt-test-cache-")


# ----------------------------------------------------------------------------- memory
# The suite must run on a laptop or a small CI runner. Tests that need more than
# RSS_LIMIT_MB (a > 2 GB model; the light models with the biggest weights, which
# the pipeline holds several copies of) are marked `bigmem` and run only with
# EINOPT_BIGMEM_TESTS=1. Without it, a test that takes the process past the limit
# fails its teardown, naming itself.
BIGMEM = os.environ.get("EINOPT_BIGMEM_TESTS") == "1"
RSS_LIMIT_MB = int(os.environ.get("EINOPT_TEST_RSS_LIMIT_MB", "3072"))
_past_limit: list[str] = []


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "bigmem: needs more than 3 GB of memory; runs only with EINOPT_BIGMEM_TESTS=1"
    )


def pytest_collection_modifyitems(config, items):
    if BIGMEM:
        return
    skip = pytest.mark.skip(reason="needs more than 3 GB of memory; set EINOPT_BIGMEM_TESTS=1 to run it")
    for item in items:
        if "bigmem" in item.keywords:
            item.add_marker(skip)


def _peak_rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux


@pytest.fixture(autouse=True)
def _memory_guard(request):
    yield
    if BIGMEM or _past_limit or sys.platform != "linux":
        return
    peak = _peak_rss_mb()
    if peak > RSS_LIMIT_MB:
        _past_limit.append(request.node.nodeid)
        pytest.fail(
            f"the test process peaked at {peak} MB, past the suite's limit of {RSS_LIMIT_MB} MB "
            "(EINOPT_TEST_RSS_LIMIT_MB): release what the test holds, or mark it bigmem",
            pytrace=False,
        )
