"""Request streams for the exception engine (seeded; load rising past saturation and falling again) and keys
whose table positions a test chooses."""

from __future__ import annotations

import numpy as np

from inagg.hdl.exception import Op
from inagg.models.cuckoo import KEY_JOB_SHIFT, hashes_np

__all__ = ["random_requests", "valid_pattern", "keys_with"]


def random_requests(rng: np.random.Generator, n: int, jobs: int, slots: int, phase: int = 1500,
                    teardown: float = 0.002) -> tuple[np.ndarray, np.ndarray]:
    """``n`` requests (ops, keys) on the keys of ``jobs`` jobs with ``slots`` indices each.

    Phases of ``phase`` requests alternate between filling (60% LOCATE, 25%
    LOOKUP, 15% DELETE) and draining (15%, 25%, 60%), so the table's load
    climbs to where LOCATEs are refused and falls back, more than once. A
    fraction ``teardown`` of the requests tears a random job down.
    """
    job = rng.integers(0, jobs, n)
    index = rng.integers(0, slots, n)
    filling = (np.arange(n) // phase) % 2 == 0
    u = rng.random(n)
    locate, lookup = np.where(filling, 0.60, 0.15), np.where(filling, 0.85, 0.40)
    ops = np.select([u < locate, u < lookup], [Op.LOCATE.value, Op.LOOKUP.value], Op.DELETE.value)
    tear = rng.random(n) < teardown
    ops[tear] = Op.TEARDOWN.value
    index[tear] = slots - 1
    return ops, (job << KEY_JOB_SHIFT) | index


def valid_pattern(rng: np.random.Generator, n: int, idle: float) -> np.ndarray:
    """One flag per cycle for ``n`` cycles: True where a driver may act (a fraction ``idle`` is not)."""
    return rng.random(n) >= idle


def keys_with(size: int, jobs: int, slots: int, h0: int | None = None, h1: int | None = None) -> np.ndarray:
    """Every key of jobs ``0 .. jobs - 1``, indices ``0 .. slots - 1``, whose positions are ``h0`` and
    ``h1`` (None: any), in increasing order."""
    keys = ((np.arange(jobs, dtype=np.uint32)[:, None] << KEY_JOB_SHIFT)
            | np.arange(slots, dtype=np.uint32)[None, :]).ravel()
    p0, p1 = hashes_np(keys, size)
    keep = np.ones(len(keys), bool)
    if h0 is not None:
        keep &= p0 == h0
    if h1 is not None:
        keep &= p1 == h1
    return keys[keep]
