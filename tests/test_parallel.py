"""Tensor parallelism on CPU: shard math, and TP=2 over gloo (two processes) against TP=1."""

from __future__ import annotations

import pytest
import torch
import tp_workers

from decodelab.core.validate import ConfigError
from decodelab.model.compare import rel_err
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama, greedy_generate
from decodelab.model.weights import random_weights
from decodelab.parallel.check import TP_FP32_RTOL, run_on_ranks
from decodelab.parallel.shard import check_tp, local_config, shard_weights


def test_tp_must_divide_every_split():
    config = named_config("tiny")  # 8 heads, 2 KV heads, f 256, vocab 512
    check_tp(config, 2)
    with pytest.raises(ConfigError, match=r"tp=4: must divide tiny.num_kv_heads=2"):
        check_tp(config, 4)
    with pytest.raises(ConfigError, match=r"tp=0"):
        check_tp(config, 0)


def test_shards_partition_the_full_weights():
    config = named_config("tiny", attention_bias=True, tie_word_embeddings=False)
    full = random_weights(config, seed=2)
    shards = [shard_weights(config, full, r, 2) for r in range(2)]
    local = local_config(config, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (4, 1, 128)
    assert local.vocab_size == config.vocab_size  # token ids stay global
    assert torch.equal(torch.cat([s.embed for s in shards]), full.embed)
    assert torch.equal(torch.cat([s.lm_head for s in shards]), full.lm_head)
    lw, parts = full.layers[1], [s.layers[1] for s in shards]
    q, kv = config.q_size, config.kv_size
    for name, lo, hi in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
        n = (hi - lo) // 2
        off = {"q": 0, "k": q // 2, "v": q // 2 + kv // 2}[name]
        got = torch.cat([p.qkv[off:off + n] for p in parts])
        assert torch.equal(got, lw.qkv[lo:hi]), name
        assert torch.equal(torch.cat([p.qkv_bias[off:off + n] for p in parts]), lw.qkv_bias[lo:hi])
    assert torch.equal(torch.cat([p.o for p in parts], dim=1), lw.o)
    assert torch.equal(torch.cat([p.down for p in parts], dim=1), lw.down)
    f = config.intermediate_size // 2
    assert torch.equal(torch.cat([p.gate_up[:f] for p in parts]), lw.gate_up[:256])
    assert torch.equal(torch.cat([p.gate_up[f:] for p in parts]), lw.gate_up[256:])


def test_tied_head_stays_tied_in_each_shard():
    config = named_config("tiny")
    shard = shard_weights(config, random_weights(config, seed=0), 1, 2)
    assert shard.lm_head is shard.embed


def _tp1(overrides: dict):
    config = named_config("tiny", **overrides)
    model = PagedLlama(config, random_weights(config, seed=1), PagedKVCache(config, 64, 4),
                       backend="torch")
    return greedy_generate(model, tp_workers.PROMPTS, tp_workers.NEW_TOKENS)


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False},
                                       {"attention_bias": True}],
                         ids=["tied", "untied", "qkv-bias"])
def test_tp2_over_gloo_equals_tp1(overrides):
    ref_tokens, ref_logits = _tp1(overrides)
    tokens, logits, freed = run_on_ranks(tp_workers.tiny_greedy, 2, overrides)
    assert freed
    assert tokens == ref_tokens
    assert len({t for row in tokens for t in row}) > 4  # not one token repeated
    assert rel_err(logits, ref_logits) < TP_FP32_RTOL


def test_step_without_collectives_is_really_different():
    """The measuring twin that skips communication computes something else (so the bench's
    no-comm step really leaves the collectives out), with the same output shapes."""
    ref_tokens, ref_logits = _tp1({})
    forced = [row + [0] for row in ref_tokens]
    _, logits, _ = run_on_ranks(tp_workers.tiny_greedy, 2, {}, forced, True)
    assert logits.shape == ref_logits.shape
    assert rel_err(logits, ref_logits) > 0.1


def test_divergence_allowed_only_at_a_near_tie():
    from decodelab.parallel.check import unexplained_divergences

    logits = torch.zeros(1, 3, 4)
    logits[0, :, 1] = 10.0
    logits[0, 1, 2] = 9.9  # step 1: token 2 is within 2 * 0.01 * 10 of token 1
    ref = ([[1, 1, 1]], logits)
    assert unexplained_divergences(ref, ([[1, 1, 1]], logits), 0.01) == []
    assert unexplained_divergences(ref, ([[1, 2, 3]], logits), 0.01) == []
    problems = unexplained_divergences(ref, ([[3, 1, 1]], logits), 0.01)
    assert len(problems) == 1 and "row 0 step 0: token 3 instead of 1" in problems[0]


def test_bench_refuses_a_tp_size_the_model_cannot_split(tmp_path):
    from decodelab.parallel.bench import run
    from decodelab.parallel.config import TPBenchConfig
    from decodelab.parallel.group import TPGroup

    cfg = TPBenchConfig.for_profile("smoke")
    with pytest.raises(ConfigError, match=r"tp=3: must divide tiny.num_kv_heads=2"):
        run(cfg, TPGroup(0, 3, torch.device("cpu")), tmp_path)
    assert not list(tmp_path.iterdir())


def test_bench_tp_under_torchrun_on_cpu(tmp_path):
    """The real command line: two gloo ranks started by torchrun; rank 0 writes both tables,
    TP=2 validated against TP=1 before timing."""
    import os
    import subprocess
    import sys

    import pandas as pd

    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone", "-m", "decodelab", "bench", "tp", "--profile", "smoke",
         "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tp = pd.read_csv(tmp_path / "tp.csv")
    assert set(tp["tp"]) == {1, 2} and set(tp["mode"]) == {"eager"}
    two = tp[tp["tp"] == 2]
    assert (two["max_rel_err_vs_tp1"] < 1e-5).all() and two["tokens_equal_tp1"].all()
    assert (two["all_reduces_per_step"] == 2 * 3 + 1).all()  # tiny: 3 layers
    assert (tp["ms_per_step"] > 0).all()
    coll = pd.read_csv(tmp_path / "tp_collectives.csv")
    assert (coll["ranks"] == 2).all() and (coll["busbw_gb_s"] > 0).all()


def test_profile_step_counts_each_op_per_step():
    from decodelab.parallel.group import TPGroup
    from decodelab.parallel.profile import gather_rows, profile_step

    group = TPGroup(0, 1, torch.device("cpu"))
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    rows = gather_rows(group, profile_step(lambda: torch.mm(a, b), group, steps=4, warmup=2))
    mm = [r for r in rows if r.op == "aten::mm"]
    assert len(mm) == 1 and mm[0].calls_per_step == 1.0 and mm[0].host_us_per_step > 0
