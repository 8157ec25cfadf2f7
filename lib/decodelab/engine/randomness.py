"""Counter-based per-request randomness: a uniform per (request seed, output token index).

A pure function of its two inputs, computed on the host with each step's other inputs: no
generator state lives on the device or is shared between requests, so which requests share a
batch, their order, and preemption followed by recompute leave a request's stream unchanged.
"""

from __future__ import annotations

import numpy as np

_M32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer avalanche hash (uint64 lanes holding 32-bit values)."""
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    return (x >> np.uint64(16)) ^ x


def seed_keys(seeds: np.ndarray) -> np.ndarray:
    """The per-request half of the hash (computed once, at admission): uint64 lanes."""
    s = seeds.astype(np.uint64)
    return _mix32((s & _M32) ^ _mix32((s >> np.uint64(32)) ^ np.uint64(0x9E3779B9)))


def key_uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, from a seed key and a token counter."""
    c = counters.astype(np.uint64)
    h = _mix32(keys ^ _mix32((c & _M32) ^ np.uint64(0x85EBCA6B)))
    h = _mix32(h ^ (c >> np.uint64(32)))
    return (((h >> np.uint64(8)).astype(np.float64) + 0.5) / 2.0**24).astype(np.float32)


def row_uniforms(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, a pure function of (seed, counter)."""
    return key_uniforms(seed_keys(seeds), counters)
