"""``bench serve``: its workloads as defined (nano-vllm's draw, seeded arrivals), the floor
arithmetic against the model's real weights and by hand, the latency statistics, bad serving
parameters refused by name, and the smoke bench end to end (three tables, consistent with the
workloads they served)."""

from __future__ import annotations

import dataclasses
import math
import random
import re

import pandas as pd
import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.engine.bench import serve_config
from decodelab.engine.bench.serve_config import ServeBenchConfig, available_variants
from decodelab.engine.bench.serve_floor import (
    Ceilings,
    StepFloor,
    StepWork,
    layer_matmul_params,
    step_floor,
    weight_bytes,
)
from decodelab.engine.bench.serve_rows import (
    OfflineRow,
    OnlineRow,
    RunTrace,
    ServeStepRow,
    StepTrace,
)
from decodelab.engine.bench.serve_stats import first_rate_over, gaps, over_median, percentiles
from decodelab.engine.bench.serve_workload import (
    OfflineWorkload,
    OnlineSweep,
    poisson_arrivals,
    warmup_requests,
)
from decodelab.engine.metrics import RequestRecord
from decodelab.model.config import ModelConfig, named_config

NANO = OfflineWorkload("offline", num_requests=256, prompt_len=(100, 1024),
                       output_len=(100, 1024))


# ------------------------------------------------------------------ workloads
def test_offline_workload_is_nano_vllms_draw():
    """nano-vllm's bench.py, its two lines as written there, on its global generator."""
    from random import randint, seed

    state = random.getstate()
    try:
        seed(0)
        num_seqs, max_input_len, max_ouput_len = 256, 1024, 1024
        prompt_token_ids = [[randint(0, 10000) for _ in range(randint(100, max_input_len))]
                            for _ in range(num_seqs)]
        max_tokens = [randint(100, max_ouput_len) for _ in range(num_seqs)]
    finally:
        random.setstate(state)
    reqs = NANO.requests(128256)
    assert [list(r.prompt) for r in reqs] == prompt_token_ids
    assert [r.output_len for r in reqs] == max_tokens
    assert all(r.arrival_s == 0.0 for r in reqs) and NANO.temperature == 0.6
    assert ServeBenchConfig.for_profile("gpu").offline == NANO


def test_offline_workload_counts_ranges_seeds_and_small_vocabularies():
    wl = OfflineWorkload("w", num_requests=40, prompt_len=(3, 9), output_len=(5, 7), seed=4)
    reqs = wl.requests(512)
    assert len(reqs) == 40 and reqs == wl.requests(512)
    assert all(3 <= len(r.prompt) <= 9 and 5 <= r.output_len <= 7 for r in reqs)
    assert {len(r.prompt) for r in reqs} == set(range(3, 10))  # the whole range is drawn
    assert dataclasses.replace(wl, seed=5).requests(512) != reqs
    wide = wl.requests(128256)  # the same stream: lengths equal, ids wrapped to the vocabulary
    assert [len(r.prompt) for r in wide] == [len(r.prompt) for r in reqs]
    assert all(t == w % 512 for r, rw in zip(reqs, wide, strict=True)
               for t, w in zip(r.prompt, rw.prompt, strict=True))
    assert max(t for r in reqs for t in r.prompt) < 512 < max(t for r in wide for t in r.prompt)


def test_poisson_arrivals_are_seeded_scaled_and_of_the_rate():
    a1, a4 = poisson_arrivals(20000, 1.0, 7), poisson_arrivals(20000, 4.0, 7)
    assert a1[0] == 0.0 and all(b > a for a, b in zip(a1, a1[1:], strict=False))
    assert a1 == poisson_arrivals(20000, 1.0, 7) and a1 != poisson_arrivals(20000, 1.0, 8)
    assert all(math.isclose(x / 4, y, rel_tol=1e-12) for x, y in zip(a1, a4, strict=True))
    assert a4[-1] / (len(a4) - 1) == pytest.approx(0.25, rel=0.03)  # mean gap 1 / rate


def test_online_sweep_caps_by_count_and_time():
    base = NANO.requests(128256)
    sweep = OnlineSweep(rate_fractions=(1.0,), max_requests=100, max_arrival_s=5.0, seed=3)
    fast = sweep.requests(base, 1000.0)
    assert len(fast) == 100 and [r.prompt for r in fast] == [r.prompt for r in base[:100]]
    slow = sweep.requests(base, 2.0)
    assert 1 <= len(slow) < 100 and all(r.arrival_s < 5.0 for r in slow)
    assert slow[0].arrival_s == 0.0


def test_warmup_passes_every_batch_size():
    reqs = warmup_requests(8, 4, 512, longest=30)
    outs = [r.output_len for r in reqs[:8]]
    assert outs == [2, 2, 3, 3, 4, 4, 5, 5] and len(reqs[-1].prompt) == 30
    assert {len(r.prompt) for r in warmup_requests(40, 4, 512)} == set(range(4, 21))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: poisson_arrivals(5, 0.0, 0), r"poisson_arrivals.rate=0.0: must be a number in \(0.0, inf\)"),
    (lambda: poisson_arrivals(5, -2.0, 0), r"rate=-2.0: must be a number in \(0.0, inf\)"),
    (lambda: poisson_arrivals(0, 1.0, 0), r"poisson_arrivals.n=0: must be an integer >= 1"),
    (lambda: OfflineWorkload("w", 0, (1, 2), (1, 2)),
     r"OfflineWorkload\['w'\].num_requests=0: must be an integer in \[1, 100000\]"),
    (lambda: OfflineWorkload("w", 4, (9, 2), (1, 2)),
     r"prompt_len=\(9, 2\): must satisfy 1 <= low <= high"),
    (lambda: OfflineWorkload("w", 4, (0, 2), (1, 2)), r"prompt_len=\(0, 2\)"),
    (lambda: OfflineWorkload("w", 4, (1, 2), 7), r"output_len=7: must be a pair"),
    (lambda: OnlineSweep((), 4, 1.0), r"rate_fractions=\(\): must be a non-empty tuple"),
    (lambda: OnlineSweep((0.5, 0.0), 4, 1.0),
     r"rate_fractions\[\]=0.0: must be a number in \(0.0, 100.0\]"),
    (lambda: OnlineSweep((0.5,), 0, 1.0), r"max_requests=0: must be an integer in \[1, 100000\]"),
    (lambda: OnlineSweep((0.5,), 4, 0.0), r"max_arrival_s=0.0: must be a number in \(0.0, 3600.0\]"),
    (lambda: warmup_requests(0, 4, 512), r"warmup_requests.n=0: must be an integer >= 1"),
    (lambda: dataclasses.replace(ServeBenchConfig.for_profile("smoke"), variants=("nope",)),
     r"ServeBenchConfig.variants\[\]='nope': must be one of 'engine'"),
    (lambda: dataclasses.replace(ServeBenchConfig.for_profile("smoke"), max_num_seqs=0),
     r"ServeBenchConfig.max_num_seqs=0: must be an integer in \[1, 4096\]"),
    (lambda: dataclasses.replace(ServeBenchConfig.for_profile("cpu"), offline=OfflineWorkload(
        "offline", 4, (100, 1024), (100, 1024))),
     r"contexts of 2056 tokens; model 'tiny' has positions for 1024"),
    (lambda: Ceilings(0.0, 1.0, "copy"), r"Ceilings.gb_s=0.0: must be a number in \(0.0"),
    (lambda: dataclasses.replace(ServeBenchConfig.for_profile("smoke"), token_budget=3),
     r"ServeBenchConfig.token_budget=3: must be an integer >= 4"),
    (lambda: dataclasses.replace(ServeBenchConfig.for_profile("smoke"), small_budget=64),
     r"ServeBenchConfig.small_budget=64: must be an integer in \[4, 32\]"),
])
def test_bad_serving_parameters_are_refused_by_name(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_the_small_budget_variant_gets_the_small_budget(smoke):
    from decodelab.engine.bench.serve_config import engine_config

    small = engine_config("chunked_small", 4096, 512, max_num_seqs=256)
    assert small.max_num_batched_tokens == 512 and small.chunked_prefill
    assert engine_config("chunked", 4096, 512, max_num_seqs=256).max_num_batched_tokens == 4096
    assert small.steady_prefill_tokens is None  # a fixed budget: vLLM's policy
    paced = engine_config("paced", 4096, 512, max_num_seqs=256)
    assert (paced.max_num_batched_tokens, paced.steady_prefill_tokens) == (4096, 512)
    assert engine_config("chunked", 4096, 512, max_num_seqs=256).steady_prefill_tokens is None
    budgets = smoke["serve_online"].groupby("variant")["token_budget"].unique()
    cfg = ServeBenchConfig.for_profile("smoke")
    assert list(budgets["chunked_small"]) == [cfg.small_budget]
    assert list(budgets["chunked"]) == [cfg.token_budget]


def test_profiles_do_not_depend_on_the_machine(monkeypatch):
    seen = {}
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        for profile in ("smoke", "cpu", "gpu"):
            seen.setdefault(profile, set()).add(repr(ServeBenchConfig.for_profile(profile)))
    assert all(len(v) == 1 for v in seen.values())
    gpu = ServeBenchConfig.for_profile("gpu")
    assert gpu.model == "llama-3.2-1b" and gpu.dtype == "bfloat16" and gpu.max_num_seqs == 256
    assert gpu.long_prompts.prompt_len == (2048, 8192) and gpu.long_prompts.output_len == (128, 512)
    # the batch-invariant variant needs Triton on CUDA: served by the GPU profile only
    assert "invariant" in gpu.variants
    assert all("invariant" not in ServeBenchConfig.for_profile(p).variants
               for p in ("smoke", "cpu"))


def test_a_variant_is_offered_only_where_engine_config_has_its_fields(monkeypatch):
    assert available_variants()[0] == "engine"
    monkeypatch.setitem(serve_config.VARIANTS, "future", {"no_such_field": 1})
    assert "future" not in available_variants()
    with pytest.raises(ConfigError, match="variants\\[\\]='future'"):
        dataclasses.replace(ServeBenchConfig.for_profile("smoke"), variants=("future",))


# ------------------------------------------------------------------ the floor
@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_and_matmul_params_match_the_real_weights(tied):
    from decodelab.model.weights import random_weights

    cfg = named_config("tiny", tie_word_embeddings=tied)
    w = random_weights(cfg, 0)
    for tokens in (1, 7):
        assert weight_bytes(cfg, tokens, 4) == w.nbytes_per_step(tokens)
    assert layer_matmul_params(cfg) == sum(t.numel() for lw in w.layers
                                           for t in (lw.qkv, lw.o, lw.gate_up, lw.down))


SMALL = ModelConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=4, tie_word_embeddings=True)
# per layer: qkv 8 x (8 + 2 x 4) = 128, o 8 x 8 = 64, gate/up/down 3 x 8 x 16 = 384 -> 576
LAYERS = 2 * 576
PARAMS = 100 * 8 + 2 * (576 + 2 * 8) + 8  # embedding (the head), layers with norms, final norm
KV_TOKEN = 2 * 2 * 4 * 2  # K and V, 2 layers, 1 KV head of 4, 2 bytes


def test_a_decode_steps_floor_by_hand():
    work = StepWork.decode([10, 30])
    ceil = Ceilings(gb_s=1e-3, tflop_s=1e-6, bandwidth="copy")  # 1e6 B/s, 1e6 FLOP/s
    floor = step_floor(SMALL, 2, work, ceil)
    assert floor.weights_s == pytest.approx((PARAMS + 2 * 8) * 2 / 1e6)
    assert floor.linear_s == pytest.approx((2 * LAYERS * 2 + 2 * 100 * 8 * 2) / 1e6)
    assert floor.kv_s == pytest.approx(KV_TOKEN * 40 / 1e6)
    assert floor.attention_s == pytest.approx(4 * 2 * 2 * 4 * 40 / 1e6)
    assert floor.s == pytest.approx(max(floor.weights_s, floor.linear_s)
                                    + max(floor.kv_s, floor.attention_s))
    assert work.kind == "decode" and floor.bound == "flops"  # matmuls 7.8 ms, weights 4.0 ms


def test_a_prefill_chunks_pairs_and_kinds():
    whole = StepWork.chunks([5], [0])
    assert whole.prefill_pairs == 15 and whole.kv_tokens == 5
    split = StepWork.chunks([2], [0]) + StepWork.chunks([3], [2])  # the same prompt, two chunks
    assert split.prefill_pairs == whole.prefill_pairs and split.prefill_tokens == 5
    assert split.kv_tokens == 2 + (2 + 3)  # the second chunk reads the first one's K/V
    mixed = StepWork.decode([4]) + whole
    assert mixed.kind == "mixed" and mixed.tokens == 6 and mixed.logit_rows == 2
    assert StepWork().kind == "emit" and whole.kind == "prefill"
    assert step_floor(SMALL, 2, StepWork(), Ceilings(1.0, 1.0, "read")).s == 0.0
    assert StepFloor(0.0, 0.0, 0.0, 0.0).bound == "none"
    assert StepFloor(3.0, 1.0, 1.0, 0.5).bound == "bytes"


# ------------------------------------------------------------------ statistics and rows
def test_percentiles_gaps_and_the_saturation_rate():
    assert percentiles(range(1, 101)) == pytest.approx((50.5, 90.1, 99.01))
    assert percentiles([2.0, float("nan"), 4.0], (50,)) == (3.0,)
    assert all(math.isnan(v) for v in percentiles([float("nan")]))
    assert gaps([1.0, 1.5, 3.0]) == [0.5, 1.5] and gaps([2.0]) == []
    assert first_rate_over([4.0, 1.0, 2.0, 3.0], [5.0, 0.1, 0.9, 1.2], 1.0) == 3.0
    assert math.isnan(first_rate_over([1.0, 2.0], [0.1, 0.2], 1.0))
    medians, over = over_median(["decode"] * 3 + ["mixed"] * 2, [1.0, 1.0, 4.0, 5.0, 5.0])
    assert medians == {"decode": 1.0, "mixed": 5.0} and over == 1  # 4 > 3 x 1; 5 is the median
    assert over_median(["decode", "decode"], [1.0, 3.0])[1] == 0  # 3 is not over 3 x 2


def test_run_rows_from_a_trace():
    recs = (RequestRecord("a", "finished", "length", 10, 3, 0, 0.1, 0.02, 0.2),
            RequestRecord("b", "finished", "length", 20, 5, 1, 0.3, 0.04, 0.5))
    floor = StepFloor(0.1, 0.05, 0.05, 0.0)  # 0.15 s each
    steps = tuple(StepTrace(StepWork.decode([11, 21]), 2, 0.3, floor, gc_s=0.01 * (i == 2))
                  for i in range(4))
    trace = RunTrace(recs, ((0.0, 0.1, 0.3), (0.0, 0.5)), steps, duration_s=2.0, gc_pauses=3,
                     gc_s=0.012, gc_longest_s=0.01)
    row = OfflineRow.of("engine", "offline", trace, capture_s=1.0, graph_mem_mib=2.0,
                        prefill_buckets=11, warmup_s=3.0)
    assert row.prefill_buckets == 11
    assert (row.requests, row.finished, row.preemptions, row.output_tokens) == (2, 2, 1, 8)
    assert row.output_tok_s == 4.0 and row.total_tok_s == 19.0 and row.request_rate == 1.0
    assert row.ttft_p50_ms == pytest.approx(200.0) and row.itl_p50_ms == pytest.approx(200.0)
    assert row.busy_s == pytest.approx(1.2) and row.floor_s == pytest.approx(0.6)
    assert row.ratio_to_floor == pytest.approx(2.0) and row.steps == 4
    assert row.decode_step_ms == pytest.approx(300.0) and row.steps_over_3x == 0
    assert row.itl_p99_x_decode == pytest.approx(row.itl_p99_ms / 300.0)
    assert row.itl_p99_ms == pytest.approx(494.0)  # gaps 0.1, 0.2, 0.5 s
    online = OnlineRow.of("engine", "online", trace, rate_fraction=0.5, offered_rate=3.0,
                          arrival_span_s=1.5)
    assert online.run == "online@0.5x" and online.offered_rate == 3.0
    step = ServeStepRow.of("engine", "offline", 0, steps[0])
    assert (step.kind, step.decode_rows, step.context_tokens) == ("decode", 2, 32)
    assert step.wall_ms == pytest.approx(300.0) and step.floor_ms == pytest.approx(150.0)
    assert (row.gc_pauses, row.gc_ms, row.gc_longest_ms) == (3, pytest.approx(12.0),
                                                              pytest.approx(10.0))
    assert step.gc_ms == 0.0 and ServeStepRow.of("engine", "offline", 2, steps[2]).gc_ms == 10.0


# ------------------------------------------------------------------ the smoke bench
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from decodelab.core.results import load_table
    from decodelab.engine.bench.serve import bench

    out = tmp_path_factory.mktemp("serve")
    paths = bench("smoke", out)
    assert [p.stem for p in paths] == ["serve_offline", "serve_online", "serve_steps"]
    empty = tmp_path_factory.mktemp("noref")
    return {p.stem: load_table(p.stem, reference=empty, local=out) for p in paths}


def test_smoke_tables_have_the_row_columns(smoke):
    for name, row in (("serve_offline", OfflineRow), ("serve_online", OnlineRow),
                      ("serve_steps", ServeStepRow)):
        cols = [f.name for f in dataclasses.fields(row)]
        assert list(smoke[name].columns) == ["origin", "device", "torch_version", *cols]


def test_smoke_runs_served_their_workloads(smoke):
    cfg = ServeBenchConfig.for_profile("smoke")
    offline, online = smoke["serve_offline"], smoke["serve_online"]
    assert list(dict.fromkeys(offline["variant"])) == list(cfg.variants)
    # every variant's sweep at fractions of the first variant's offline request rate
    base = offline.set_index(["variant", "run"]).loc[(cfg.variants[0], "offline"), "request_rate"]
    for variant, off in offline.groupby("variant"):
        off = off.set_index("run")
        assert list(off.index) == ["offline", "long_prompts"]
        for wl in (cfg.offline, cfg.long_prompts):
            reqs = wl.requests(named_config(cfg.model).vocab_size)
            row = off.loc[wl.name]
            assert row["requests"] == row["finished"] == len(reqs)
            assert row["output_tokens"] == sum(r.output_len for r in reqs)
            assert row["prompt_tokens"] == sum(len(r.prompt) for r in reqs)
        on = online[online["variant"] == variant]
        assert list(on["rate_fraction"]) == list(cfg.online.rate_fractions)
        assert on["offered_rate"].tolist() == pytest.approx(
            [base * f for f in cfg.online.rate_fractions])
        assert on["rate_ttft_p99_over_limit"].isna().all() or on[
            "rate_ttft_p99_over_limit"].nunique() == 1
    runs = pd.concat([offline, online], ignore_index=True)
    assert (runs["ratio_to_floor"] > 1.0).all() and (runs["floor_s"] > 0).all()
    assert (runs["busy_s"] <= runs["duration_s"] + 1e-9).all()
    assert runs[["ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms"]].notna().all().all()


def test_a_short_prompts_only_variant_skips_the_long_prompts(monkeypatch, tmp_path):
    """The invariant variant's rule (serve_config.SHORT_PROMPTS_ONLY), tried on the smoke
    profile's chunked variant: its offline workload and online sweep run, its long prompts do
    not; the other variant serves both."""
    from decodelab.core.results import load_table
    from decodelab.engine.bench import serve

    monkeypatch.setattr(serve, "SHORT_PROMPTS_ONLY", ("chunked",))
    serve.bench("smoke", tmp_path)
    offline = load_table("serve_offline", reference=tmp_path / "none", local=tmp_path)
    runs = offline.groupby("variant", sort=False)["run"].apply(list).to_dict()
    assert runs == {"engine": ["offline", "long_prompts"], "chunked": ["offline"],
                    "chunked_small": ["offline", "long_prompts"],
                    "paced": ["offline", "long_prompts"]}
    online = load_table("serve_online", reference=tmp_path / "none", local=tmp_path)
    assert set(online["variant"]) == {"engine", "chunked", "chunked_small", "paced"}


def test_a_stopped_run_keeps_the_tables_of_the_variants_it_finished(monkeypatch, tmp_path):
    """The tables are written after every variant: a later variant's failure leaves the first
    variant's rows on disk, in every table."""
    from decodelab.core.results import load_table
    from decodelab.engine.bench import serve

    real = serve._serve_variant

    def stops_at_chunked(variant, *args, **kwargs):
        if variant == "chunked":
            raise RuntimeError("stopped at chunked")
        return real(variant, *args, **kwargs)

    monkeypatch.setattr(serve, "_serve_variant", stops_at_chunked)
    with pytest.raises(RuntimeError, match="stopped at chunked"):
        serve.bench("smoke", tmp_path)
    for name in ("serve_offline", "serve_online", "serve_steps"):
        table = load_table(name, reference=tmp_path / "none", local=tmp_path)
        assert set(table["variant"]) == {"engine"}, name


def test_the_invariant_model_shares_the_first_models_weights_and_kv_pool(monkeypatch):
    """The second model is built on the first one's weights and KV pool (one pool, sized once),
    as the batch-invariant one; the CPU cannot run invariant kernels, so the flag is recorded."""
    from decodelab.engine.bench import serve

    flags: list[bool] = []
    real = serve.PagedLlama

    def recording(config, weights, cache, *, batch_invariant=False):
        flags.append(batch_invariant)
        return real(config, weights, cache)

    monkeypatch.setattr(serve, "PagedLlama", recording)
    cfg = ServeBenchConfig.for_profile("smoke")
    first, _ = serve._setup(cfg, torch.device("cpu"))
    second, _ = serve._setup(cfg, torch.device("cpu"), like=first)
    assert flags == [False, True]
    assert second.weights is first.weights and second.cache is first.cache


def test_smoke_steps_add_up_to_their_runs(smoke):
    """What the taps saw is what the workloads asked for: every prompt token prefilled once,
    every token after a request's first decoded once (no preemption at these sizes), each
    decode row attending its whole context."""
    steps = smoke["serve_steps"]
    runs = pd.concat([smoke["serve_offline"], smoke["serve_online"]]).set_index(["variant", "run"])
    assert set(zip(steps["variant"], steps["run"], strict=True)) == set(runs.index)
    assert set(steps["kind"]) <= {"decode", "prefill", "mixed", "emit"}
    for key, sel in steps.groupby(["variant", "run"]):
        r = runs.loc[key]
        assert r["preemptions"] == 0 and len(sel) == r["steps"]
        assert sel["prefill_tokens"].sum() == r["prompt_tokens"]
        assert sel["decode_rows"].sum() == r["output_tokens"] - r["requests"]
        rounding = len(sel) * 5e-5  # step rows hold ms to 4 decimals
        assert sel["wall_ms"].sum() == pytest.approx(r["busy_s"] * 1e3, abs=rounding)
        assert sel["floor_ms"].sum() == pytest.approx(r["floor_s"] * 1e3, abs=rounding)
        # the engine's split of each call: issuing it and waiting for the step before, parts
        # of the call, which is part of the step's wall
        assert (sel["issue_ms"] > 0).all() and (sel["wait_ms"] >= 0).all()
        assert (sel["issue_ms"] + sel["wait_ms"] <= sel["wall_ms"] + 1e-3).all()
        assert list(sel["step"]) == list(range(len(sel)))
    # a request's decode rows attend prompt + 1 .. prompt + output - 1 positions
    cfg = ServeBenchConfig.for_profile("smoke")
    reqs = cfg.offline.requests(named_config(cfg.model).vocab_size)
    want = sum((r.output_len - 1) * len(r.prompt) + (r.output_len - 1) * r.output_len // 2
               for r in reqs)
    offline = steps[steps["run"] == "offline"]
    assert (offline.groupby("variant")["context_tokens"].sum() == want).all()


def test_smoke_chunked_variant_keeps_every_step_in_its_budget(smoke):
    """Whole prompts: the first admission of a step runs past the budget (long prompts > 32
    tokens); chunked: no step computes more than the budget."""
    if "chunked" not in available_variants():
        pytest.skip("EngineConfig has no chunked_prefill yet")
    budget = ServeBenchConfig.for_profile("smoke").token_budget
    steps = smoke["serve_steps"]
    tokens = steps["decode_rows"] + steps["prefill_tokens"]
    assert (tokens[steps["variant"] == "chunked"] <= budget).all()
    assert (tokens[(steps["variant"] == "engine") & (steps["run"] == "long_prompts")]
            > budget).any()
    long = steps[(steps["variant"] == "chunked") & (steps["run"] == "long_prompts")]
    assert (long["prefill_rows"] > 0).sum() > 2  # 2 prompts of 64-128 tokens, in chunks


@pytest.mark.gpu
def test_serve_on_the_gpu_with_graphs(tmp_path):
    """A small sweep on the GPU: decode graphs, the KV cache sized from free memory."""
    from decodelab.core.results import load_table
    from decodelab.engine.bench import serve

    cfg = ServeBenchConfig(
        profile="gpu", model="llama-3.2-1b", dtype="bfloat16", max_num_seqs=8,
        offline=OfflineWorkload("offline", 12, (100, 300), (20, 60)),
        long_prompts=OfflineWorkload("long_prompts", 3, (2048, 4096), (8, 16), seed=1),
        online=OnlineSweep((0.5, 2.0), max_requests=12, max_arrival_s=5.0),
        warmup_prompt=16, graph_batches=(8,))
    paths = serve._bench(cfg, torch.device("cuda"), tmp_path)
    off = load_table("serve_offline", reference=tmp_path / "none", local=tmp_path)
    assert len(paths) == 3 and (off["capture_s"] > 0).all() and (off["kv_blocks"] > 1000).all()
    assert (off["ratio_to_floor"] > 1.0).all() and (off["finished"] == off["requests"]).all()


def test_serving_figures_and_summary_render(smoke):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from decodelab.engine.notebook import serve_summary
    from decodelab.plots import serving

    for fig in (serving.offline_vs_floor(smoke["serve_offline"]),
                serving.online_latency(smoke["serve_online"]),
                serving.step_walls(smoke["serve_steps"])):
        assert fig.axes
        plt.close(fig)
    text = serve_summary(smoke)
    assert "this machine" in text and "its floor" in text and "`offline`" in text
    assert "TTFT p99" in text
    assert "Offline, median wall time / host issuing per step: " in text and " ms." in text
    steps = smoke["serve_steps"]
    timed = {**smoke, "serve_steps": steps.assign(device_ms=steps["wall_ms"] / 2)}
    assert "Offline, median device time / host issuing" in serve_summary(timed)  # on a GPU
    assert "No Triton kernel compiled during its" in text  # the watch ran: Triton is installed
    assert "their kind's median wall time per floor unit in their run: " in text
    stalled = steps.copy()
    decode = stalled[(stalled["kind"] == "decode") & (stalled["floor_ms"] > 0)]
    fastest = (decode["wall_ms"] / decode["floor_ms"]).idxmin()  # not slow before the stall
    stalled.loc[fastest, "wall_ms"] = 1e3 * stalled["wall_ms"].max()  # a 1,000x stall
    slow = [int(n) for n in re.findall(r"in their run: (\d+) of ", text)]
    slow_stalled = [int(n) for n in re.findall(r"in their run: (\d+) of ", serve_summary(
        {**smoke, "serve_steps": stalled}))]
    assert sum(slow_stalled) == sum(slow) + 1
    compiled = {**smoke, "serve_offline": smoke["serve_offline"].assign(jit_compiles=2)}
    assert "kernel specialisations during its measured runs: cold shapes" in serve_summary(
        compiled)
    older = {**smoke, "serve_steps": smoke["serve_steps"].drop(columns=["issue_ms"])}
    assert "host issuing" not in serve_summary(older)  # a table from before the column
    assert "At half the offline request rate, inter-token latency p99 " in text
    older_online = smoke["serve_online"].drop(columns=["itl_p99_x_decode"])
    assert "inter-token" not in serve_summary({**smoke, "serve_online": older_online})
    assert text.count(" Prefill: eager.") == len(set(smoke["serve_offline"]["variant"]))
    off = smoke["serve_offline"]
    for buckets, says in ((11, "Prefill: CUDA graphs of 11 token buckets"),
                          (float("nan"), "Prefill: eager (measured before prefill graphs)")):
        assert says in serve_summary({**smoke, "serve_offline": off.assign(
            prefill_buckets=buckets)})
    assert "No serving results" in serve_summary({})
