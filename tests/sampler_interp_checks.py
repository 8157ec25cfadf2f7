"""The fused sampler's Triton kernels in Triton's CPU interpreter (fp32) against the sampling
rule and the plain-torch reference, run by test_triton_interpreter.py in a child process with
TRITON_INTERPRET=1 (set before the kernels are defined). The vocabularies are small (4096 to
8192 tokens), so the per-program sizes are scaled down (``fused_sampler.TOKENS_PER_PROGRAM``
and ``TILE`` are read at each launch): a row still spans several programs.

    python tests/sampler_interp_checks.py CHECK [CHECK ...]
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import torch
from sampling_rule import row_params, thresholds, token_ok
from triton_interp_checks import _bool_comparisons, _scalar_loop_bounds

from decodelab.engine.randomness import row_uniforms
from decodelab.engine.sampler import (
    RowParams,
    SamplerMode,
    choose_mode,
    fused,
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
    """Sizes for vocabularies of 4096 to 8192: a row spans 4 to 8 programs, and the buffer
    is small enough that flat rows refine a window."""
    from decodelab.engine import fused_sampler

    fused_sampler.TOKENS_PER_PROGRAM, fused_sampler.TILE = 1024, 512
    fused_sampler.BUF, fused_sampler.SMALL_BUF = 512, 128


def params(rows, seeds, counter: int = 0) -> RowParams:
    return row_params(rows, row_uniforms(np.asarray(seeds), np.full(len(rows), counter)))


def mode_of(rows, vocab: int, penalties: bool = False) -> SamplerMode:
    return choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows],
                       [penalties] * len(rows), vocab)


def _check_rows(logits, rows, p, mode, pen=None, row_passes=()) -> torch.Tensor:
    """Every row: greedy rows the argmax; sampling rows a threshold and a token the rule
    allows, within float32 rounding (fused) and the reference's, equal where unambiguous.
    ``row_passes``: the rows expected to leave the candidates for exact passes over the row
    (none by default: every kind of row on its fast path). Returns each row's path."""
    from decodelab.engine import fused_sampler

    paths = torch.zeros(len(rows), dtype=torch.int32)
    out, tau = fused_sampler.sample(logits, p, fused(mode), pen, paths=paths)
    assert (paths == 2).nonzero().flatten().tolist() == list(row_passes), paths
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
    return paths


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
        paths = _check_rows(logits, rows, p, mode_of(rows, logits.shape[1]))
        filtered = [i for i, r in enumerate(rows) if r[1] or r[2] < 1]
        assert set(paths[filtered].tolist()) == {0, 1}, paths  # coarse bins and windows


def _planted(v: int, seed: int, values: list[tuple[float, int]], rest: float) -> torch.Tensor:
    """One row: ``count`` tokens of each ``value`` at random ids, every other token ``rest``
    plus noise far below."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(v, generator=g) * 0.5 + rest
    ids = torch.randperm(v, generator=g)
    at = 0
    for value, count in values:
        z[ids[at:at + count]] = value
        at += count
    return z


def ties() -> None:
    """Tie groups at each boundary: at the k-th value (five kept of top-k 3; 3000 tokens at
    the 20th, past the small sort; the k-th of k = 1500 inside a group of a quantised flat
    row), at the top-p boundary of a quantised flat row, and a group straddling what a
    partial selection of the reference would see, alone and beside a top-p row."""
    from decodelab.engine import fused_sampler

    _small_programs()
    fused_sampler.BUF, fused_sampler.SMALL_BUF = 4096, 1024  # the 3000 tied: the large sort
    v = 4096
    g = torch.Generator().manual_seed(3)
    flat = torch.round(torch.randn(v, generator=g) * 14) / 20  # steps of 0.05: big ties
    cases = [  # (row, logits row, the threshold it must have)
        ((1.0, 3, 1.0, 0.0), _planted(v, 0, [(3.0, 1), (2.0, 1), (1.0, 3), (0.0, 1)], -30), 1.0),
        ((1.0, 20, 0.9, 0.0), _planted(v, 1, [(5.0 - 0.1 * i, 1) for i in range(19)]
                                         + [(2.0, 3000)], -20), None),
        ((1.0, 1500, 1.0, 0.0), flat, None), ((1.0, 0, 0.9, 0.0), flat, None),
        ((0.7, 0, 0.8, 0.0), flat, None), ((1.0, 700, 0.95, 0.0), flat, None)]
    rows = [r for r, _, _ in cases]
    logits = torch.stack([lg for _, lg, _ in cases])
    z = logits.numpy()
    k_tied = [(z[i] == np.sort(z[i])[::-1][r[1] - 1]).sum() for i, r in enumerate(rows) if r[1]]
    assert min(k_tied) > 1, k_tied  # the k-th value is tied in every top-k case
    for counter in range(2):
        p = params(rows, np.arange(len(rows)) + 10, counter)
        _check_rows(logits, rows, p, mode_of(rows, logits.shape[1]))
        _, tau = fused_sampler.sample(logits, p, fused(mode_of(rows, logits.shape[1])))
        for i, (_, _, want) in enumerate(cases):
            assert want is None or float(tau[i]) == want, (i, float(tau[i]))
    from test_sampling_rules import _straddling_logits

    logits = _straddling_logits()
    row_k, row_p = (1.8, 35, 1.0, 0.0), (1.0, 0, 0.9, 0.0)
    for seed in range(4):
        alone, _ = fused_sampler.sample(logits, params([row_k], [seed]),
                                        fused(mode_of([row_k], 5000)))
        pair, _ = fused_sampler.sample(logits.expand(2, -1).contiguous(),
                                       params([row_k, row_p], [seed, 1]),
                                       fused(mode_of([row_k, row_p], 5000)))
        ref, _ = sample(logits, params([row_k], [seed]), mode_of([row_k], 5000))
        assert alone.item() == pair[0].item() == ref.item(), seed


def invariance() -> None:
    """Each row alone equals its row of a mixed batch bit for bit (token and threshold), the
    batch with penalties in other rows and greedy rows beside it."""
    from decodelab.engine import fused_sampler
    from decodelab.engine.sampler import PenaltyState

    _small_programs()
    rows = KINDS + [(1.1, 40, 0.8, 0.0, 1.3, 0.2, 0.4), (0.0, 0, 1.0, 0.0, 1.5, 0.5, 0.5)]
    logits = _families(4096, 5)[len(KINDS):2 * len(KINDS) + 2]
    seeds = np.arange(len(rows)) * 3 + 1
    pen = PenaltyState.empty(len(rows), 4096, torch.device("cpu"))
    pen.counts[:, :200] = 2
    pen.in_prompt[:, 200:400] = True
    together, tau = fused_sampler.sample(logits, params(rows, seeds),
                                         fused(mode_of(rows, 4096, True)), pen)
    for i, row in enumerate(rows):
        one = params([row], seeds[i:i + 1])
        one.slot = torch.tensor([i])
        has_pen = len(row) > 4
        alone, tau1 = fused_sampler.sample(logits[i:i + 1], one,
                                           fused(mode_of([row], 4096, has_pen)), pen)
        assert alone.item() == together[i].item(), (i, row)
        assert tau1.item() == tau[i].item(), (i, row)


def penalties() -> None:
    """Penalised rows of every kind against the rule on their penalised logits."""
    from decodelab.engine.sampler import PenaltyState

    _small_programs()
    rows = [(*r, 1.3, 0.2, 0.4) for r in KINDS]
    logits = _families(4096, 6)[:2 * len(KINDS)]
    rows2 = rows * 2
    pen = PenaltyState.empty(len(rows2), 4096, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    pen.counts.copy_(torch.randint(0, 3, pen.counts.shape, generator=g, dtype=torch.int32)
                     * (torch.rand(pen.counts.shape, generator=g) < 0.05))
    pen.in_prompt.copy_(torch.rand(pen.in_prompt.shape, generator=g) < 0.05)
    _check_rows(logits, rows2, params(rows2, np.arange(len(rows2))), mode_of(rows2, 4096, True),
                pen)


def edges() -> None:
    """NaN, +inf and all -inf rows flagged (-1) alone; rows with half their tokens at -inf (a
    masked vocabulary, whole chunks of it); the greedy argmax's first index on ties."""
    _small_programs()
    v = 4096
    rows = [(1.0, 0, 1.0, 0.0)] * 3 + [(1.0, 0, 1.0, 0.0), (1.0, 100, 0.9, 0.0),
                                       (1.0, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.05),
                                       (1.0, 3000, 1.0, 0.0), (0.0, 0, 1.0, 0.0)]
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(len(rows), v, generator=g)
    logits[0, 5], logits[1, 7], logits[2] = float("nan"), float("inf"), float("-inf")
    logits[3:8, 1024:3072] = float("-inf")  # two whole programs' chunks and part of others
    logits[8, [9, 99, 999]] = 10.0  # three tied maxima: the first id wins
    p = params(rows, np.arange(len(rows)))
    # k = 3000 of 2048 finite tokens: the k-th is -inf, with 2047 others in one gap unit
    _check_rows(logits, rows, p, mode_of(rows, logits.shape[1]), row_passes=(7,))
    from decodelab.engine import fused_sampler

    out, _ = fused_sampler.sample(logits, p, fused(mode_of(rows, logits.shape[1])))
    assert out[:3].tolist() == [-1, -1, -1] and out[8] == 9, out


def step() -> None:
    """``sample_step``: the tokens, ``last_token[slot]`` and the penalty counts it leaves are
    the reference step's where the tokens agree (every row here)."""
    from decodelab.engine.sampler import PenaltyState, sample_step

    _small_programs()
    rows = [(*r, 1.2, 0.1, 0.2) for r in KINDS[:9]]
    logits = _families(4096, 9)[:len(rows)]
    p = params(rows, np.arange(len(rows)))
    p.slot = torch.arange(len(rows)).flip(0)
    tables = []
    for m in (fused(mode_of(rows, 4096, True)), mode_of(rows, 4096, True)):
        pen = PenaltyState.empty(len(rows) + 1, 4096, torch.device("cpu"))
        pen.counts[:, :50] = 1
        last = torch.full((len(rows) + 1,), 7, dtype=torch.int64)
        out = torch.zeros(len(rows), dtype=torch.int64)
        sample_step(logits, p, m, pen, last, out)
        tables.append((out, last, pen.counts))
    assert all(torch.equal(a, b) for a, b in zip(*tables, strict=True))


def tiers() -> None:
    """Tie groups at the k-th value of each sort size's reach (scaled: up to 128, 256 and 512
    candidates), with min-p sparing the tokens above the candidates (their kept masses from
    the candidates) and cutting into them (a pass for the masses): all by the rule, none on
    exact passes."""
    _small_programs()
    v, above = 4096, [(5.0 - 0.1 * i, 1) for i in range(9)]  # e from 1 to exp(-0.8)
    logits = torch.stack([_planted(v, 20 + i, above + [(2.0, n)], -20)
                          for i, n in enumerate((100, 200, 400))])
    rows = [(1.0, 10, 1.0, 0.0), (1.0, 10, 0.95, 0.01), (1.0, 10, 1.0, 0.5)]
    cases = [(r, lg) for r in rows for lg in logits]
    logits = torch.stack([lg for _, lg in cases])
    rows = [r for r, _ in cases]
    for counter in range(2):
        p = params(rows, np.arange(len(rows)) + 30, counter)
        _check_rows(logits, rows, p, mode_of(rows, v))


def fallback() -> None:
    """Tie groups larger than a (scaled) buffer cannot be split: those rows take exact passes
    over the row and still follow the rule; the others stay on the candidates."""
    from decodelab.engine import fused_sampler

    _small_programs()
    fused_sampler.BUF, fused_sampler.SMALL_BUF = 8, 4
    rows = KINDS
    g = torch.Generator().manual_seed(11)
    logits = torch.round(torch.randn(len(rows), 4096, generator=g) * 14) / 20  # big ties
    p = params(rows, np.arange(len(rows)))
    paths = torch.zeros(len(rows), dtype=torch.int32)
    fused_sampler.sample(logits, p, fused(mode_of(rows, logits.shape[1])), paths=paths)
    passes = (paths == 2).nonzero().flatten().tolist()
    assert 3 <= len(passes) < sum(r[1] > 0 or r[2] < 1 for r in rows), paths
    _check_rows(logits, rows, p, mode_of(rows, logits.shape[1]), row_passes=passes)


def unneeded() -> None:
    """Batches of plain, greedy and min-p-alone rows (and without the min-p rows) give the same
    tokens and thresholds whether the threshold kernels they do not need run or not."""
    from decodelab.engine import fused_sampler

    _small_programs()
    plain = [(1.0, 0, 1.0, 0.0), (0.6, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0)] * 2
    for rows in (plain + [(0.9, 0, 1.0, 0.1)] * 2, plain):
        logits = _families(4096, 3)[:len(rows)]
        p = params(rows, np.arange(len(rows)) * 3 + 2)
        told = choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows],
                           [False] * len(rows), 4096, top_p=[r[2] for r in rows],
                           min_p=[r[3] for r in rows])
        assert not told.filters and told.min_p == (len(rows) > len(plain))
        got = fused_sampler.sample(logits, p, fused(told))
        want = fused_sampler.sample(logits, p, fused(replace(told, filters=True, min_p=True)))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), told


# The serving mix of issue 24 and more, on rows of the GPU's size and type
MIX = [(0.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.0), (1.0, 20, 1.0, 0.0), (0.7, 100, 0.95, 0.05),
       (1.1, 40, 0.8, 0.0), (1.0, 0, 0.9, 0.0), (0.9, 0, 1.0, 0.1), (1.0, 0, 1.0, 0.0),
       (0.6, 0, 1.0, 0.0), (1.0, 5000, 0.99, 0.0), (1.0, 0, 0.95, 0.0), (1.0, 2000, 1.0, 0.0)]


def full_size() -> None:
    """V = 128256 bf16 logits (peaked, flat: the 0.9 nucleus of tens of thousands of tokens,
    middling) with the GPU's program sizes: every row on the candidates, by the rule."""
    rows = MIX * 3
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([3.0, 1.0, 2.0]).repeat_interleave(len(MIX))
    logits = (torch.randn(len(rows), 128256, generator=g) * scale[:, None]).to(torch.bfloat16)
    paths = _check_rows(logits.float(), rows, params(rows, np.arange(len(rows))),
                        mode_of(rows, logits.shape[1]))
    flat = [len(MIX) + i for i, r in enumerate(MIX) if r[1] == 0 and r[2] < 1]
    assert (paths[flat] == 1).all(), paths  # flat top-p rows: their window refined


def grid() -> None:
    """The sampler grid bench's fused rows (tiny sizes): every kind validated against the rule
    and the torch sampler, none on exact row passes."""
    from decodelab.core.timing import TimingConfig
    from decodelab.engine.bench import sampler_grid

    _small_programs()
    cfg = sampler_grid.GridConfig((4,), (2048,), (*sampler_grid.KINDS, "mix"), ("fused",),
                                  timing=TimingConfig(0, 1, 1))
    rows = sampler_grid.grid_rows(cfg, torch.device("cpu"))
    assert len(rows) == len(cfg.kinds) and all(r.row_passes == 0 for r in rows), rows
    assert all(r.in_kept_set >= 0.75 and r.agrees_with_torch >= 0.75 for r in rows), rows


CHECKS = {"kinds": kinds, "ties": ties, "tiers": tiers, "invariance": invariance,
          "penalties": penalties, "edges": edges, "step": step, "fallback": fallback,
          "full_size": full_size, "grid": grid, "unneeded": unneeded}

SIZES = ("TOKENS_PER_PROGRAM", "TILE", "BUF", "SMALL_BUF")

if __name__ == "__main__":
    from decodelab.engine import fused_sampler

    _scalar_loop_bounds()
    _bool_comparisons()
    gpu_sizes = {name: getattr(fused_sampler, name) for name in SIZES}
    for name in sys.argv[1:]:
        for size, value in gpu_sizes.items():  # a check's scaled sizes end with it
            setattr(fused_sampler, size, value)
        CHECKS[name]()
        print(f"{name}: ok")
