"""The fused Triton sampler against the plain-torch reference on the GPU: the same kept set
(the same threshold per row), the same tokens, exact greedy rows, both tie rules, and a row's
token independent of its batch. Distributions: ``test_sampling``'s mixed-batch test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decodelab.engine.randomness import row_uniforms
from decodelab.engine.sampler import (
    PenaltyState,
    RowParams,
    SamplerMode,
    choose_mode,
    fused,
    keep_threshold,
    penalised,
    sample,
)

pytestmark = pytest.mark.gpu
V = 128256
# (temperature, top_k, top_p, min_p, repetition, presence, frequency): every kind of row,
# including those the buffer cannot hold (top_k 5000, a flat nucleus, no filter at all)
ROWS = [(0.0, 0, 1.0, 0.0, 1, 0, 0), (0.8, 50, 0.9, 0.0, 1, 0, 0), (1.0, 20, 1.0, 0.0, 1, 0, 0),
        (0.7, 100, 0.95, 0.05, 1, 0, 0), (1.1, 40, 0.8, 0.0, 1.3, 0.2, 0.4),
        (1.0, 0, 0.9, 0.0, 1, 0, 0), (0.6, 0, 1.0, 0.1, 1, 0, 0), (1.0, 0, 1.0, 0.0, 1, 0, 0),
        (1.0, 5000, 0.99, 0.0, 1, 0, 0), (0.0, 0, 1.0, 0.0, 1.5, 0.5, 0.5),
        (1e-7, 10, 0.9, 0.0, 1, 0, 0), (3.0, 0, 0.5, 0.0, 1, 0, 0)]


def params(rows, seeds, counter: int = 0, dev: str = "cuda") -> RowParams:
    from sampling_rule import row_params

    return row_params(rows, row_uniforms(np.asarray(seeds), np.full(len(rows), counter)),
                      device=dev)


def bench_logits(b: int, seed: int) -> torch.Tensor:
    """bf16 logits as the model's head produces them (ties everywhere), a NaN row."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, V, generator=g) * 3).to(torch.bfloat16)
    logits[b - 1, 17] = float("nan")
    return logits.cuda()


def penalty_state(b: int) -> PenaltyState:
    pen = PenaltyState.empty(b, V, torch.device("cuda"))
    pen.counts[:, :200] = 2
    pen.in_prompt[:, 200:400] = True
    return pen


def reference_threshold(logits, p, mode, pen):
    z = penalised(logits, p, mode, pen)
    top = z.max(dim=-1).values
    e = torch.exp((z - top[:, None]) * p.inv_t()[:, None])
    return keep_threshold(z, top, e, p, mode)


@pytest.mark.parametrize("seed", range(3))
def test_fused_kept_sets_and_tokens_equal_the_reference(seed):
    rows = ROWS * 3
    b = len(rows)
    p, pen = params(rows, np.arange(b) + 100 * seed, seed), penalty_state(b)
    logits = bench_logits(b, seed)
    mode = choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows], [True] * b, V)
    ref_tokens, ref_bad = sample(logits, p, mode, pen)
    from decodelab.engine import fused_sampler

    out, tau = fused_sampler.sample(logits, p, fused(mode), pen)
    assert torch.equal(out < 0, ref_bad) and ref_bad[-1] and not ref_bad[:-1].any()
    greedy = ~p.sampling()
    assert torch.equal(out[greedy & ~ref_bad], ref_tokens[greedy & ~ref_bad])  # exact argmax
    sampling = p.sampling() & ~ref_bad
    want_tau = reference_threshold(logits, p, mode, pen)
    # float sums run in another order: a boundary within rounding may fall the other way
    tau_diff = (tau[sampling] != want_tau[sampling]).sum().item()
    tok_diff = (out[sampling] != ref_tokens[sampling]).sum().item()
    assert tau_diff <= 1 and tok_diff <= 1, (tau_diff, tok_diff)


def test_fused_rows_do_not_depend_on_their_batch():
    rows = ROWS * 2
    b = len(rows)
    seeds = np.arange(b) * 3 + 1
    logits, pen = bench_logits(b, 7), penalty_state(b)
    p = params(rows, seeds)
    mode = fused(choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows], [True] * b, V))
    from decodelab.engine import fused_sampler

    together, tau = fused_sampler.sample(logits, p, mode, pen)
    for i in range(b):
        one = params([rows[i]], seeds[i:i + 1])
        one.slot = torch.tensor([i], device="cuda")
        greedy, has_pen = rows[i][0] < 1e-5, rows[i][4:] != (1, 0, 0)
        m = fused(SamplerMode(greedy, has_pen, 0, greedy))
        alone, tau1 = fused_sampler.sample(logits[i:i + 1], one, m, pen)
        assert alone.item() == together[i].item(), (i, rows[i])
        if not greedy:
            assert tau1.item() == tau[i].item() or tau[i] != tau[i]


def test_fused_ties_at_the_kth_logit_and_across_the_buffer():
    from decodelab.engine import fused_sampler

    logits = torch.tensor([[3.0, 2.0, 1.0, 1.0, 1.0, 0.0]], device="cuda")
    p = params([(1.0, 3, 1.0, 0.0, 1, 0, 0)], [0])
    _, tau = fused_sampler.sample(logits, p, fused(SamplerMode(False, False, 0, False)))
    assert tau.item() == 1.0  # all three tied tokens kept
    # a tie group of 3000 tokens at the 20th value: larger than the buffer, exact passes
    g = torch.Generator().manual_seed(1)
    big = torch.randn(1, V, generator=g) - 20
    ids = torch.randperm(V, generator=g)
    big[0, ids[:19]] = torch.linspace(5, 3, 19)
    big[0, ids[19:3019]] = 2.0
    big = big.cuda()
    for seed in range(20):
        one = params([(1.0, 20, 0.9, 0.0, 1, 0, 0)], [seed])
        got, tau = fused_sampler.sample(big, one, fused(SamplerMode(False, False, 0, False)))
        want, _ = sample(big, one, SamplerMode(False, False, 0, False))
        assert got.item() == want.item()
        assert tau.item() == reference_threshold(big, one, SamplerMode(False, False, 0), None).item()


def test_fused_tie_group_across_the_candidates_alone_and_beside_a_top_p_row():
    """``test_sampling_rules``' case on the GPU: the fused kernels and the reference's two
    candidate paths give one token per seed."""
    from test_sampling_rules import _straddling_logits

    from decodelab.engine import fused_sampler

    logits = _straddling_logits().cuda()
    row_k, row_p = (1.8, 35, 1.0, 0.0, 1, 0, 0), (1.0, 0, 0.9, 0.0, 1, 0, 0)
    for seed in range(300):
        alone, _ = fused_sampler.sample(logits, params([row_k], [seed]),
                                        fused(SamplerMode(False, False, 0, False)))
        pair, _ = fused_sampler.sample(logits.expand(2, -1).contiguous(),
                                       params([row_k, row_p], [seed, 1]),
                                       fused(SamplerMode(False, False, 0, False)))
        ref, _ = sample(logits, params([row_k], [seed]), choose_mode([False], [35], [False],
                                                                     logits.shape[1]))
        assert alone.item() == pair[0].item() == ref.item(), seed


# Rows that used to leave the buffer for passes over the row, and the issue-24 mix
LARGE = [(1.0, 0, 0.9, 0.0, 1, 0, 0), (0.6, 0, 1.0, 0.0, 1, 0, 0), (0.9, 0, 1.0, 0.1, 1, 0, 0),
         (1.0, 2000, 1.0, 0.0, 1, 0, 0), (1.0, 5000, 0.99, 0.0, 1, 0, 0),
         (1.2, 3000, 0.5, 0.0, 1, 0, 0), (0.7, 0, 0.95, 0.0, 1, 0, 0),
         (0.8, 50, 0.9, 0.0, 1, 0, 0), (0.7, 100, 0.95, 0.05, 1, 0, 0)]


@pytest.mark.parametrize("scale", [1.0, 2.0, 3.0])
def test_fused_follows_the_rule_for_every_row_kind_on_its_fast_path(scale):
    """bf16 logits at V = 128256, flat (scale 1: the 0.9 nucleus ~78k tokens) to peaked:
    every row's threshold and token the rule's up to float32 rounding of the sums
    (``sampling_rule``), and no row leaves the candidates for passes over the row."""
    from sampling_rule import thresholds, token_ok

    from decodelab.engine import fused_sampler

    rows = ROWS + LARGE
    b = len(rows)
    g = torch.Generator().manual_seed(int(scale * 10))
    logits = (torch.randn(b, V, generator=g) * scale).to(torch.bfloat16).cuda()
    p, pen = params(rows, np.arange(b) + 7), penalty_state(b)
    mode = choose_mode([r[0] < 1e-5 for r in rows], [r[1] for r in rows], [True] * b, V)
    paths = torch.zeros(b, dtype=torch.int32, device="cuda")
    out, tau = fused_sampler.sample(logits, p, fused(mode), pen, paths=paths)
    assert (paths < 2).all(), paths
    z = penalised(logits, p, mode, pen).cpu().numpy()
    out, tau, invt = out.cpu(), tau.cpu(), p.inv_t().cpu()
    for i, row in enumerate(rows):
        if row[0] < 1e-5:
            assert out[i] == int(np.argmax(z[i])), (i, row)
            continue
        assert float(tau[i]) in thresholds(z[i], float(invt[i]), row[1], row[2], 2e-6), (i, row)
        assert token_ok(z[i], float(invt[i]), float(tau[i]), row[3], float(p.uniform[i]),
                        int(out[i]), 2e-6), (i, row)
