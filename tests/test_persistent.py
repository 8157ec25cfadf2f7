"""Phase 3: configs, the no-GPU path, the latency model, reference stop handling, and (GPU) every
persistent variant against the eager torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.persistent import analysis as persistent_analysis
from decodelab.persistent import bench as persistent_bench
from decodelab.persistent import kernel as persistent
from decodelab.persistent.bench import (
    barrier_for,
    latency_model_cycles,
    latency_model_us,
    launch_configs,
    sweep_plan,
)
from decodelab.persistent.notebook import NotebookParams
from decodelab.toy import step as toy


def test_kernel_config_validation():
    assert persistent.KernelConfig().variant == "auto"
    with pytest.raises(ConfigError, match="variant"):
        persistent.KernelConfig(variant="warp")
    with pytest.raises(ConfigError, match="threads"):
        persistent.KernelConfig("block", threads=100)
    with pytest.raises(ConfigError, match="group"):
        persistent.KernelConfig("block", group=2)
    with pytest.raises(ConfigError, match="16 blocks"):
        persistent.KernelConfig("cluster", group=32)
    with pytest.raises(ConfigError, match="group"):
        persistent.KernelConfig("block_v2", group=2)
    with pytest.raises(ConfigError, match="16 blocks"):
        persistent.KernelConfig("cluster_v2", group=32)


def test_variant_names_and_codes():
    # Codes as toyk::Variant: version 1 is 0..2, version 2 is 3..5 with the same state exchange.
    assert persistent.PROVEN == ("block", "grid", "cluster")
    assert [persistent.VARIANT_CODES[v] for v in persistent.VARIANTS] == list(range(6))
    for v in persistent.VARIANTS:
        code = persistent.VARIANT_CODES[v]
        assert persistent.kind_of(v) == persistent.PROVEN[code % 3]
    # The bench measures the proven versions in one pass and the second versions in another.
    for version, names in ((1, persistent.PROVEN), (2, persistent.VARIANTS[3:])):
        for sweep in ("hidden", "tune"):
            assert {k.variant for k in launch_configs(sweep, True, version)} <= set(names)


def test_shape_and_stop_validation():
    persistent.check_shape(toy.named("h256"))
    with pytest.raises(ConfigError, match="hidden"):
        persistent.check_shape(toy.ToyConfig(hidden=2048, layers=1, batch=1, vocab=16))
    with pytest.raises(ConfigError, match="hidden"):
        persistent.check_shape(toy.ToyConfig(hidden=30, layers=1, batch=1, vocab=16))
    with pytest.raises(ConfigError, match="float32"):
        persistent.check_shape(toy.ToyConfig(hidden=64, layers=1, batch=1, vocab=16,
                                             dtype="bfloat16"))
    with pytest.raises(ConfigError, match="stop"):
        persistent.check_stop(256, 256)
    persistent.check_stop(-1, 256)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_needs_a_cuda_gpu(tmp_path):
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg), toy.initial_state(cfg)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        persistent.run(w, x0, 10)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        persistent_bench.bench("gpu", tmp_path)


def test_notebook_params():
    NotebookParams(profile="smoke", interactive=False)
    with pytest.raises(ConfigError, match="profile"):
        NotebookParams(profile="huge", interactive=False)


def test_latency_model_math():
    # 5 barriers of 0.1 µs + 2e6 flop over 2 SMs at 256 flop/clk and 1 GHz = 0.5 + 3.90625 µs
    assert math.isclose(latency_model_us(5, 0.1, 2e6, 2, 1e9), 0.5 + 2e6 / (2 * 256 * 1e9) * 1e6)
    assert latency_model_us(0, 0.0, 0.0, 1, 1e9) == 0.0
    with pytest.raises(ValueError):
        latency_model_us(1, 0.1, 1.0, 0, 1e9)


def test_latency_model_in_cycles():
    # 5 barriers of 40 cycles + 2e6 flop over 2 SMs at 256 flop/clk
    assert math.isclose(latency_model_cycles(5, 40.0, 2e6, 2), 200 + 2e6 / 512)
    with pytest.raises(ValueError):
        latency_model_cycles(1, -1.0, 1.0, 1)


def test_barrier_lookup_nearest_size():
    rows = [{"barrier": "grid_sync", "threads": 256, "blocks": b, "us": b / 10} for b in (1, 8, 32)]
    rows.append({"barrier": "syncthreads", "threads": 512, "blocks": 1, "us": 0.02})
    assert barrier_for(rows, "grid", 256, 6) == 0.8
    assert barrier_for(rows, "block", 512, 1) == 0.02
    assert math.isnan(barrier_for(rows, "cluster", 256, 4))
    assert barrier_for(rows, "grid_v2", 256, 6) == 0.8  # a second version uses the same barrier
    assert math.isnan(barrier_for(rows, "block", 512, 1, "cycles"))  # column not measured


def test_sweep_plans_are_valid_shapes():
    for profile in ("smoke", "gpu"):
        for _, cfg in sweep_plan(profile).shapes:
            persistent.check_shape(cfg)


def test_reference_with_stop():
    tokens = torch.tensor([[1, 2], [3, 2], [3, 5], [4, 3]])
    ref = toy.Trajectory(tokens, torch.zeros(4, 2, 3))
    got, steps = persistent.reference_with_stop(ref, 3)
    assert steps.tolist() == [2, 4]
    assert got[:, 0].tolist() == [1, 3, -1, -1]
    assert got[:, 1].tolist() == [2, 2, 5, 3]
    same, all_steps = persistent.reference_with_stop(ref, -1)
    assert torch.equal(same, tokens) and all_steps.tolist() == [4, 4]


def _check_all(cfg: toy.ToyConfig, n_steps: int, kcfg: persistent.KernelConfig) -> None:
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    ref = toy.run_eager(w, x0, n_steps)
    check = persistent.validate(w, x0, ref, kcfg)
    assert check.ok, check.describe()
    stop = persistent.stop_token_for(ref)
    check = persistent.validate(w, x0, ref, kcfg, stop=stop)
    assert check.ok, check.describe()


GPU_SHAPES = [toy.named("ultra-light"), toy.named("h256"),
              toy.ToyConfig(hidden=32, layers=4, batch=3, vocab=256),
              toy.ToyConfig(hidden=128, layers=1, batch=2, vocab=512),
              toy.ToyConfig(hidden=64, layers=3, batch=1, vocab=1000, seed=3),
              toy.ToyConfig(hidden=512, layers=2, batch=1, vocab=256)]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", persistent.VARIANTS)
@pytest.mark.parametrize("cfg", GPU_SHAPES, ids=lambda c: f"h{c.hidden}l{c.layers}b{c.batch}v{c.vocab}")
def test_variant_matches_reference(variant: str, cfg: toy.ToyConfig):
    if persistent.kind_of(variant) == "cluster" and not persistent.cluster_available():
        pytest.skip("thread-block clusters need sm_90")
    kcfg = persistent.KernelConfig(variant, 512 if persistent.kind_of(variant) == "block" else 256)
    if not persistent.plan(cfg, kcfg)["ok"]:
        pytest.skip(persistent.plan(cfg, kcfg)["why"])
    _check_all(cfg, 1000, kcfg)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", persistent.VARIANTS[3:])
@pytest.mark.parametrize("cfg", [toy.named("h256"), toy.ToyConfig(hidden=128, layers=2, batch=2,
                                                                  vocab=512)],
                         ids=lambda c: f"h{c.hidden}l{c.layers}b{c.batch}v{c.vocab}")
@pytest.mark.parametrize("threads", [256, 512])
def test_v2_thread_counts(variant: str, cfg: toy.ToyConfig, threads: int):
    """The second versions' other work splits (K = 16 and 32 inputs per lane, the other thread
    count than the bench default)."""
    if persistent.kind_of(variant) == "cluster" and not persistent.cluster_available():
        pytest.skip("thread-block clusters need sm_90")
    kcfg = persistent.KernelConfig(variant, threads)
    if not persistent.plan(cfg, kcfg)["ok"]:
        pytest.skip(persistent.plan(cfg, kcfg)["why"])
    _check_all(cfg, 1000, kcfg)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", persistent.VARIANTS)
def test_run_clock(variant: str):
    """The in-kernel run clock: cycles and ns of the step loop, a plausible SM clock."""
    if persistent.kind_of(variant) == "cluster" and not persistent.cluster_available():
        pytest.skip("thread-block clusters need sm_90")
    cfg = toy.named("h256")
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    got = persistent.run(w, x0, 2000, kcfg=persistent.KernelConfig(variant, 256))
    cycles, ns = (int(v) for v in got.clock.cpu())
    assert cycles > 0 and ns > 0
    assert 0.05 < cycles / ns < 5.0  # GHz


@pytest.mark.gpu
def test_auto_takes_v2_only_after_validation(monkeypatch):
    # Start from a process that has validated nothing: earlier tests validate v2 launches.
    monkeypatch.setattr(persistent, "_VALIDATED", set())
    monkeypatch.setattr(persistent, "_FAILED", set())
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    assert persistent.resolve_variant(cfg, persistent.KernelConfig()) in persistent.PROVEN
    base = persistent.resolve_variant(cfg, persistent.KernelConfig())
    ref = toy.run_eager(w, x0, 200)
    check = persistent.validate(w, x0, ref, persistent.KernelConfig(f"{base}_v2"))
    expect = f"{base}_v2" if check.ok else base
    assert persistent.resolve_variant(cfg, persistent.KernelConfig()) == expect


@pytest.mark.gpu
def test_auto_variant_and_stop_at_first_step():
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    ref = toy.run_eager(w, x0, 5)
    first = int(ref.tokens[0, 0])
    got = persistent.run(w, x0, 5, stop=first)
    assert got.steps.tolist() == [1]
    assert got.tokens[:, 0].tolist() == [first, -1, -1, -1, -1]


def _synthetic_frames():
    import pandas as pd

    rows = []
    for h in (16, 64, 256):
        for variant, sps in (("block", 2e6 / h), ("cluster", 1e6), ("graph_k1", 5e4),
                             ("graph_best", 2e5)):
            kernel = variant in ("block", "cluster")
            rows.append({"sweep": "hidden", "variant": variant, "hidden": h, "layers": 4,
                         "batch": 1, "vocab": 256, "steps_per_s": sps, "us_per_step": 1e6 / sps,
                         "model_us": 0.5 if kernel else float("nan"),
                         "model_cycles": 900.0 if kernel else float("nan"),
                         "cycles_per_step": 2e9 / sps if kernel else float("nan"),
                         "barriers_per_step": 5 if kernel else 0,
                         "barrier_us": 0.05 if kernel else float("nan"),
                         "host_fraction": 0.01, "validated": True, "error": "",
                         "threads": 512, "blocks": 1,
                         "sm_clock_ghz": 1.9 if kernel else float("nan"),
                         "origin": "reference/h200"})
        # A second version that failed validation: a row, no timing; never the best.
        rows.append({"sweep": "hidden", "variant": "cluster_v2", "hidden": h, "layers": 4,
                     "batch": 1, "vocab": 256, "steps_per_s": float("nan"),
                     "us_per_step": float("nan"), "model_us": 0.5, "model_cycles": 900.0,
                     "cycles_per_step": float("nan"), "barriers_per_step": 5,
                     "barrier_us": 0.05, "host_fraction": float("nan"), "validated": False,
                     "error": "AssertionError: token differs", "threads": 256, "blocks": 8,
                     "sm_clock_ghz": float("nan"), "origin": "reference/h200"})
    barriers = pd.DataFrame([{"barrier": "syncthreads", "threads": t, "blocks": 1, "us": 0.02}
                             for t in (256, 512)] +
                            [{"barrier": "grid_sync", "threads": 256, "blocks": b, "us": 1.0}
                             for b in (2, 8)])
    return pd.DataFrame(rows), barriers


def test_plots_on_synthetic_frames():
    import matplotlib.pyplot as plt

    from decodelab.plots import persistent as pp

    frame, barriers = _synthetic_frames()
    for fig in (pp.steps_vs_hidden(frame), pp.model_vs_measured(frame), pp.regime_shift(frame),
                pp.barrier_costs(barriers)):
        assert fig.axes
        plt.close(fig)


def test_seed_comparison_on_synthetic_frame():
    frame, _ = _synthetic_frames()
    table = persistent_analysis.seed_comparison(frame)
    assert set(table["config"]) == {"ultra-light", "h256"}
    ul = table[table["config"] == "ultra-light"].iloc[0]
    assert ul["best_variant"] == "cluster" and math.isclose(ul["x_graph_k1"], 1e6 / 5e4)
    assert not ul["meets_target"]


def test_clock_summary_on_synthetic_frame():
    frame, barriers = _synthetic_frames()
    barriers["sm_clock_ghz"] = 1.5
    text = persistent_analysis.clock_summary(frame, barriers)
    assert "1.90 GHz" in text and "1.50 GHz" in text
    assert "not validated, not timed: cluster_v2" in text
    old = frame.drop(columns=["cycles_per_step"])
    assert "no in-kernel clock" in persistent_analysis.clock_summary(old, None)


# ---- CPU simulation of the second-version work split (kernels/persistent_v2.cuh) ----------
K_MAX = 32


def _geo_v2(threads: int, cols: int, h: int) -> tuple[int, int, int]:
    """Python port of toyk::geo: lanes per column P, inputs per lane K, rounds R."""
    def lanes_ok(p: int) -> bool:
        return h % p == 0 and (h // p) % 4 == 0

    p = 1
    while p * 2 <= 32 and cols * p * 2 <= threads and lanes_ok(p * 2):
        p *= 2
    while h // p > K_MAX and p * 2 <= 32 and lanes_ok(p * 2):
        p *= 2
    return p, h // p, (cols * p + threads - 1) // threads


def _stage_v2(x: torch.Tensor, w: torch.Tensor, threads: int, g: int, n_groups: int) -> torch.Tensor:
    """One stage of block g of n_groups as the kernel computes it: weights packed as
    smem[((r * K + k) * T + t] = w[p*K + k, g*C + col] (col = r*(T/P) + t/P), partial sums per
    thread, xor-shuffle reduction over the P lanes of a column (P | 32: inside one warp)."""
    h, width = w.shape
    cols = width // n_groups
    p_lanes, k_in, rounds = _geo_v2(threads, cols, h)
    packed = torch.zeros(rounds, k_in, threads, dtype=w.dtype)
    for r in range(rounds):
        for k in range(k_in):
            for t in range(threads):
                col = r * (threads // p_lanes) + t // p_lanes
                if col < cols:
                    packed[r, k, t] = w[(t % p_lanes) * k_in + k, g * cols + col]
    out = torch.full((cols,), float("nan"), dtype=w.dtype)
    for r in range(rounds):
        partial = torch.zeros(threads, dtype=w.dtype)
        for t in range(threads):
            p = t % p_lanes
            partial[t] = sum(x[p * k_in + k] * packed[r, k, t] for k in range(k_in))
        off = p_lanes // 2
        while off:  # __shfl_xor_sync: every lane adds its partner's value
            partial = partial + partial[torch.arange(threads) ^ off]
            off //= 2
        for t in range(threads):
            col = r * (threads // p_lanes) + t // p_lanes
            assert t // 32 == (t ^ (p_lanes - 1)) // 32  # a column's lanes share one warp
            if col < cols and t % p_lanes == 0:
                assert math.isnan(out[col])  # each column written exactly once
                out[col] = partial[t]
    return out


@pytest.mark.parametrize(("h", "width", "threads", "groups"), [
    (64, 64, 512, 1), (64, 256, 512, 1), (32, 256, 512, 1), (16, 256, 256, 1),
    (256, 256, 256, 8), (256, 256, 512, 8), (128, 512, 256, 2), (1024, 256, 256, 16),
    (12, 40, 256, 1)])
def test_v2_work_split_simulated(h: int, width: int, threads: int, groups: int):
    gen = torch.Generator().manual_seed(h + width)
    x = torch.randn(h, dtype=torch.float64, generator=gen)
    w = torch.randn(h, width, dtype=torch.float64, generator=gen)
    p_lanes, k_in, _ = _geo_v2(threads, width // groups, h)
    assert k_in % 4 == 0 and k_in <= K_MAX and 32 % p_lanes == 0  # float4 loads, register chunk
    got = torch.cat([_stage_v2(x, w, threads, g, groups) for g in range(groups)])
    torch.testing.assert_close(got, x @ w)


def test_bench_records_a_failing_variant_and_goes_on(monkeypatch):
    """CPU: with the kernel calls replaced, a variant that raises or fails validation gets a row
    (validated False, no timing) and the other variants are still measured."""
    from decodelab.persistent import bench as pb

    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg), toy.initial_state(cfg)
    ref = toy.run_eager(w, x0, 20)
    good = persistent.Check(True, True, None, None, 0.0, 1e-3)
    bad = persistent.Check(False, True, (3, 0), 0.5, 0.0, 1e-3)

    def validate(w, x0, ref, kcfg, stop=-1):
        if kcfg.variant == "grid_v2":
            raise RuntimeError("persistent kernel: launch failed: an illegal memory access")
        return bad if kcfg.variant == "block_v2" else good

    plan_info = {"ok": True, "group": 1, "blocks": 1, "w_place": "shared",
                 "wout_place": "shared", "e_place": "shared"}
    monkeypatch.setattr(persistent, "plan", lambda cfg, kcfg: plan_info)
    monkeypatch.setattr(persistent, "validate", validate)
    monkeypatch.setattr(persistent, "cluster_available", lambda: False)
    monkeypatch.setattr(pb, "_measure_variant",
                        lambda w, x0, kcfg, plan: dict.fromkeys(pb._NO_TIMING, 1.0))
    plan = pb.sweep_plan("smoke")
    barriers = [{"barrier": "syncthreads", "threads": 512, "blocks": 1, "us": 0.02,
                 "cycles": 40.0, "sm_clock_ghz": 1.9}]
    attrs = {"clock_khz": 1_980_000}
    rows = {}
    for version in (1, 2):
        for row in pb._variant_rows("hidden", cfg, w, x0, ref, plan, barriers, attrs, 0.0, version):
            rows[row["variant"]] = row
    assert set(rows) == {"block", "grid", "block_v2", "grid_v2"}
    assert rows["block"]["validated"] and rows["grid"]["steps_per_s"] == 1.0
    assert math.isclose(rows["block"]["model_cycles"], 5 * 40.0 + cfg.flops_per_step / 256)
    for name, why in (("block_v2", "token differs"), ("grid_v2", "illegal memory access")):
        assert not rows[name]["validated"] and why in rows[name]["error"]
        assert math.isnan(rows[name]["us_per_step"]) and rows[name]["validated_steps"] == 0


def test_auto_uses_v2_only_once_validated(monkeypatch):
    cfg = toy.named("ultra-light")
    info = {"ok": True, "w_place": "registers", "wout_place": "registers", "e_place": "shared"}
    monkeypatch.setattr(persistent, "plan", lambda cfg, kcfg: info)
    monkeypatch.setattr(persistent, "_VALIDATED", set())
    auto = persistent.KernelConfig()
    assert persistent.resolve_variant(cfg, auto) == "block"
    other = persistent.KernelConfig("block_v2", 256)  # another launch of v2 proves nothing here
    persistent._VALIDATED.add(persistent._launch_key(cfg, other))
    assert persistent.resolve_variant(cfg, auto) == "block"
    persistent._VALIDATED.add(persistent._launch_key(cfg, persistent.KernelConfig("block_v2")))
    assert persistent.resolve_variant(cfg, auto) == "block_v2"
    assert persistent.resolve_variant(cfg, persistent.KernelConfig("grid")) == "grid"
