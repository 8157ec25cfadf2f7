"""The batch-invariant switch on the CPU: where it is refused and why (it needs Triton on a
CUDA device; the CPU's torch path keeps the guarantee the README states for it). The kernels'
order of work is checked in Triton's interpreter (test_triton_interpreter), their compilation
for every target ahead of time (test_triton_aot), their bits on a GPU in
test_batch_invariant_gpu."""

from __future__ import annotations

import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.engine import Engine, EngineConfig
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def _tiny(**kw) -> PagedLlama:
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, 0), PagedKVCache(cfg, 32, 8), **kw)


def test_the_torch_path_is_refused_by_name():
    for kw in ({}, {"backend": "torch"}):
        with pytest.raises(ConfigError, match=r"batch_invariant=True: needs the Triton "
                           r"backend on a CUDA device \(backend 'torch', cache on cpu\)"):
            _tiny(batch_invariant=True, **kw)
    with pytest.raises(ConfigError, match="batch_invariant"):
        _tiny(batch_invariant="yes")
    assert _tiny().batch_invariant is False


def test_the_engine_refuses_a_model_whose_logits_depend_on_the_batch():
    with pytest.raises(ConfigError, match=r"EngineConfig.batch_invariant=True: the model's "
                                          r"logits depend on the batch"):
        Engine(_tiny(), EngineConfig(max_num_seqs=4, max_model_len=64, batch_invariant=True))
    with pytest.raises(ConfigError, match="batch_invariant"):
        EngineConfig(batch_invariant=1)
    Engine(_tiny(), EngineConfig(max_num_seqs=4, max_model_len=64))  # off by default


def test_the_invariance_bench_refuses_bad_sizes_by_name():
    from decodelab.engine.bench.invariance import InvarianceConfig

    with pytest.raises(ConfigError, match=r"InvarianceConfig.probe_context"):
        InvarianceConfig(probe_context=5000)
    with pytest.raises(ConfigError, match=r"InvarianceConfig.cost_contexts"):
        InvarianceConfig(cost_contexts=(512, 8192))
    with pytest.raises(ConfigError, match=r"InvarianceConfig.cost_prompts"):
        InvarianceConfig(cost_prompts=(0,))
    with pytest.raises(ConfigError, match=r"InvarianceConfig.batches"):
        InvarianceConfig(batches=())


def test_the_invariance_checks_run_end_to_end_on_a_cpu_stand_in():
    """The bench's own logic on the tiny model's torch ops (not invariant, so identity is not
    asserted here; the GPU test asserts it): the rows of every check, every request served
    alone and together with preemptions."""
    from decodelab.engine.bench import invariance
    from decodelab.model.llama import TorchOps

    class ClaimsInvariance(TorchOps):  # lets the engine take the CPU model
        batch_invariant = True

    cfg = invariance.InvarianceConfig(model="tiny", dtype="float32", block_size=8,
                                      batches=(1, 3), probe_context=40, max_context=96,
                                      engine_requests=3, engine_tokens=4, cost_contexts=(32,),
                                      cost_prompts=(32,))
    model = invariance.build_model(cfg, None, False, 3 * 12 + 16, device="cpu")
    rows = invariance.logit_checks(cfg, model)
    assert [(r.check, r.batch) for r in rows] == [("prefill_vs_decode", 1)] * 2 + [
        ("decode_alone_vs_batch", 1), ("decode_alone_vs_batch", 3)]
    assert rows[2].identical == 1  # the probe alone, twice: the same bits even here
    model = invariance.build_model(cfg, None, False, 20, device="cpu")
    model.ops = ClaimsInvariance
    rows = invariance.engine_checks(cfg, model)
    assert [(r.check, r.batch, r.compared) for r in rows] == [("engine_tokens", 3, 3)] * 2
    assert all("tokens" in r.detail and "preemptions" in r.detail for r in rows)


def test_the_tile_sweep_tries_every_tile_the_rule_picks_on_the_model_weights():
    """``batch_invariance_tiles`` covers the rule: its grid holds every tile
    ``invariant.matmul_tile`` picks at the sweep's rows, and times each there."""
    from decodelab.engine.bench import invariance_tiles as it
    from decodelab.model.config import named_config
    from decodelab.model.triton import invariant

    shapes = it.weight_shapes(named_config("llama-3.2-1b"))
    assert shapes == {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
                      "down": (2048, 8192), "lm_head": (128256, 2048)}
    cfg = it.TileSweepConfig()
    for n, k in shapes.values():
        tiles = it.candidates(n, k, cfg)
        picks = {rows: invariant.matmul_tile(rows, n, k) for rows in cfg.rows}
        assert set(picks.values()) <= set(tiles)
        assert all(it.timed_at(tile.block_m, rows) for rows, tile in picks.items())
        assert all(t.block_m * t.block_n <= it.MAX_TILE for t in tiles)
        assert n <= invariant.WIDE_N or min(t.block_n for t in tiles) >= 64
        assert all(any(it.timed_at(t.block_m, rows) for rows in cfg.rows) for t in tiles)
    assert it.timed_at(64, 32) and not it.timed_at(256, 64) and not it.timed_at(16, 4096)


def test_the_tile_sweep_leaves_out_a_tile_the_gpu_cannot_launch(monkeypatch, capsys):
    """A tile whose compiled pipeline needs more shared memory than the GPU has (Triton's
    OutOfResources at launch) is left out with a line saying so; the sweep goes on."""
    from triton.runtime.errors import OutOfResources

    from decodelab.engine.bench import invariance_tiles as it
    from decodelab.model.triton import invariant, skinny

    def exact(x, w):  # float64 products: every row the same bits alone or batched
        return (x.double() @ w.double().T).float()

    def tiled(x, w, launch, block_m):
        if launch[0] == 64:
            raise OutOfResources(300_000, 232_448, "shared memory")
        return exact(x, w)

    monkeypatch.setattr(invariant, "matmul", exact)
    monkeypatch.setattr(skinny, "tiled", tiled)
    cfg = it.TileSweepConfig(rows=(3, 70), block_m=(16, 64), block_n=(16, 64), block_k=(64,),
                             checked_rows=3)
    w = torch.randn((80, 96), generator=torch.Generator().manual_seed(0))
    rows = it.sweep_weight("w", w, cfg, lambda fn: 2.0)
    assert rows and all(r.same_bits and r.block_n != 64 for r in rows)
    assert {r.block_n for r in rows} >= {16}
    assert "left out (out of resource: shared memory" in capsys.readouterr().out
