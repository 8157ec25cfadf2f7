"""Counter-based per-request randomness: a uniform per (request seed, output token index).

A pure function of its two inputs, computed on the host with each step's other inputs: no
generator state lives on the device or is shared between requests, so which requests share a
batch, their order, and preemption followed by recompute leave a request's stream unchanged.

The whole seed keys the stream: :func:`seed_keys` maps every seed in [0, 2**64) one-to-one
onto a 64-bit key (SamplingParams allows [0, 2**63 - 1]), and both 32-bit words of the key
enter the hash, so distinct seeds never share a key. The counter is a token index, below
2**32. A seed below 2**32 has a high key word of 0 and draws the uniforms of the 32-bit key
used before: its stream is unchanged.
"""

from __future__ import annotations

import numpy as np

_M32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def _mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer avalanche hash (uint64 lanes holding 32-bit values); a bijection of
    [0, 2**32) with _mix32(0) = 0."""
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    return (x >> np.uint64(16)) ^ x


def seed_keys(seeds: np.ndarray) -> np.ndarray:
    """The per-request half of the hash (computed once, at admission): uint64 keys.

    One-to-one: the high word _mix32(seed_hi) gives back seed_hi, then the low word (seed_lo
    mixed with it) gives back seed_lo."""
    s = seeds.astype(np.uint64)
    hi = s >> _32
    return (_mix32(hi) << _32) | _mix32((s & _M32) ^ _mix32(hi ^ np.uint64(0x9E3779B9)))


def key_uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, from a seed key and a token counter."""
    c = counters.astype(np.uint64)
    h = _mix32((keys & _M32) ^ _mix32(c ^ np.uint64(0x85EBCA6B)))
    h = _mix32(h ^ (keys >> _32))  # the key's high word: 0 for seeds below 2**32
    return (((h >> np.uint64(8)).astype(np.float64) + 0.5) / 2.0**24).astype(np.float32)


def row_uniforms(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, a pure function of (seed, counter)."""
    return key_uniforms(seed_keys(seeds), counters)
