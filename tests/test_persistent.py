"""Phase 3: configs, the no-GPU path, reference stop handling, the work splits (simulated), and
(GPU) every persistent variant against the eager torch reference on fixed and random shapes."""

from __future__ import annotations

import math
import random

import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.persistent import bench as persistent_bench
from decodelab.persistent import kernel as persistent
from decodelab.persistent import validation
from decodelab.persistent.library import DESIGNS, EXCHANGES
from decodelab.persistent.sweep import NAMED, PersistentBenchConfig, launch_configs
from decodelab.toy import step as toy


def test_kernel_config_validation():
    assert persistent.KernelConfig().variant == "auto"
    with pytest.raises(ConfigError, match="variant"):
        persistent.KernelConfig(variant="warp")
    with pytest.raises(ConfigError, match="threads"):
        persistent.KernelConfig("block_wide", threads=100)
    for variant in ("block_fixed", "block_wide_fold"):
        with pytest.raises(ConfigError, match="group"):
            persistent.KernelConfig(variant, group=2)
    with pytest.raises(ConfigError, match="16 blocks"):
        persistent.KernelConfig("cluster_narrow", group=32)


def test_variant_names_and_codes():
    # Codes as in persistent.cuh: code = design * 3 + exchange.
    assert len(persistent.VARIANTS) == len(DESIGNS) * len(EXCHANGES) == 15
    for code, name in enumerate(persistent.VARIANTS):
        assert persistent.VARIANT_CODES[name] == code
        assert persistent.exchange_of(name) == EXCHANGES[code % 3]
        assert persistent.design_of(name) == DESIGNS[code // 3]


def test_shape_and_stop_validation():
    persistent.check_shape(toy.named("h256"))
    persistent.check_shape(toy.ToyConfig(hidden=36, layers=1, batch=1, vocab=3))  # 36/lanes odd
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


def test_sweep_plans_and_launches():
    for profile in ("smoke", "gpu"):
        plan = PersistentBenchConfig.for_profile(profile)
        for sweep, cfg in plan.shapes:
            persistent.check_shape(cfg)
            launches = launch_configs(sweep, cfg, cluster=True)
            assert launches and len(set(launches)) == len(launches)
            without = launch_configs(sweep, cfg, cluster=False)
            assert all(persistent.exchange_of(k.variant) != "cluster" for k in without)
    gpu = PersistentBenchConfig.for_profile("gpu")
    named = {cfg.hidden for sweep, cfg in gpu.shapes if sweep == "named"}
    assert named == {toy.named(n).hidden for n in NAMED}
    every = {k.variant for k in launch_configs("named", toy.named("h256"), cluster=True)}
    assert every == set(persistent.VARIANTS)  # the named shapes run every variant


def test_reference_with_stop():
    tokens = torch.tensor([[1, 2], [3, 2], [3, 5], [4, 3]])
    ref = toy.Trajectory(tokens, torch.zeros(4, 2, 3))
    got, steps = validation.reference_with_stop(ref, 3)
    assert steps.tolist() == [2, 4]
    assert got[:, 0].tolist() == [1, 3, -1, -1]
    assert got[:, 1].tolist() == [2, 2, 5, 3]
    same, all_steps = validation.reference_with_stop(ref, -1)
    assert torch.equal(same, tokens) and all_steps.tolist() == [4, 4]


# ---- CPU simulation of the work splits (kernels/persistent_policies.cuh) ---------------------
K_MAX = 32


def _chunk(h: int, p: int) -> int:
    return ((h + p - 1) // p + 3) // 4 * 4


def _useful(h: int, p: int) -> bool:
    return p <= 32 and p * 4 < h + 4


def _geo(design: str, threads: int, cols: int, h: int) -> tuple[int, int, int]:
    """Python port of Split*::geo: lanes per column P, inputs per lane K, rounds R."""
    p = 1
    if design == "fixed":
        while p * 2 <= 32 and p * 2 * 8 <= h:
            p *= 2
    elif design == "wide":
        while _useful(h, p * 2) and cols * p * 2 <= threads:
            p *= 2
    else:  # narrow
        while _useful(h, p * 2) and cols * p < min(threads, 128):
            p *= 2
    while p < 32 and _chunk(h, p) > K_MAX:
        p *= 2
    return p, _chunk(h, p), (cols * p + threads - 1) // threads


def _stage(x: torch.Tensor, w: torch.Tensor, design: str, threads: int, g: int, groups: int
           ) -> torch.Tensor:
    """Block g's columns of one stage as the kernel computes them: lane p of a column sums its
    K inputs, float4 words p, p + P, p + 2P, ... of x (zero past H), times the packed weights;
    xor-shuffles add the P lanes; columns ragged over the groups (ceil(cols / G) each, the last
    blocks short or empty)."""
    h, width = w.shape
    per = (width + groups - 1) // groups
    valid = max(0, min(per, width - g * per))
    p_lanes, k_in, rounds = _geo(design, threads, per, h)
    hp = p_lanes * k_in
    xp = torch.cat([x, x.new_zeros(hp - h)])
    wp = torch.cat([w, w.new_zeros(hp - h, width)])
    out = torch.full((valid,), float("nan"), dtype=w.dtype)
    for r in range(rounds):
        partial = torch.zeros(threads, dtype=w.dtype)
        for t in range(threads):
            col, p = r * (threads // p_lanes) + t // p_lanes, t % p_lanes
            if col < valid:
                rows = torch.tensor([4 * (j * p_lanes + p) + i for j in range(k_in // 4)
                                     for i in range(4)])
                partial[t] = (xp[rows] * wp[rows, g * per + col]).sum()
        off = p_lanes // 2
        while off:  # __shfl_xor_sync: every lane adds its partner's value
            partial = partial + partial[torch.arange(threads) ^ off]
            off //= 2
        for t in range(threads):
            col = r * (threads // p_lanes) + t // p_lanes
            assert t // 32 == (t ^ (p_lanes - 1)) // 32  # a column's lanes share one warp
            if col < valid and t % p_lanes == 0:
                assert math.isnan(out[col])  # each column written exactly once
                out[col] = partial[t]
    return out


@pytest.mark.parametrize("design", ["fixed", "wide", "narrow"])
@pytest.mark.parametrize(("h", "width", "threads", "groups"), [
    (64, 64, 512, 1), (64, 256, 256, 1), (16, 256, 256, 1), (256, 256, 256, 16),
    (128, 512, 256, 2), (1024, 256, 256, 16), (12, 40, 256, 1), (36, 7, 256, 3),
    (100, 1000, 512, 16)])
def test_work_split_simulated(design: str, h: int, width: int, threads: int, groups: int):
    gen = torch.Generator().manual_seed(h + width)
    x = torch.randn(h, dtype=torch.float64, generator=gen)
    w = torch.randn(h, width, dtype=torch.float64, generator=gen)
    per = (width + groups - 1) // groups
    p_lanes, k_in, _ = _geo(design, threads, per, h)
    assert k_in % 4 == 0 and k_in <= K_MAX and 32 % p_lanes == 0  # float4 loads, register chunk
    assert p_lanes * k_in >= h  # the lanes cover every input
    got = torch.cat([_stage(x, w, design, threads, g, groups) for g in range(groups)])
    torch.testing.assert_close(got, x @ w)


def test_every_hidden_multiple_of_4_has_a_split():
    """The refusals of the first planner ("H/lanes must be a multiple of 4") are gone: every
    hidden size that is a multiple of 4 up to 1024 gets a split in every design."""
    for h in range(4, 1025, 4):
        for design in ("fixed", "wide", "narrow"):
            for cols in (1, 7, h, 256, 4096):
                p, k, r = _geo(design, 256, cols, h)
                assert k <= K_MAX and p * k >= h and r >= 1


# ---- GPU: every variant against the eager reference -----------------------------------------
def _check_all(cfg: toy.ToyConfig, n_steps: int, kcfg: persistent.KernelConfig) -> None:
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    ref = toy.run_eager(w, x0, n_steps)
    check = validation.validate(w, x0, ref, kcfg)
    assert check.ok, check.describe()
    stop = validation.stop_token_for(ref)
    check = validation.validate(w, x0, ref, kcfg, stop=stop)
    assert check.ok, check.describe()


def _skip_unless_runs(cfg: toy.ToyConfig, kcfg: persistent.KernelConfig) -> None:
    if persistent.exchange_of(kcfg.variant) == "cluster" and not persistent.cluster_available():
        pytest.skip("thread-block clusters need sm_90")
    plan = persistent.plan(cfg, kcfg)
    if not plan.ok:
        pytest.skip(plan.why)


GPU_SHAPES = [toy.named("ultra-light"), toy.named("h256"),
              toy.ToyConfig(hidden=32, layers=4, batch=3, vocab=256),
              toy.ToyConfig(hidden=128, layers=1, batch=2, vocab=512),
              toy.ToyConfig(hidden=36, layers=3, batch=1, vocab=1000, seed=3),
              toy.ToyConfig(hidden=512, layers=2, batch=1, vocab=7)]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", persistent.VARIANTS)
@pytest.mark.parametrize("cfg", GPU_SHAPES, ids=lambda c: f"h{c.hidden}l{c.layers}b{c.batch}v{c.vocab}")
def test_variant_matches_reference(variant: str, cfg: toy.ToyConfig):
    kcfg = persistent.KernelConfig(variant, 256)
    _skip_unless_runs(cfg, kcfg)
    _check_all(cfg, 1000, kcfg)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(12))
def test_random_shapes(seed: int):
    """Random hidden (multiples of 4), layers, batch, vocabulary (tiny and odd ones too),
    variant and thread count: identical tokens to the reference, stop handling exact."""
    rng = random.Random(seed)
    cfg = toy.ToyConfig(hidden=4 * rng.randint(1, 256), layers=rng.randint(1, 6),
                        batch=rng.randint(1, 6), vocab=rng.choice([2, 3, 7, rng.randint(2, 4096)]),
                        seed=seed)
    kcfg = persistent.KernelConfig(rng.choice(persistent.VARIANTS), rng.choice([256, 512]))
    _skip_unless_runs(cfg, kcfg)
    _check_all(cfg, 200, kcfg)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["block_wide", "cluster_wide_fold", "grid_narrow"])
def test_run_clock_and_stage_clock(variant: str):
    """The run clock (cycles and ns of the step loop, a plausible SM clock) and the diagnostic
    build's stage clock (L + 2 stages, work > 0; its tokens are the plain build's)."""
    cfg = toy.named("h256")
    kcfg = persistent.KernelConfig(variant, 256)
    _skip_unless_runs(cfg, kcfg)
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    plain = persistent.run(w, x0, 500, kcfg=kcfg)
    clocked = persistent.run(w, x0, 500, kcfg=kcfg, clocked=True)
    cycles, ns = (int(v) for v in plain.clock.cpu())
    assert cycles > 0 and ns > 0 and 0.05 < cycles / ns < 5.0  # GHz
    stages = clocked.stages.cpu()
    assert stages.shape == (cfg.layers + 2, 2) and (stages[:, 0] > 0).all()
    assert int(stages[-1, 1]) == 0  # the token stage ends in no barrier
    assert torch.equal(plain.tokens.cpu(), clocked.tokens.cpu())


@pytest.mark.gpu
def test_auto_variant_and_stop_at_first_step():
    cfg = toy.named("ultra-light")
    assert persistent.resolve_variant(cfg, persistent.KernelConfig()) == "block_wide_fold"
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    ref = toy.run_eager(w, x0, 5)
    first = int(ref.tokens[0, 0])
    got = persistent.run(w, x0, 5, stop=first)
    assert got.steps.tolist() == [1]
    assert got.tokens[:, 0].tolist() == [first, -1, -1, -1, -1]
