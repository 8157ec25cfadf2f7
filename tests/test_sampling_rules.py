"""The sampler's rules against transformers (the reference): ties at the k-th logit, a tie
group across the candidate set, top-p before min-p, one greedy rule for tiny temperatures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from decodelab.engine.randomness import row_uniforms
from decodelab.engine.requests import SamplingParams
from decodelab.engine.sampler import (
    RowParams,
    SamplerMode,
    choose_mode,
    keep_mask,
    keep_threshold,
    penalised,
    sample,
)


def params(rows: list[tuple[float, int, float, float]], seeds=None, counter: int = 0) -> RowParams:
    """Rows of (temperature, top_k, top_p, min_p), no penalties."""
    from sampling_rule import row_params

    n = len(rows)
    seeds = np.arange(n) * 7919 + 11 if seeds is None else np.asarray(seeds)
    return row_params(rows, row_uniforms(seeds, np.full(n, counter)))


def kept(logits: torch.Tensor, p: RowParams, mode: SamplerMode) -> torch.Tensor:
    """The reference sampler's kept set (B, V) bool."""
    z = penalised(logits, p, mode, None)
    top = z.max(dim=-1).values
    e = torch.exp((z - top[:, None]) * p.inv_t()[:, None])
    return keep_mask(z, e, keep_threshold(z, top, e, p, mode), p)


def hf_kept(logits: torch.Tensor, t: float, k: int, top_p: float, min_p: float) -> torch.Tensor:
    """transformers' warpers in generate()'s order: temperature, top-k, top-p, min-p."""
    scores = logits.clone().float()
    warpers = [TemperatureLogitsWarper(t)]
    warpers += [TopKLogitsWarper(k)] if k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1 else []
    warpers += [MinPLogitsWarper(min_p)] if min_p > 0 else []
    for w in warpers:
        scores = w(None, scores)
    return scores > float("-inf")


def test_every_token_tied_with_the_kth_is_kept_as_in_transformers():
    logits = torch.tensor([[3.0, 2.0, 1.0, 1.0, 1.0, 0.0]])
    p = params([(1.0, 3, 1.0, 0.0)])
    for mode in (SamplerMode(False, False, 0), SamplerMode(False, False, 4)):  # sort, partial
        got = kept(logits, p, mode)
        assert got.tolist() == [[True, True, True, True, True, False]]
        assert torch.equal(got, hf_kept(logits, 1.0, 3, 1.0, 0.0))
    # and the three tied tokens are drawn alike
    n = 6000
    many = params([(1.0, 3, 1.0, 0.0)] * n, seeds=np.arange(n))
    tokens, _ = sample(logits.expand(n, -1), many, SamplerMode(False, False, 4))
    counts = np.bincount(tokens.numpy(), minlength=6)
    want = np.exp([3.0, 2, 1, 1, 1]) / np.exp([3.0, 2, 1, 1, 1]).sum() * n
    assert counts[5] == 0 and np.all(np.abs(counts[:5] - want) < 5 * np.sqrt(want))


@pytest.mark.parametrize("seed", range(4))
def test_kept_sets_match_transformers_on_bf16_logits(seed):
    """bf16 logits tie often, also at the top-k and top-p boundaries; each filter and their
    combination keep what transformers keeps (top-p: whole tie groups, see below)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, 4000, generator=g) * 2.5).to(torch.bfloat16).float()
    rows = [(1.0, 40, 1.0, 0.0), (0.7, 7, 1.0, 0.05), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1),
            (0.9, 50, 0.9, 0.02), (1.0, 100, 1.0, 0.0)]
    singles = []
    for i, row in enumerate(rows):
        ours = kept(logits[i:i + 1], params([row]), SamplerMode(False, False, 0))
        singles.append(ours)
        theirs = hf_kept(logits[i:i + 1], *row)
        if row[2] < 1:
            # transformers' top-p keeps only the members of the boundary tie group that its
            # sort puts first; we keep the group: a superset by that group alone
            assert (ours >= theirs).all()
            extra = logits[i][(ours & ~theirs)[0]]
            assert extra.numel() == 0 or (extra == extra[0]).all()
        else:
            assert torch.equal(ours, theirs), f"row {row}"
    # the same kept sets with all six rows in one batch
    assert torch.equal(kept(logits, params(rows), SamplerMode(False, False, 0)),
                       torch.cat(singles))


def test_top_p_then_min_p_as_transformers_not_min_p_first():
    """One order, transformers': top-p over the top-k set, then min-p. vLLM applies min-p
    first; on these logits the two distributions are far apart."""
    logits = torch.tensor([[2.0, 1.6, 1.2, 0.8, 0.0, -0.5, -1.0]])
    row = (1.0, 0, 0.8, 0.3)
    ours = kept(logits, params([row]), SamplerMode(False, False, 0))
    assert torch.equal(ours, hf_kept(logits, *row))
    min_p_first = TopPLogitsWarper(0.8)(None, MinPLogitsWarper(0.3)(None, logits.clone()))
    other = min_p_first > float("-inf")
    probs = lambda m: torch.softmax(logits.masked_fill(~m, float("-inf")), dim=-1)  # noqa: E731
    assert 0.5 * (probs(ours) - probs(other)).abs().sum() > 0.1  # the order matters here


def _straddling_logits() -> torch.Tensor:
    """A tie group across the 32 candidates that top_k=20 selects: 30 distinct values, then
    ten tokens tied, spread over the vocabulary."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 5000, generator=g) - 10
    ids = torch.randperm(5000, generator=g)[:40]
    logits[0, ids[:30]] = torch.linspace(6, 2, 30)
    logits[0, ids[30:]] = 1.5
    return logits


def test_a_seeded_top_k_row_is_the_same_alone_and_beside_a_top_p_row():
    """Alone, the top-k row takes partial selection; beside a top-p-only row the batch takes
    the full sort. The tie group across the candidate edge must not change its tokens."""
    logits = _straddling_logits()
    row_k, row_p = (1.8, 35, 1.0, 0.0), (1.0, 0, 0.9, 0.0)
    alone_mode = choose_mode([False], [35], [False], 5000)
    pair_mode = choose_mode([False, False], [35, 0], [False, False], 5000)
    assert alone_mode.k_cand == 64 and pair_mode.k_cand == 0
    for seed in range(300):
        alone, _ = sample(logits, params([row_k], seeds=[seed]), alone_mode)
        pair, _ = sample(logits.expand(2, -1), params([row_k, row_p], seeds=[seed, 1]), pair_mode)
        assert alone.item() == pair[0].item(), seed


@pytest.mark.parametrize("temperature", [1e-50, 1e-7, 9.9999e-6])
def test_a_tiny_temperature_is_greedy_alone_and_in_any_batch(temperature):
    assert SamplingParams(temperature=temperature).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 300, generator=g)
    want = logits.argmax(dim=-1)
    tiny, greedy = (temperature, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0)
    for rows in ([tiny, tiny], [tiny, greedy], [greedy, tiny]):
        flags = [SamplingParams(temperature=r[0]).greedy for r in rows]
        mode = choose_mode(flags, [0, 0], [False, False], 300)
        for seed in range(20):
            tokens, _ = sample(logits, params(rows, seeds=[seed, seed + 1]), mode)
            assert torch.equal(tokens, want)


def _flat_bf16(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Flat bf16 logits: the 0.9 nucleus holds thousands of tokens, and values tie in groups."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * 0.7).to(torch.bfloat16).float()


def test_large_nuclei_and_deep_top_k_keep_what_transformers_keeps():
    """Rows that leave any candidate buffer: top-p alone over a nucleus of thousands of tokens,
    top-k 2000 and 1500 (its k-th value tied), min-p alone, on flat bf16 logits."""
    logits = _flat_bf16(5, 8192, 3)
    rows = [(1.0, 0, 0.9, 0.0), (0.7, 0, 0.95, 0.0), (1.0, 2000, 1.0, 0.0),
            (1.2, 1500, 0.95, 0.0), (0.9, 0, 1.0, 0.02)]
    ours = kept(logits, params(rows), SamplerMode(False, False, 0))
    assert ours[0].sum() > 4000 and ours[1].sum() > 1024  # nuclei past any buffer
    kth = torch.sort(logits[3], descending=True).values[1499]
    assert (logits[3] == kth).sum() > 1  # the k-th value is tied
    for i, row in enumerate(rows):
        theirs = hf_kept(logits[i:i + 1], *row)[0]
        assert (ours[i] >= theirs).all(), row
        extra = logits[i][ours[i] & ~theirs]
        # top-p: only the boundary tie group beyond transformers' sorted prefix
        assert extra.numel() == 0 or (row[2] < 1 and (extra == extra[0]).all()), row
