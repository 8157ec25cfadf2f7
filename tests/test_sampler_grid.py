"""The sampler grid bench on the CPU: the torch samplers at tiny sizes (its smoke path), the
table it writes, its config's checks, the plain-sort baseline's kept set, and the FlashInfer
rows through a stand-in module (FlashInfer itself is GPU only)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from decodelab.core.results import load_table
from decodelab.core.timing import TimingConfig
from decodelab.core.validate import ConfigError
from decodelab.engine.bench import sampler_grid as grid
from decodelab.engine.bench import sampler_kernels

CPU = torch.device("cpu")
TINY = grid.GridConfig((1, 5), (700,), (*grid.KINDS, "mix"), ("torch", "torch_sort"),
                       timing=TimingConfig(0, 1, 1))


def test_the_smoke_grid_times_every_kind_and_keeps_the_rule():
    rows = grid.grid_rows(TINY, CPU)
    assert {(r.sampler, r.kind, r.batch) for r in rows} == {
        (s, k, b) for s in TINY.samplers for k in TINY.kinds for b in TINY.batches}
    for r in rows:
        assert r.device_us > 0 and r.floor_us > 0 and r.x_floor == pytest.approx(
            r.device_us / r.floor_us)
        assert r.in_kept_set == 1.0, r
        assert (r.agrees_with_torch == 1.0) if r.sampler == "torch" else r.agrees_with_torch != \
            r.agrees_with_torch
        assert r.row_passes == -1 and r.logits_dtype == "bfloat16"


def test_the_grid_writes_its_table_with_metadata(tmp_path):
    cfg = grid.GridConfig((2,), (256,), ("mix", "p0.9"), ("torch",), timing=TimingConfig(0, 1, 1))
    (path,) = grid.write_grid(CPU, tmp_path, "cpu", cfg)
    table = load_table("sampler_grid", local=tmp_path, origins=["local"])
    assert path.name == "sampler_grid.csv" and len(table) == 2
    assert {"floor_us", "copy_gb_s", "call", "matches", "device"} <= set(table.columns)


@pytest.mark.parametrize("change, field", [
    (dict(batches=()), "batches"), (dict(batches=(0,)), "batches"), (dict(vocabs=(8,)), "vocabs"),
    (dict(kinds=("top_q",)), "kinds"), (dict(samplers=("vllm",)), "samplers")])
def test_a_bad_grid_is_refused_naming_its_field(change, field):
    base = dict(batches=(1,), vocabs=(256,), kinds=("mix",), samplers=("torch",))
    with pytest.raises(ConfigError, match=f"GridConfig.{field}="):
        grid.GridConfig(**(base | change))


def test_the_mix_takes_the_eight_kinds_in_turn():
    settings = grid.kind_settings("mix", 10)
    assert settings[:8] == [grid.KINDS[k] for k in grid.MIX] and settings[8:] == settings[:2]
    assert grid.kind_settings("k20", 3) == [grid.KINDS["k20"]] * 3


def test_the_plain_sort_keeps_a_sorted_prefix_inside_the_rule():
    """Its top-k and top-p keep a prefix of the sorted row (no tie groups): a subset of the
    rule's kept set, the top-k of exactly k tokens."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 500, generator=g) * 2).to(torch.bfloat16)
    settings = grid.kind_settings("mix", 64)
    p = grid.grid_params(settings, CPU)
    mode = grid.choose_mode([t == 0 for t, *_ in settings], [k for _, k, _, _ in settings],
                            [False] * 64, 500)
    tokens = grid.sort_sample(logits, p)
    kept = grid._kept(logits, p, mode)
    assert kept.gather(1, tokens[:, None]).all()


def _stand_in_flashinfer() -> types.ModuleType:
    """flashinfer.sampling's four calls, as torch code with its signatures (CPU)."""
    def draw(probs, seed=None, offset=None, deterministic=True):
        return probs.argmax(dim=-1).to(torch.int32)

    mod = types.ModuleType("flashinfer.sampling")
    mod.sampling_from_logits = lambda logits, **kw: draw(torch.softmax(logits, -1), **kw)
    mod.top_p_sampling_from_probs = lambda probs, top_p, **kw: draw(probs, **kw)
    mod.min_p_sampling_from_probs = lambda probs, min_p, **kw: draw(probs, **kw)
    mod.top_k_top_p_sampling_from_logits = lambda logits, top_k, top_p, **kw: draw(logits, **kw)
    return mod


def test_flashinfer_rows_name_the_call_and_the_filters_it_matches(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", _stand_in_flashinfer())
    kinds = ("greedy", "plain", "p0.9", "minp0.1", "k20", "k100_p0.95_minp0.05", "mix")
    cfg = grid.GridConfig((3,), (300,), kinds, ("flashinfer",), timing=TimingConfig(0, 1, 1))
    rows = {r.kind: r for r in grid.grid_rows(cfg, CPU)}
    assert "greedy" not in rows  # no FlashInfer call samples greedy rows alone
    assert rows["plain"].call == "sampling_from_logits" and rows["p0.9"].matches.endswith("top-p")
    assert rows["minp0.1"].call == "min_p_sampling_from_probs"
    assert rows["k20"].call == rows["mix"].call == "top_k_top_p_sampling_from_logits"
    assert rows["k100_p0.95_minp0.05"].matches.endswith("(not min-p)")
    assert all(r.row_passes == -1 and r.agrees_with_torch != r.agrees_with_torch
               for r in rows.values())


def test_without_flashinfer_its_rows_are_left_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", None)  # import fails
    cfg = grid.GridConfig((2,), (256,), ("k20",), ("torch", "flashinfer"),
                          timing=TimingConfig(0, 1, 1))
    assert [r.sampler for r in grid.grid_rows(cfg, CPU)] == ["torch"]


def test_a_grid_case_is_the_same_logits_and_mode_each_time():
    a, settings, p, mode = grid.grid_case("mix", 9, 500, 2.0, CPU)
    b, *_ = grid.grid_case("mix", 9, 500, 2.0, CPU)
    assert a.dtype == torch.bfloat16 and a.shape == (9, 500) and torch.equal(a, b)
    assert settings == grid.kind_settings("mix", 9) and len(p.block) == 9
    assert mode.filters and mode.min_p and not mode.all_greedy


@pytest.mark.parametrize("change, field", [(dict(batches=()), "batches"),
                                           (dict(kinds=("k7",)), "kinds"),
                                           (dict(vocab=10), "vocab"), (dict(calls=0), "calls")])
def test_a_bad_kernel_split_config_is_refused_naming_its_field(change, field):
    with pytest.raises(ConfigError, match=f"KernelsConfig.{field}="):
        sampler_kernels.KernelsConfig(**change)


def test_the_kernel_split_averages_per_call_and_sorts_by_time():
    event = types.SimpleNamespace
    averages = [event(key="stats_kernel", count=40, device_time_total=200.0),
                event(key="pick_kernel", count=40, device_time_total=600.0),
                event(key="cudaLaunchKernel", count=40, device_time_total=0.0)]
    rows = sampler_kernels.split_rows("k20", 32, 128256, averages, calls=20)
    assert [(r.kernel, r.calls, r.device_us) for r in rows] == [
        ("pick_kernel", 2.0, 30.0), ("stats_kernel", 2.0, 10.0)]
    assert [r.share for r in rows] == [0.75, 0.25] and {r.call_us for r in rows} == {40.0}


@pytest.mark.gpu
def test_the_kernel_split_names_the_fused_samplers_kernels_on_the_gpu():
    cfg = sampler_kernels.KernelsConfig(batches=(4,), vocab=32000, kinds=("k20", "plain"),
                                        calls=2)
    rows = sampler_kernels.kernel_rows(cfg)
    names = {(r.kind, r.kernel) for r in rows}
    assert {("k20", "histogram_kernel"), ("k20", "solve_kernel"), ("plain", "pick_kernel")} <= names
    assert ("plain", "histogram_kernel") not in names  # a plain batch leaves the filters out
    assert all(r.device_us > 0 and 0 < r.share <= 1 for r in rows)
