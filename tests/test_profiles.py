"""One profile policy for every phase and notebook (issue 22 §1): ``measured_device`` says which
device a profile measures, and ``gpu`` on a machine without CUDA is refused everywhere with the
same message, before anything is measured or written. Each phase's ``for_profile`` gives the
same sizes on any machine."""

from __future__ import annotations

import pytest
import torch

from decodelab.bench import PHASES, run_phase
from decodelab.core.profiles import measured_device, on_bench_device
from decodelab.core.validate import ConfigError

REFUSAL = "profile 'gpu' needs a CUDA GPU and none is visible; use 'cpu', 'smoke' or 'auto'"


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA, also where the tests run on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def cuda_visible(monkeypatch):
    """torch reports a CUDA device (nothing here touches it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_measured_device_answers_for_each_profile(no_cuda):
    assert measured_device("smoke") == "cpu"
    assert measured_device("cpu") == "cpu"
    assert measured_device("auto") == "cpu"  # auto: the hardware decides, here cpu
    with pytest.raises(ConfigError) as exc:
        measured_device("gpu")
    assert str(exc.value) == REFUSAL
    with pytest.raises(ConfigError, match="unknown profile 'turbo'"):
        measured_device("turbo")


def test_measured_device_with_cuda(cuda_visible):
    assert measured_device("gpu") == "cuda"
    assert measured_device("auto") == "cuda"
    assert measured_device("smoke") == "cpu" and measured_device("cpu") == "cpu"


def test_on_bench_device_follows_the_policy(no_cuda):
    assert on_bench_device("smoke", lambda dev: dev.type) == "cpu"
    assert on_bench_device("cpu", lambda dev: dev.type) == "cpu"
    with pytest.raises(ConfigError, match="'gpu' needs a CUDA GPU"):
        on_bench_device("gpu", lambda dev: pytest.fail("must not run"))


@pytest.mark.parametrize("phase", list(PHASES))
def test_every_phase_refuses_gpu_without_cuda_and_writes_nothing(no_cuda, tmp_path, phase):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as exc:
        run_phase(phase, "gpu", out)
    assert str(exc.value) == REFUSAL
    assert not out.exists()


def test_every_notebook_refuses_gpu_without_cuda(no_cuda):
    from decodelab import notebooks

    for name in notebooks.available():
        with pytest.raises(ConfigError, match=f"{name}.profile 'gpu' needs a CUDA GPU"):
            notebooks.params_class(name)(profile="gpu")
        assert notebooks.params_class(name)(profile="auto").profile == "cpu"


def test_profile_sizes_do_not_depend_on_the_machine(monkeypatch):
    """``gpu`` used to give the CPU sizes on a machine without CUDA in three phases."""
    from decodelab.engine.bench import RuntimeBenchConfig
    from decodelab.model.bench.config import PagedModelBenchConfig
    from decodelab.parallel.config import TPBenchConfig
    from decodelab.persistent.sweep import PersistentBenchConfig
    from decodelab.replay.measure import ReplayBenchConfig

    phases = (RuntimeBenchConfig, PagedModelBenchConfig, TPBenchConfig, PersistentBenchConfig,
              ReplayBenchConfig)
    seen = {}
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        for cls in phases:
            for profile in ("smoke", "cpu", "gpu"):
                seen.setdefault((cls, profile), set()).add(repr(cls.for_profile(profile)))
    assert all(len(configs) == 1 for configs in seen.values())
    assert RuntimeBenchConfig.for_profile("gpu").model == "llama-3.2-1b"
    assert PagedModelBenchConfig.for_profile("gpu").dtype == "bfloat16"
    assert TPBenchConfig.for_profile("gpu").graph_batches


def test_dispatch_plan_device_is_the_measured_device(monkeypatch):
    from decodelab.dispatch import DispatchBenchConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert DispatchBenchConfig.for_profile("gpu").device == "cuda"
    for profile in ("smoke", "cpu"):
        plan = DispatchBenchConfig.for_profile(profile)
        assert plan.device == "cpu" and plan.named_modes == plan.sweep_modes == ("eager",)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'gpu' needs a CUDA GPU"):
        DispatchBenchConfig.for_profile("gpu")


def test_calibration_choice(monkeypatch):
    """One function: smoke calibrates at the smallest sizes; otherwise at the sizes of the
    device calibrate() measures (the GPU wherever one is visible)."""
    from decodelab.env.calibrate import CalibrationConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert CalibrationConfig.for_profile("smoke").profile == "smoke"
    assert CalibrationConfig.for_profile("cpu").profile == "cpu"
    with pytest.raises(ConfigError, match="'gpu' needs a CUDA GPU"):
        CalibrationConfig.for_profile("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CalibrationConfig.for_profile("smoke").profile == "smoke"
    assert CalibrationConfig.for_profile("cpu").profile == "gpu"
    assert CalibrationConfig.for_profile("gpu").profile == "gpu"
