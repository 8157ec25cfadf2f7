"""The dtype choice (``core.precision``): ``auto`` per device, bfloat16 refused below sm_80 with
the GPU's compute capability named, the same rule in the bench configs, the notebooks'
parameters and the command line, and float16 on the model's torch path (the tiny model)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodelab.cli import main
from decodelab.core.precision import allowed_dtypes, auto_dtype, resolve_dtype
from decodelab.core.validate import ConfigError
from decodelab.engine.bench.config import RuntimeBenchConfig
from decodelab.model.bench.config import PagedModelBenchConfig
from decodelab.parallel.config import TPBenchConfig

REFUSAL = ("'bfloat16': this GPU is sm_75 (compute capability 7.5), without bfloat16 tensor "
           "cores (they start at sm_80); use 'float16' or 'auto'")


@pytest.mark.parametrize("capability, dtype", [(None, "float32"), ((7, 0), "float16"),
                                               ((7, 5), "float16"), ((8, 0), "bfloat16"),
                                               ((8, 9), "bfloat16"), ((9, 0), "bfloat16")])
def test_auto_follows_the_tensor_cores(capability, dtype):
    assert auto_dtype(capability) == dtype == resolve_dtype("auto", capability)
    assert resolve_dtype(None, capability) == dtype
    assert allowed_dtypes(capability)[0] == dtype


def test_names_are_checked_against_the_device():
    assert resolve_dtype("float16", (9, 0)) == "float16"
    assert resolve_dtype("float32", (7, 5)) == "float32"
    assert resolve_dtype("bfloat16", None) == "bfloat16"  # the CPU computes bf16 too
    with pytest.raises(ConfigError) as exc:
        resolve_dtype("bfloat16", (7, 5), "paged_model.dtype")
    assert str(exc.value) == "paged_model.dtype=" + REFUSAL
    with pytest.raises(ConfigError, match="dtype='fp16': must be one of auto, bfloat16, "
                                          "float16, float32"):
        resolve_dtype("fp16", (8, 0))


@pytest.mark.parametrize("cls", [PagedModelBenchConfig, RuntimeBenchConfig, TPBenchConfig])
def test_bench_configs_take_float16_and_refuse_other_names(cls):
    cfg = cls.for_profile("gpu")
    assert dataclasses.replace(cfg, dtype="float16").dtype == "float16"
    with pytest.raises(ConfigError, match=f"{cls.__name__}.dtype='float64'"):
        dataclasses.replace(cfg, dtype="float64")


def test_on_device_resolves_the_dtype_there():
    from decodelab.core.sizing import GIB, Device

    t4 = Device("Tesla T4", (7, 5), 15 * GIB, 15 * GIB)
    h200 = Device("NVIDIA H200", (9, 0), 141 * GIB, 141 * GIB)
    for cls in (PagedModelBenchConfig, RuntimeBenchConfig):
        cfg = cls.for_profile("gpu")
        assert cfg.on_device("auto", t4).sizes.dtype == "float16"
        assert cfg.on_device("auto", h200).sizes.dtype == "bfloat16"
        assert cfg.on_device("float32", h200).sizes.dtype == "float32"
        with pytest.raises(ConfigError, match="sm_75"):
            cfg.on_device("bfloat16", t4)
        assert cls.for_profile("cpu").on_device("auto", None).sizes.dtype == "float32"


@pytest.fixture
def t4(monkeypatch):
    """torch reports an sm_75 GPU (nothing here touches it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (7, 5))


def test_notebook_parameters_refuse_bfloat16_on_a_t4(t4):
    from decodelab import notebooks

    cls = notebooks.params_class("04_model")
    assert cls(profile="gpu").dtype == "float16"
    assert cls(profile="cpu").dtype == "float32"
    with pytest.raises(ConfigError) as exc:
        cls(profile="gpu", dtype="bfloat16")
    assert str(exc.value) == "04_model.dtype=" + REFUSAL
    for name in ("04_runtime", "06_multi_gpu"):
        assert notebooks.params_class(name)(profile="gpu").dtype == "float16"


def test_the_command_line_refuses_bfloat16_on_a_t4_before_any_phase(t4, capsys, monkeypatch):
    import decodelab.bench as registry

    monkeypatch.setattr(registry, "run_all", lambda *a, **k: pytest.fail("must not run"))
    assert main(["bench", "paged_model", "--profile", "gpu", "--dtype", "bfloat16"]) == 2
    assert capsys.readouterr().err.strip() == "error: --dtype=" + REFUSAL
    assert main(["bench", "dispatch", "--dtype", "float16"]) == 2
    assert "phase dispatch has no model dtype; it applies to paged_model, runtime, serve, tiles, tp" in \
        capsys.readouterr().err
    assert main(["run", "04_model", "--profile", "gpu", "--dtype", "bf16"]) == 2
    assert "--dtype='bf16': must be one of auto, bfloat16, float16, float32" in \
        capsys.readouterr().err


def test_bench_all_passes_the_dtype_to_the_model_phases_only(monkeypatch, tmp_path):
    import subprocess

    import decodelab.bench as registry

    commands = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: commands.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    assert registry.run_all(["dispatch", "paged_model", "runtime"], "cpu", tmp_path,
                            dtype="float16") == 0
    dtypes = {cmd[4]: cmd[cmd.index("--dtype") + 1] if "--dtype" in cmd else None
              for cmd in commands}
    assert dtypes == {"dispatch": None, "paged_model": "float16", "runtime": "float16"}
    with pytest.raises(ConfigError, match="phase dispatch has no model dtype"):
        registry.run_phase("dispatch", "cpu", tmp_path, dtype="float16")


def test_float16_on_the_torch_path_matches_float32():
    """The tiny model in float16 on the CPU (the torch ops) stays within float16 rounding of
    float32 over a prefill and teacher-forced decode steps."""
    from decodelab.model import compare
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama, greedy_generate
    from decodelab.model.weights import from_state_dict, random_state_dict

    config = named_config("tiny")
    sd = random_state_dict(config, seed=1)
    prompts = compare.prompts(config, 3)
    runs = {}
    for dtype in (torch.float32, torch.float16):
        model = PagedLlama(config, from_state_dict(config, sd, dtype=dtype),
                           PagedKVCache(config, 96, 16, dtype=dtype), backend="torch")
        forced = runs[torch.float32][0] if runs else None
        runs[dtype] = greedy_generate(model, prompts, 6, forced=forced)
    ref, got = runs[torch.float32][1], runs[torch.float16][1]
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert 0 < compare.rel_err(got, ref) < 1e-2


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (it is on Linux x86-64)")
def test_the_triton_kernels_in_float16_match_the_float32_reference():
    """``triton_interp_checks.float16`` in Triton's CPU interpreter (a child process: the
    variable must be set before the kernels are defined)."""
    here = Path(__file__).parent
    path = os.pathsep.join([str(here.parent / "lib"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, str(here / "triton_interp_checks.py"), "float16"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "float16: ok"


@pytest.mark.parametrize("phase, table", [("paged_model", "paged_model"), ("runtime", "runtime")])
def test_a_model_phase_runs_in_float16_and_says_so_in_every_row(phase, table, tmp_path):
    """The smoke sizes on the CPU (the tiny model), validated as every run is (paged_model:
    against transformers in float16 too)."""
    import pandas as pd

    from decodelab.bench import run_phase

    run_phase(phase, "smoke", tmp_path, dtype="float16")
    rows = pd.read_csv(tmp_path / f"{table}.csv")
    assert len(rows) and set(rows["dtype"]) == {"float16"}


def test_report_gives_the_dtype_to_the_notebooks_that_run_the_model(monkeypatch, tmp_path):
    from decodelab import notebooks, report

    ran = {}
    monkeypatch.setattr(notebooks, "run", lambda name, params, out, progress: ran.update(
        {name: params}) or tmp_path / f"{name}.ipynb")
    monkeypatch.setattr(report, "export", lambda executed, path, profile: path)
    assert main(["report", "--profile", "cpu", "--dtype", "float16", "--out", str(tmp_path)]) == 0
    assert set(ran) == set(notebooks.available())
    takes = {n for n in ran
             if "dtype" in {f.name for f in dataclasses.fields(notebooks.params_class(n))}}
    assert takes == {"04_model", "04_runtime", "06_multi_gpu"}
    assert all(ran[n].get("dtype") == ("float16" if n in takes else None) for n in ran)
