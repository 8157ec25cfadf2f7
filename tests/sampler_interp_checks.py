"""The fused sampler's Triton kernels in Triton's CPU interpreter (fp32) against the sampling
rule and the plain-torch reference, run by test_triton_interpreter.py in a child process with
TRITON_INTERPRET=1 (set before the kernels are defined). The vocabularies are small (4096 to
8192 tokens), so the per-program sizes are scaled down (``fused_sampler.TOKENS_PER_PROGRAM``
and ``TILE`` are read at each launch): a row still spans several programs.

    python tests/sampler_interp_checks.py CHECK [CHECK ...]
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from sampling_rule import thresholds, token_ok
from triton_interp_checks import _bool_comparisons, _scalar_loop_bounds

from decodelab.engine.randomness import row_uniforms
from decodelab.engine.sampler import (
    RowParams,
    SamplerMode,
    choose_mode,
    device_top_k,
    fused,
    inv_temperature,
    penalised,
    sample,
)

TOL_FUSED = 2e-6  # float32 sums in tiles and chunks: a few ulps of the mass
TOL_REF = 3e-5  # the reference's cumsum runs sequentially over the vocabulary
# (temperature, top_k, top_p, min_p): every kind of row
KINDS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.6, 0, 1.0, 0.0), (1.5, 0, 1.0, 0.0),
         (0.9, 0, 1.0, 0.1), (1.0, 0, 1.0, 0.02), (1.0, 0, 0.9, 0.0), (3.0, 0, 0.5, 0.0),
         (0.8, 50, 0.9, 0.0), (1.0, 20, 1.0, 0.0), (0.7, 100, 0.95, 0.05), (1.1, 40, 0.8, 0.0),
         (1.0, 2000, 1.0, 0.0), (1.0, 3000, 0.99, 0.0), (1.2, 5000, 0.5, 0.0)]


def _small_programs() -> None:
    from decodelab.engine import fused_sampler

    fused_sampler.TOKENS_PER_PROGRAM, fused_sampler.TILE = 1024, 256


def params(rows, seeds, counter: int = 0) -> RowParams:
    r = np.array([row[:4] for row in rows], dtype=np.float64)
    pens = np.array([row[4:] if len(row) > 4 else (1.0, 0.0, 0.0) for row in rows])
    f = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return RowParams(temperature=f(r[:, 0]), top_k=torch.tensor([device_top_k(int(k))
                                                                  for k in r[:, 1]]),
                     top_p=f(r[:, 2]), min_p=f(r[:, 3]), repetition=f(pens[:, 0]),
                     presence=f(pens[:, 1]), frequency=f(pens[:, 2]),
                     uniform=torch.from_numpy(row_uniforms(np.asarray(seeds),
                                                           np.full(len(rows), counter))),
                     slot=torch.arange(len(rows)),
                     inv_temperature=torch.from_numpy(inv_temperature(r[:, 0])))


def mode_of(rows, penalties: bool = False) -> SamplerMode:
    return choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows],
                       [penalties] * len(rows), 1 << 20)


def _check_rows(logits, rows, p, mode, pen=None) -> None:
    """Every row: greedy rows the argmax; sampling rows a threshold and a token the rule
    allows, within float32 rounding (fused) and the reference's, equal where unambiguous."""
    from decodelab.engine import fused_sampler

    out, tau = fused_sampler.sample(logits, p, fused(mode), pen)
    ref, bad = sample(logits, p, mode, pen)
    assert torch.equal(out < 0, bad), (out, bad)
    z = penalised(logits, p, mode, pen).numpy()
    for i, row in enumerate(rows):
        if bad[i]:
            continue
        if row[0] < 1e-5:
            assert out[i] == ref[i] == int(np.argmax(z[i])), (i, row)
            continue
        invt = float(p.inv_t()[i])
        for tol, t, tok in ((TOL_FUSED, float(tau[i]), int(out[i])),
                            (TOL_REF, None, int(ref[i]))):
            allowed = thresholds(z[i], invt, int(row[1]), float(p.top_p[i]), tol)
            t = min(allowed) if t is None and len(allowed) == 1 else t
            if t is None:  # the reference's threshold is not returned: try those allowed
                assert any(token_ok(z[i], invt, a, float(p.min_p[i]), float(p.uniform[i]),
                                    tok, tol) for a in allowed), (i, row, tok)
                continue
            assert t in allowed, (i, row, t, allowed)
            assert token_ok(z[i], invt, t, float(p.min_p[i]), float(p.uniform[i]), tok, tol), (
                i, row, t, tok)


def _families(v: int, seed: int) -> torch.Tensor:
    """Peaked (randn * 3), flat (randn * 0.7: the 0.9 nucleus holds thousands of tokens) and
    bf16-rounded (ties everywhere) rows, three of each kind."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([3.0, 0.7, 2.0]).repeat_interleave(len(KINDS))
    logits = torch.randn(len(scale), v, generator=g) * scale[:, None]
    logits[2 * len(KINDS):] = logits[2 * len(KINDS):].to(torch.bfloat16).float()
    return logits


def kinds() -> None:
    """Every row kind on peaked, flat and tie-heavy rows, two counters each."""
    _small_programs()
    rows = KINDS * 3
    logits = _families(8192, 0)
    for counter in (0, 1):
        p = params(rows, np.arange(len(rows)) * 7 + 1, counter)
        _check_rows(logits, rows, p, mode_of(rows))


CHECKS = {"kinds": kinds}

if __name__ == "__main__":
    _scalar_loop_bounds()
    _bool_comparisons()
    for name in sys.argv[1:]:
        CHECKS[name]()
        print(f"{name}: ok")
