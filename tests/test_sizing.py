"""The sizing policy (``core.sizing``) and each phase's sizes on made-up GPUs: a 15 GiB T4
(sm_75), a 22 GiB L4 (sm_89), 40 and 80 GiB A100s (sm_80), a 141 GiB H200 (sm_90). Torch-free
arithmetic: no GPU needed."""

from __future__ import annotations

import pytest

from decodelab.core.sizing import GIB, Device, Option, fit, need_bytes
from decodelab.core.validate import ConfigError
from decodelab.engine.bench.config import RuntimeBenchConfig
from decodelab.engine.bench.invariance_config import InvarianceConfig
from decodelab.model.bench.config import PagedModelBenchConfig
from decodelab.parallel.memory import decide, rank_memory

GPUS = {"t4": Device("Tesla T4", (7, 5), 15 * GIB, 15 * GIB),
        "l4": Device("NVIDIA L4", (8, 9), 22 * GIB, 22 * GIB),
        "a100-40": Device("NVIDIA A100-SXM4-40GB", (8, 0), 40 * GIB, 40 * GIB),
        "a100-80": Device("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GIB, 80 * GIB),
        "h200": Device("NVIDIA H200", (9, 0), 141 * GIB, 141 * GIB)}


def test_fit_keeps_the_first_option_that_fits_and_says_why():
    options = [Option("big", 20 * GIB, "batch 128"), Option("mid", 10 * GIB, "batch 32"),
               Option("small", 2 * GIB, "batch 1")]
    assert fit("phase", options, GPUS["h200"]).sizes == "big"
    assert fit("phase", options, GPUS["h200"]).line is None
    assert fit("phase", options, None).sizes == "big"  # the CPU: nothing to size
    t4 = fit("phase", options, GPUS["t4"])
    assert t4.sizes == "mid" and "\n" not in t4.line
    assert t4.line.startswith("[phase] sized to Tesla T4 (sm_75), 15.0 of 15.0 GiB free: "
                              "batch 128 needs ~23.0 GiB, so batch 32 (~12.0 GiB")
    tiny = Device("x", (8, 6), 2 * GIB, 2 * GIB)
    with pytest.raises(ConfigError, match=r"phase: even batch 1 needs ~3.2 GiB .* x \(sm_86\), "
                                          r"2.0 of 2.0 GiB free"):
        fit("phase", options, tiny)


def test_need_is_the_peak_with_its_headroom():
    assert need_bytes(10 * GIB) == 12 * GIB  # 10 % and 1 GiB
    assert Option(None, 10 * GIB, "").need == 12 * GIB


def _paged(gpu: str):
    return PagedModelBenchConfig.for_profile("gpu").on_device("auto", GPUS[gpu])


def test_paged_model_on_a_t4_runs_fp16_at_the_sizes_that_fit():
    """The issue's failure: batch 128 at context 4096 needs a 16 GiB KV pool alone."""
    fitted = _paged("t4")
    cfg = fitted.sizes
    assert cfg.dtype == "float16" and cfg.model == "llama-3.2-1b"
    assert cfg.contexts == (512, 4096) and max(cfg.batches) < 128
    assert set(cfg.compile_points) <= {(b, c) for b in cfg.batches for c in cfg.contexts}
    assert cfg.peak_bytes(False) * 1.1 + GIB <= 15 * GIB
    assert "sized to Tesla T4 (sm_75)" in fitted.line and "float16" in fitted.line


@pytest.mark.parametrize("gpu", ["l4", "a100-40"])
def test_paged_model_drops_the_peer_and_batches_it_cannot_hold(gpu):
    fitted = _paged(gpu)
    assert fitted.sizes.dtype == "bfloat16" and fitted.line is not None
    assert (128, 4096) not in fitted.sizes.compile_points  # a 16 GiB static cache beside ours
    need = fitted.sizes.peak_bytes(False) * 1.1 + GIB
    assert need <= GPUS[gpu].free


@pytest.mark.parametrize("gpu", ["a100-80", "h200"])
def test_paged_model_runs_its_profile_where_it_fits(gpu):
    full = PagedModelBenchConfig.for_profile("gpu")
    fitted = _paged(gpu)
    assert fitted.line is None
    assert fitted.sizes.batches == full.batches and fitted.sizes.contexts == full.contexts
    assert fitted.sizes.compile_points == full.compile_points


def test_paged_model_falls_back_to_the_tiny_model_on_a_small_gpu():
    small = Device("small", (8, 6), 4 * GIB, 4 * GIB)
    fitted = PagedModelBenchConfig.for_profile("gpu").on_device("auto", small)
    assert fitted.sizes.model == "tiny" and "tiny" in fitted.line


def test_the_cpu_profiles_are_not_sized():
    for profile in ("smoke", "cpu"):
        cfg = PagedModelBenchConfig.for_profile(profile)
        assert cfg.on_device("auto", None).sizes == cfg
        runtime = RuntimeBenchConfig.for_profile(profile)
        assert runtime.on_device("auto", None).sizes == runtime


@pytest.mark.parametrize("gpu", list(GPUS))
def test_runtime_fits_every_gpu_at_its_profile(gpu):
    fitted = RuntimeBenchConfig.for_profile("gpu").on_device("auto", GPUS[gpu])
    assert fitted.line is None and fitted.sizes.batches == (1, 8, 32)
    assert fitted.sizes.dtype == ("float16" if gpu == "t4" else "bfloat16")


def test_runtime_falls_back_to_the_tiny_model_where_the_weights_do_not_fit():
    small = Device("small", (8, 6), 3 * GIB, 3 * GIB)
    fitted = RuntimeBenchConfig.for_profile("gpu").on_device("auto", small)
    assert fitted.sizes.model == "tiny" and fitted.sizes.batches == (1, 8, 32)
    assert fitted.line.startswith("[runtime] sized to small (sm_86)")


def test_the_invariance_cost_drops_the_batches_a_t4_cannot_hold():
    """A 128-row KV pool at context 4,096 alone is 16 GiB (the 15 GiB run that ran out)."""
    full = InvarianceConfig()
    fitted = full.on_device("auto", GPUS["t4"])
    cfg = fitted.sizes
    assert cfg.dtype == "float16" and cfg.cost_batches == (1, 8, 32)
    assert cfg.cost_contexts == full.cost_contexts and cfg.batches == full.batches
    assert cfg.peak_bytes() * 1.1 + GIB <= GPUS["t4"].free
    assert fitted.line.startswith("[batch_invariance] sized to Tesla T4 (sm_75)")
    assert "cost batches 1, 8, 32, 128 x contexts 512, 4096 needs" in fitted.line
    for gpu in ("a100-40", "h200"):
        on_gpu = full.on_device("auto", GPUS[gpu])
        assert on_gpu.line is None and on_gpu.sizes == full


def test_tp_uses_the_same_headroom():
    """The tensor-parallel bench's decision (``parallel.memory``) counts need as every phase."""
    from decodelab.model.config import named_config

    est = rank_memory(named_config("llama-3.1-8b"), 1, 2, 1024, 16)
    assert est.need == need_bytes(est.peak)
    fits = decide({1: est.need}, 15 * GIB)
    assert not fits[0].runs and "GiB per rank" in fits[0].reason  # 16 GB of weights on a T4


def test_the_memory_limit_caps_what_the_sizing_sees(monkeypatch):
    """``DECODELAB_GPU_MEMORY_GIB=15`` on a (pretended) 141 GiB GPU: the allocator is capped at
    15/141 of it and the free memory the sizing reads is at most 15 GiB less what is in use."""
    import torch

    from decodelab.core import device

    applied = []

    class Props:
        total_memory = 141 * GIB

    for name, fn in (("is_available", lambda: True), ("current_device", lambda: 0),
                     ("mem_get_info", lambda i: (130 * GIB, 141 * GIB)),
                     ("memory_reserved", lambda i: 3 * GIB), ("memory_allocated", lambda i: 2 * GIB),
                     ("get_device_properties", lambda i: Props()),
                     ("set_per_process_memory_fraction", lambda f, i: applied.append((f, i)))):
        monkeypatch.setattr(torch.cuda, name, fn)
    device._apply_memory_limit.cache_clear()
    try:
        assert device.gpu_memory("cuda") == (131 * GIB, 141 * GIB)  # unused reserved counts
        assert not applied
        monkeypatch.setenv(device.MEMORY_LIMIT_ENV, "15")
        assert device.gpu_memory("cuda") == (13 * GIB, 15 * GIB)
        assert applied == [(15 / 141, 0)]
        for bad in ("0", "-2", "lots", "inf", "nan"):
            monkeypatch.setenv(device.MEMORY_LIMIT_ENV, bad)
            with pytest.raises(ConfigError, match=f"DECODELAB_GPU_MEMORY_GIB='{bad}': must be"):
                device.gpu_memory("cuda")
    finally:
        device._apply_memory_limit.cache_clear()


def test_no_gpu_no_memory(monkeypatch):
    from decodelab.core.device import gpu_memory, sizing_device

    monkeypatch.setenv("DECODELAB_GPU_MEMORY_GIB", "15")
    assert gpu_memory("cpu") is None and sizing_device("cpu") is None


@pytest.mark.gpu
def test_on_a_gpu_the_limit_holds_and_the_plans_read_the_real_device():
    """In a child process (the cap is process-wide): DECODELAB_GPU_MEMORY_GIB=2 caps what the
    sizing sees and what the allocator gives; the shared-memory limit the attention plans read
    is the one Triton checks a launch against; the capability is torch's."""
    import os
    import subprocess
    import sys

    code = """
import torch
from decodelab.core import device
from decodelab.model.triton.attention_plan import shared_per_block
free, total = device.gpu_memory("cuda")
assert total == 2 * 2**30 and 0 < free <= total, (free, total)
d = device.sizing_device("cuda")
assert d.capability == torch.cuda.get_device_capability(0) == device.compute_capability()
import triton
props = triton.runtime.driver.active.utils.get_device_properties(0)
assert shared_per_block(torch.device("cuda")) == props["max_shared_mem"], props
try:
    torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    print("capped")
"""
    env = {**os.environ, "DECODELAB_GPU_MEMORY_GIB": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "capped"
