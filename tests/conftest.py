"""Shared fixtures and hypothesis settings."""
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, max_examples=40, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FLEXSHARD_SHARED_DATA", ROOT.parent / "shared" / "data"))


def zipf_stream(n, num_rows, alpha, seed):
    """A skewed stream of row IDs with hot rows scattered over the ID space (test helper)."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(alpha, size=n), num_rows) - 1 if alpha > 1 else \
        rng.integers(0, num_rows, size=n)
    perm = rng.permutation(num_rows)
    return perm[ranks].astype(np.int64)


class FakeKJT:
    """Duck-typed TorchRec KeyedJaggedTensor, numpy inside: ``keys()``, ``values()``,
    ``lengths()`` (key-major) and ``weights_or_none()`` (test helper)."""

    def __init__(self, keys, values, lengths, weights=None):
        self._k, self._v, self._l = list(keys), np.asarray(values), np.asarray(lengths)
        self._w = None if weights is None else np.asarray(weights)

    def keys(self):
        return self._k

    def values(self):
        return self._v

    def lengths(self):
        return self._l

    def weights_or_none(self):
        return self._w


@pytest.fixture
def shared_data():
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole test session (2 CPUs; its start-up costs seconds),
    skipped without Ray."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
