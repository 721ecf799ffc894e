"""Hypothesis profiles for the property-based tests of this folder.

* ``ci`` (default): derandomised (the same examples on every run and machine), a fixed, modest
  ``max_examples``, no deadline (timings on shared CI cores are noisy), no example database.
  The whole folder runs in well under a minute on one core.
* ``fuzz``: many more random examples, with the example database, for hunting bugs. Selected
  with ``pytest -m fuzz tests/property`` or ``PYRO_SEQ_HYPOTHESIS_PROFILE=fuzz``.

Every test module here sets ``pytestmark = pytest.mark.fuzz`` (the marker is registered in
setup.cfg), so ``-m fuzz`` selects exactly these tests.
Slow tests scale their example counts from the profile's ``max_examples`` with
:func:`tests.property.support.examples`.
"""

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "PYRO_SEQ_HYPOTHESIS_PROFILE"

settings.register_profile(
    "ci",
    max_examples=50,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _wants_fuzz(config) -> bool:
    if os.environ.get(PROFILE_ENV):
        return os.environ[PROFILE_ENV] == "fuzz"
    markexpr = config.getoption("markexpr", default="") or ""
    # "-m fuzz", "-m 'fuzz and not slow'", ...: the word fuzz, not negated
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return any(w == "fuzz" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))


def pytest_configure(config):
    # runs when this conftest is registered, before the test modules of the folder are imported
    # (so settings built at import time inherit the profile)
    settings.load_profile("fuzz" if _wants_fuzz(config) else "ci")
