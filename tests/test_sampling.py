"""The batched sampler: each row of a mixed batch follows its own parameters (statistically),
greedy rows are exact, partial selection equals the full sort, rows are batch-invariant."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from sampling_rule import row_params

from decodelab.core.capture import capture, warm_up
from decodelab.engine.requests import SamplingParams
from decodelab.engine.row_sampling import RowSampling
from decodelab.engine.sampler import (
    PenaltyState,
    RowParams,
    SamplerMode,
    choose_mode,
    fused,
    row_uniforms,
    sample,
    sample_step,
    seed_keys,
    top_values,
)

V = 24
# (temperature, top_k, top_p, min_p, repetition, presence, frequency)
ROWS = [
    (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),  # greedy
    (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),  # plain softmax
    (0.5, 5, 1.0, 0.0, 1.0, 0.0, 0.0),  # cold, top-5
    (1.3, 0, 0.7, 0.0, 1.0, 0.0, 0.0),  # hot, nucleus
    (1.0, 12, 0.9, 0.2, 1.0, 0.0, 0.0),  # all three filters
    (0.8, 0, 1.0, 0.0, 1.5, 0.4, 0.3),  # penalties
]


def expected(logits: np.ndarray, row, counts: np.ndarray, in_prompt: np.ndarray) -> np.ndarray:
    """Reference distribution of one row, written the textbook way (float64)."""
    t, k, p, mp, rep, pres, freq = row
    z = logits.astype(np.float64).copy()
    seen = (counts > 0) | in_prompt
    z = np.where(seen, np.where(z > 0, z / rep, z * rep), z) - freq * counts - pres * (counts > 0)
    if t == 0:
        out = np.zeros_like(z)
        out[np.argmax(z)] = 1
        return out
    order = np.argsort(-z, kind="stable")
    probs = np.exp((z[order] - z[order][0]) / t)
    if k:
        probs[k:] = 0
    probs /= probs.sum()
    keep = (np.cumsum(probs) - probs) < p
    keep &= probs >= mp * probs[0]
    probs = probs * keep
    out = np.zeros_like(z)
    out[order] = probs / probs.sum()
    return out


def params_for(rows, n_rep: int, counter0: int = 0) -> RowParams:
    """Each row n_rep times (slot: its index in ``rows``), seeded per row, counters 0.."""
    seeds = np.repeat(np.arange(len(rows)) * 7919 + 11, n_rep)
    counters = np.tile(np.arange(n_rep), len(rows)) + counter0
    return row_params([r for r in rows for _ in range(n_rep)], row_uniforms(seeds, counters),
                      np.repeat(np.arange(len(rows)), n_rep))


@pytest.fixture(scope="module")
def setup():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(ROWS), V, generator=g) * 2.0
    pen = PenaltyState.empty(len(ROWS), V, torch.device("cpu"))
    pen.counts[5, [1, 2, 2, 7]] = torch.tensor([1, 2, 2, 1], dtype=torch.int32)
    pen.in_prompt[5, [3, 4]] = True
    order = logits[5].argsort(descending=True)
    pen.counts[5, order[:2]] += 2  # penalise the two favourites so the effect is visible
    return logits, pen


def chi_square_ok(counts: np.ndarray, want: np.ndarray) -> tuple[bool, float, float]:
    """Pearson's chi-square of observed counts against probabilities ``want`` (> 0 where
    counted), against its 1e-4 upper quantile (Wilson-Hilferty): (passes, statistic, bound)."""
    n, support = counts.sum(), want > 0
    expect = want[support] * n
    stat = float(((counts[support] - expect) ** 2 / expect).sum())
    df = max(int(support.sum()) - 1, 1)
    bound = df * (1 - 2 / (9 * df) + 3.719 * np.sqrt(2 / (9 * df))) ** 3
    return stat <= bound, stat, bound


@pytest.mark.parametrize("k_cand", [0, 16, 32, pytest.param("fused", marks=pytest.mark.gpu)])
def test_mixed_batch_rows_follow_their_own_parameters(setup, k_cand):
    """Each row of one mixed batch against its own textbook distribution: no token outside
    its kept set, total variation and Pearson's chi-square; ``fused``: the Triton kernels."""
    logits, pen = setup
    rows = ROWS if k_cand in (0, "fused") else [r for r in ROWS if r[1] or r[0] == 0]
    idx = [ROWS.index(r) for r in rows]
    n = 20_000
    params = params_for(rows, n)
    lg = logits[idx].repeat_interleave(n, dim=0)
    params.slot = torch.tensor(idx).repeat_interleave(n)
    mode = SamplerMode(all_greedy=False, penalties=True, k_cand=0 if k_cand == "fused" else k_cand,
                       fused=k_cand == "fused")
    if mode.fused:
        dev = torch.device("cuda")
        lg, pen = lg.to(dev), PenaltyState(pen.counts.to(dev), pen.in_prompt.to(dev))
        params = RowParams(params.block.to(dev))
    tokens, bad = sample(lg, params, mode, pen)
    assert not bad.any()
    tokens = tokens.cpu()
    for j, (row, i) in enumerate(zip(rows, idx, strict=True)):
        counts = np.bincount(tokens[j * n:(j + 1) * n].numpy(), minlength=V)
        want = expected(logits[i].numpy(), row, pen.counts[i].cpu().numpy(),
                        pen.in_prompt[i].cpu().numpy())
        assert np.all(counts[want == 0] == 0), f"row {i}: tokens outside its allowed set"
        tv = 0.5 * np.abs(counts / n - want).sum()
        assert tv < 0.02, f"row {i} {row}: total variation {tv:.3f} from its own distribution"
        ok, stat, bound = chi_square_ok(counts, want)
        assert ok, f"row {i} {row}: chi-square {stat:.1f} above {bound:.1f}"


# Rows no candidate buffer holds: a nucleus of thousands of tokens, k > 1024, min-p alone
LARGE_ROWS = [(1.0, 0, 0.9, 0.0, 1.0, 0.0, 0.0), (0.8, 1500, 1.0, 0.0, 1.0, 0.0, 0.0),
              (1.0, 0, 1.0, 0.02, 1.0, 0.0, 0.0), (0.6, 0, 1.0, 0.0, 1.0, 0.0, 0.0),
              (1.1, 1200, 0.95, 0.0, 1.0, 0.0, 0.0)]


@pytest.mark.parametrize("row", LARGE_ROWS)
@pytest.mark.parametrize("sampler", ["torch", pytest.param("fused", marks=pytest.mark.gpu)])
def test_large_nucleus_rows_follow_their_distribution(row, sampler):
    """A flat row (V = 4096, the 0.9 nucleus ~2800 tokens) against its textbook distribution:
    no token outside its kept set, and Pearson's chi-square over 40 groups of consecutive
    token ids of equal expected mass (20,000 draws, 2,000 at a time); ``fused``: the Triton
    kernels on a GPU."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(1, 4096, generator=g) * 0.7
    want = expected(logits[0].numpy(), row, np.zeros(4096), np.zeros(4096, dtype=bool))
    assert (want > 0).sum() > 1024
    dev = torch.device("cuda" if sampler == "fused" else "cpu")
    mode = SamplerMode(False, False, 0, fused=sampler == "fused")
    counts = np.zeros(4096, dtype=np.int64)
    for part in range(10):
        p = RowParams(params_for([row], 2000, counter0=2000 * part).block.to(dev))
        tokens, _ = sample(logits.to(dev).expand(2000, -1).contiguous(), p, mode)
        counts += np.bincount(tokens.cpu().numpy(), minlength=4096)
    assert np.all(counts[want == 0] == 0), "tokens outside the kept set"
    group = np.minimum((np.cumsum(want) - want / 2) * 40, 39).astype(int)  # (V,) group ids
    ok, stat, bound = chi_square_ok(np.bincount(group, counts, 40), np.bincount(group, want, 40))
    assert ok, f"{row}: chi-square {stat:.1f} above {bound:.1f}"


def test_reference_follows_the_rule_on_flat_and_tied_rows():
    """Thresholds and tokens of the reference on flat bf16 rows (ties at every boundary) are
    the rule's (``sampling_rule``, float64) up to the rounding of its float32 sums."""
    from sampling_rule import thresholds, token_ok

    from decodelab.engine.sampler import keep_threshold, penalised

    g = torch.Generator().manual_seed(13)
    logits = (torch.randn(len(LARGE_ROWS) * 8, 4096, generator=g) * 0.7).to(torch.bfloat16).float()
    rows = LARGE_ROWS * 8
    p = params_for(rows, 1)
    p.slot = torch.zeros(len(rows), dtype=torch.int64)
    mode = SamplerMode(False, False, 0)
    tokens, _ = sample(logits, p, mode)
    z = penalised(logits, p, mode, None)
    top = z.max(dim=-1).values
    e = torch.exp((z - top[:, None]) * p.inv_t()[:, None])
    tau = keep_threshold(z, top, e, p, mode)
    for i, row in enumerate(rows):
        allowed = thresholds(z[i].numpy(), float(p.inv_t()[i]), row[1], row[2], 3e-5)
        assert float(tau[i]) in allowed, (i, row)
        assert token_ok(z[i].numpy(), float(p.inv_t()[i]), float(tau[i]), row[3],
                        float(p.uniform[i]), int(tokens[i]), 3e-5), (i, row)


def test_greedy_rows_are_exact_argmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 1000, generator=g)
    params = params_for([ROWS[0]] * 64, 1)
    tokens, _ = sample(logits, params, SamplerMode(True, False, 0))
    assert torch.equal(tokens, logits.argmax(-1))
    mixed = params_for([ROWS[0], ROWS[2]] * 32, 1)
    tokens, _ = sample(logits, mixed, SamplerMode(False, False, 8))
    assert torch.equal(tokens[::2], logits[::2].argmax(-1))


def test_partial_selection_equals_full_sort():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(300, 5000, generator=g) * 3
    rows = [(1.0, 40, 0.9, 0.0, 1, 0, 0), (0.7, 7, 1.0, 0.05, 1, 0, 0), (0.0, 3, 1, 0, 1, 0, 0)]
    params = params_for(rows, 100)
    full, _ = sample(logits, params, SamplerMode(False, False, 0))
    part, _ = sample(logits, params, SamplerMode(False, False, 64))
    assert torch.equal(full, part)


def test_partial_selection_equals_full_sort_with_ties():
    """bf16-rounded logits tie often; the thresholds and the token-order draw ignore how
    either path orders tied tokens."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(200, 4000, generator=g) * 2).to(torch.bfloat16).float()
    logits[:, 10:74] = logits.max(dim=1, keepdim=True).values  # 64 exact ties at the top
    rows = [(1.0, 50, 0.95, 0.0, 1, 0, 0), (1.5, 100, 1.0, 0.0, 1, 0, 0)]
    params = params_for(rows, 100)
    full, _ = sample(logits, params, SamplerMode(False, False, 0))
    part, _ = sample(logits, params, SamplerMode(False, False, 128))
    assert torch.equal(full, part)


def test_a_row_does_not_depend_on_its_batch():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 3000, generator=g)
    rows = [(1.0, 0, 0.95, 0.0, 1, 0, 0), (0.6, 50, 1.0, 0.0, 1, 0, 0)] * 20
    params = params_for(rows, 1)
    together, _ = sample(logits, params, SamplerMode(False, False, 0))
    for i in (0, 7, 39):
        one = params_for([rows[i]], 1)
        one.uniform = params.uniform[i:i + 1]
        alone, _ = sample(logits[i:i + 1], one, SamplerMode(False, False, 0))
        assert alone.item() == together[i].item()


def test_non_finite_rows_are_flagged_alone():
    logits = torch.zeros(4, 10)
    logits[1, 3] = float("nan")
    logits[2, 0] = float("inf")
    _, bad = sample(logits, params_for([ROWS[1]] * 4, 1), SamplerMode(False, False, 0))
    assert bad.tolist() == [False, True, True, False]


def test_row_uniforms_are_a_pure_function_in_the_open_interval():
    seeds = np.array([0, 1, 2**62, 5, 5])
    counters = np.array([0, 0, 3, 1, 2])
    u = row_uniforms(seeds, counters)
    assert np.array_equal(u, row_uniforms(seeds, counters))
    assert np.all((u > 0) & (u < 1)) and len(set(u.tolist())) == 5
    many = row_uniforms(np.full(50_000, 42), np.arange(50_000))
    assert abs(many.mean() - 0.5) < 0.01 and np.histogram(many, 10)[0].min() > 4500


# Seeds the 32-bit key of old folded onto one key with 12345: 2**32 * hi + a low word each.
FOLDED = [12345, 7318106351, 8921142027, 12999727100, 19275448176]


def test_every_bit_of_a_seed_keys_its_stream():
    seeds = np.array([*FOLDED, 0, 2**32, 2**62, 2**63 - 1, 2**63 - 2])
    assert len(set(seed_keys(seeds).tolist())) == len(seeds)
    n = 16
    u = row_uniforms(np.repeat(seeds, n), np.tile(np.arange(n), len(seeds)))
    assert len({row.tobytes() for row in u.reshape(len(seeds), n)}) == len(seeds)


def test_seeds_below_2_32_keep_their_streams():
    """Keying the seed's high word left the stream of every seed below 2**32 as it was."""
    u = row_uniforms(np.array([0, 1, 12345, 2**32 - 1, 2**31]), np.array([0, 5, 7, 100, 3]))
    assert u.view(np.uint32).tolist() == [1062458008, 1059905082, 1060558420, 1058078014,
                                          1047222418]


def test_choose_mode():
    assert choose_mode([True, True], [0, 0], [False, False], 100).all_greedy
    assert choose_mode([False, True], [20, 0], [False, False], 1000).k_cand == 32
    assert choose_mode([False], [32], [False], 1000).k_cand == 64
    assert choose_mode([False, False], [20, 0], [False, False], 1000).k_cand == 0
    assert choose_mode([False], [2000], [True], 5000, max_partial=1024).k_cand == 0


def _edge_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """bf16-rounded logits (ties), plus a NaN row, a +inf row and an all -inf row."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16).float()
    logits[1, 5] = float("nan")
    logits[2, 7] = float("inf")
    logits[3] = float("-inf")
    return logits


SAMPLING_ROWS = [(1.0, 40, 0.9, 0.0, 1, 0, 0), (0.7, 7, 1.0, 0.05, 1, 0, 0),
                 (1.4, 100, 0.5, 0.0, 1, 0, 0), (0.3, 1, 1.0, 0.0, 1, 0, 0)]


def test_two_stage_chunked_selection_equals_full_sort():
    vocab = 256 * 64 * 2  # 512 chunks of 64
    logits = _edge_logits(64, vocab, 6)
    params = params_for(SAMPLING_ROWS, 16)
    mode = choose_mode([False] * 64, [40, 7, 100, 1] * 16, [False] * 64, vocab)
    assert mode.chunk == 64 and mode.k_cand == 128 and not mode.any_greedy
    full, bad_full = sample(logits, params, SamplerMode(False, False, 0))
    part, bad_part = sample(logits, params, mode)
    assert torch.equal(full, part) and torch.equal(bad_full, bad_part)
    assert bad_part[1:4].all() and not bad_part[4:].any()
    ok = ~bad_full
    assert torch.equal(top_values(logits, 128, 0)[ok], top_values(logits, 128, 64)[ok])


def test_no_greedy_rows_skips_the_max_pass_with_the_same_result():
    logits = _edge_logits(32, 3000, 7)
    params = params_for(SAMPLING_ROWS, 8)
    for k_cand in (0, 128):
        with_max = sample(logits, params, SamplerMode(False, False, k_cand, any_greedy=True))
        without = sample(logits, params, SamplerMode(False, False, k_cand, any_greedy=False))
        assert all(torch.equal(a, b) for a, b in zip(with_max, without, strict=True))


def test_choose_mode_flags():
    plain = dict(top_p=[1.0, 1.0], min_p=[0.0, 0.0])
    assert not choose_mode([False, True], [0, 50], [False] * 2, 1000, **plain).filters
    assert choose_mode([False, True], [0, 50], [False] * 2, 1000).filters  # not told: all run
    assert choose_mode([False, False], [0, 1000], [False] * 2, 1000, **plain).filters is False
    assert choose_mode([False, False], [0, 999], [False] * 2, 1000, **plain).filters
    assert choose_mode([False], [0], [False], 1000, top_p=[0.9], min_p=[0.0]).filters
    minp = choose_mode([False], [0], [False], 1000, top_p=[1.0], min_p=[0.05])
    assert minp.min_p and not minp.filters
    assert choose_mode([False, True], [20, 0], [False, False], 1000).any_greedy
    assert not choose_mode([False, False], [20, 3], [False, False], 1000).any_greedy
    assert choose_mode([False], [20], [False], 1000).chunk == 0  # small vocabulary: direct
    assert choose_mode([False], [100], [False], 128256).chunk == 64
    assert choose_mode([False], [0], [False], 128256).chunk == 0  # full sort


def _capture(fn):
    warm_up(fn)
    return capture(fn)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["partial", "chunked", "sort", "greedy", "mixed_greedy",
                                  "penalties", "fused", "fused_greedy", "fused_penalties"])
def test_cuda_graph_sampler_equals_eager_token_for_token(kind):
    """The whole sample step captured in a CUDA graph, its per-step inputs (logits, row
    parameters, uniforms) refilled in static buffers between replays, equals the eager step."""
    dev = torch.device("cuda")
    b, vocab = 32, 128256
    rows = SAMPLING_ROWS + ([ROWS[0]] if kind in ("mixed_greedy", "fused") else [])
    rows = [(0.0, *r[1:]) for r in rows] if kind.endswith("greedy") and kind != "mixed_greedy" \
        else rows
    if kind.endswith("penalties"):
        rows = [(r[0], r[1], r[2], r[3], 1.3, 0.2, 0.4) for r in rows]
    reps = -(-b // len(rows))
    mode = choose_mode([r[0] == 0 for r in rows] * reps, [int(r[1]) for r in rows] * reps,
                       [kind.endswith("penalties")] * (len(rows) * reps), vocab)
    mode = {"sort": SamplerMode(mode.all_greedy, False, 0, mode.any_greedy),
            "partial": SamplerMode(False, False, mode.k_cand, False, 0)}.get(kind, mode)
    if kind == "chunked":
        assert mode.chunk == 64
    if kind.startswith("fused"):
        mode = fused(mode)
    static_logits = torch.zeros(b, vocab, device=dev)
    host = params_for(rows, reps)
    host.slot = torch.arange(len(host.slot))  # one slot per row, as in the engine (the fused
    # kernel's rows write last_token[slot] concurrently: a shared slot would be a race)
    static = RowParams(host.block[:b].to(dev).clone())
    pen = PenaltyState.empty(b + 1, vocab, dev)
    pen.counts[:, :50] = 1
    pen.in_prompt[:, 50:90] = True
    last = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    out = torch.zeros(b, dtype=torch.int64, device=dev)
    graph = _capture(lambda: sample_step(static_logits, static, mode, pen, last, out))
    for step in range(3):
        static_logits.copy_(_edge_logits(b, vocab, 10 + step).to(dev))
        fresh = params_for(rows, reps, counter0=step)
        static.uniform.copy_(fresh.uniform[:b].to(dev))
        counts0, last0 = pen.counts.clone(), last.clone()
        graph.replay()
        got = (out.clone(), pen.counts.clone(), last.clone())
        pen.counts.copy_(counts0)
        last.copy_(last0)
        sample_step(static_logits, static, mode, pen, last, out)
        want = (out, pen.counts, last)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), step
        assert (out[1:4] == -1).all() and (out[4:] >= 0).all()
    if kind in ("partial", "chunked", "fused"):
        full, _ = sample(static_logits, static, replace(mode, k_cand=0, chunk=0, fused=False), pen)
        assert torch.equal(full.masked_fill(out < 0, -1), out)


def test_host_inverse_temperature_is_the_device_one_bit_for_bit():
    """RowSampling's 1 / T (the float32 quotient, computed once per request on the host) is
    the device's float32 reciprocal bit for bit; greedy rows hold 1."""
    t = np.array([0.0, 1e-3, 0.1, 0.3, 0.7, 1.0, 1.3, 3.7, 99.9, 1e-7], dtype=np.float32)
    host = torch.tensor([RowSampling.of(SamplingParams(temperature=float(x))).inv_temperature
                         for x in t], dtype=torch.float32)
    sampling = torch.from_numpy(t) >= np.float32(1e-5)
    want = torch.where(sampling, torch.from_numpy(t), 1.0).reciprocal_()
    assert torch.equal(host, want) and want[sampling].gt(1).any()
