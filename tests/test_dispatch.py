"""Phase 1 (dispatch): the mode switch, validation against eager, measurement, the bench table,
the derived views and the figures. GPU-marked tests check the graph and compiled modes."""

import math

import matplotlib
import pandas as pd
import pytest
import torch

from decodelab.core.results import load_table
from decodelab.core.validate import ConfigError
from decodelab.dispatch import (
    MODES,
    DispatchBenchConfig,
    ModeMismatchError,
    bench,
    check_against_eager,
    crossovers,
    graph_ratios,
    make_step,
    nearest_point,
)
from decodelab.dispatch.measure import _busy_us, profile_counts, time_steps
from decodelab.dispatch.notebook import NotebookParams
from decodelab.toy import step as toy

matplotlib.use("Agg")


def _setup(name="ultra-light", device="cpu"):
    cfg = toy.named(name)
    return (toy.make_weights(cfg, device), toy.initial_state(cfg, device),
            toy.initial_state(cfg, device, seed=cfg.seed + 2))


# --- the mode switch -------------------------------------------------------------------------

def test_unknown_mode_names_the_field():
    w, x0, _ = _setup()
    with pytest.raises(ConfigError, match="dispatch.mode='fast'"):
        make_step(w, x0, "fast")


@pytest.mark.parametrize("mode", ["cuda_graph", "compile_graphs"])
def test_graph_modes_on_cpu_say_they_need_cuda(mode):
    w, x0, _ = _setup()
    with pytest.raises(ConfigError, match="needs CUDA"):
        make_step(w, x0, mode)


def test_state_on_another_dtype_is_refused():
    w, x0, _ = _setup()
    with pytest.raises(ConfigError, match="x0 is torch.float64"):
        make_step(w, x0.double(), "eager")


def test_eager_stepper_follows_the_reference_and_reseeds():
    w, x0, x1 = _setup()
    stepper = make_step(w, x0, "eager")
    ref = toy.run_eager(w, x0, 3)
    for k in range(3):
        stepper()
        assert torch.equal(stepper.token(), ref.tokens[k])
    stepper.reset(x1)
    stepper()
    assert torch.equal(stepper.state(), toy.step(w, x1)[0])
    assert stepper.setup_s == 0.0


def test_compile_mode_equals_eager_on_cpu():
    w, x0, x1 = _setup()
    with torch.no_grad():
        stepper = make_step(w, x0, "compile")
        result = check_against_eager(stepper, w, x0, x1, n_steps=100)
    assert result.mode == "compile" and result.max_state_err <= result.tolerance
    assert stepper.setup_s > 0


def test_compile_graphs_state_buffer_semantics_on_cpu():
    """The in-place, static-buffer body of compile_graphs (Inductor skips the graphs on a CPU)."""
    from decodelab.dispatch.modes import CompiledStep

    w, x0, x1 = _setup()
    with torch.no_grad():
        stepper = CompiledStep(w, x0, graphs=True)
        buffer = stepper.state()
        result = check_against_eager(stepper, w, x0, x1, n_steps=100)
    assert result.mode == "compile_graphs" and result.max_state_err <= result.tolerance
    assert stepper.state() is buffer  # one state buffer for the stepper's life


# --- validation catches wrong fast paths -----------------------------------------------------

class _FrozenStepper:
    """A broken fast path: ignores re-seeding (a value frozen at 'capture')."""

    mode = "frozen"
    setup_s = 0.0

    def __init__(self, w, x0):
        self.inner = make_step(w, x0, "eager")

    def __call__(self):
        self.inner()

    def reset(self, x):
        if not hasattr(self, "seeded"):
            self.seeded = True
            self.inner.reset(x)

    def state(self):
        return self.inner.state()

    def token(self):
        return self.inner.token()


def test_check_catches_a_value_frozen_at_capture():
    w, x0, x1 = _setup()
    with pytest.raises(ModeMismatchError, match="re-seeded"):
        check_against_eager(_FrozenStepper(w, x0), w, x0, x1, n_steps=100)


def test_check_catches_a_drifting_state():
    w, x0, x1 = _setup()
    stepper = make_step(w, x0, "eager")
    inner_call = stepper.__call__

    class Drift:
        mode, setup_s = "drift", 0.0
        reset, token = stepper.reset, stepper.token

        def __call__(self):
            inner_call()

        def state(self):
            return stepper.state() + 1e-2

    with pytest.raises(ModeMismatchError, match="states differ"):
        check_against_eager(Drift(), w, x0, x1, n_steps=100)


# --- measurement -----------------------------------------------------------------------------

def test_busy_time_is_the_union_of_intervals():
    assert _busy_us([(0, 2), (1, 3), (5, 6)]) == 4
    assert _busy_us([(0, 10), (2, 3)]) == 10
    assert _busy_us([]) == 0


def test_time_and_profile_eager_on_cpu():
    w, x0, _ = _setup()
    stepper = make_step(w, x0, "eager")
    timing = time_steps(stepper, on_cuda=False, repeats=3, target_s=1e-3)
    assert timing.wall_us > 0 and timing.host_us > 0 and timing.repeats == 3
    counts = profile_counts(stepper, 3, on_cuda=False)
    assert math.isnan(counts.device_us)
    # at least one op per layer (addmm, tanh) plus the head (matmul, argmax, gather, add, mul)
    assert counts.kernels >= 2 * toy.named("ultra-light").layers + 5


def test_plans_validate_profiles():
    with pytest.raises(ConfigError, match="profile"):
        DispatchBenchConfig.for_profile("huge")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'gpu' needs a CUDA GPU and none is visible"):
            DispatchBenchConfig.for_profile("gpu")
    plan = DispatchBenchConfig.for_profile("cpu")
    assert plan.device == "cpu" and plan.named_modes == ("eager",)
    sweep = plan.sweep_configs()
    assert sweep[0] == plan.base and len(set(sweep)) == len(sweep)
    assert {(c.hidden != plan.base.hidden) + (c.layers != plan.base.layers)
            + (c.batch != plan.base.batch) for c in sweep} == {0, 1}  # one factor at a time


def test_bench_smoke_writes_the_table(local_results):
    written = bench("smoke", local_results)
    assert [p.name for p in written] == ["dispatch.csv"]
    frame = load_table("dispatch", reference=local_results / "none", local=local_results)
    for col in ("mode", "config", "hidden", "layers", "batch", "vocab", "dtype",
                "wall_us_per_step", "host_us_per_step", "device_us_per_step",
                "kernels_per_step", "idle_fraction", "setup_s"):
        assert col in frame, col
    assert (frame["wall_us_per_step"] > 0).all()
    assert set(frame["config"]) == {"ultra-light", "sweep"}
    assert (frame["check_steps"] >= 100).all()


# --- derived views and figures on a synthetic frame ------------------------------------------

def _synthetic() -> pd.DataFrame:
    """Eager: host 40 µs, device grows with H (crosses at H=1024); graph: host 3 µs."""
    rows = []
    for mode, host in (("eager", 40.0), ("cuda_graph", 3.0)):
        for h in (16, 64, 256, 1024, 4096):
            device = 10.0 * h / 256
            rows.append(dict(origin="reference/h200", mode=mode, config="sweep", hidden=h,
                             layers=4, batch=1, backend="cuda", host_us_per_step=host,
                             device_us_per_step=device, wall_us_per_step=max(host, device) + 1,
                             kernels_per_step=13.0))
        for name, (h, n_layers, b) in (("ultra-light", (64, 4, 1)), ("medium", (1024, 8, 8))):
            device = 5.0 * h / 64
            rows.append(dict(origin="reference/h200", mode=mode, config=name, hidden=h,
                             layers=n_layers, batch=b, backend="cuda", host_us_per_step=host,
                             device_us_per_step=device, wall_us_per_step=max(host, device) + 1,
                             kernels_per_step=13.0))
    return pd.DataFrame(rows)


def test_crossovers_interpolate_on_log_axis():
    marks = crossovers(_synthetic()).set_index(["mode", "axis"])
    # eager: device/host = 40/40 = 1 exactly at H=1024
    assert marks.loc[("eager", "hidden"), "crossover"] == pytest.approx(1024)
    assert marks.loc[("cuda_graph", "hidden"), "status"] == "crosses"
    assert marks.loc[("cuda_graph", "hidden"), "crossover"] < 256


def test_graph_ratios_and_nearest_point():
    ratios = graph_ratios(_synthetic()).set_index("config")
    assert ratios.loc["ultra-light", "host_ratio"] == pytest.approx(40 / 3)
    near = nearest_point(_synthetic(), 1000, 4, 1)
    assert set(near["hidden"]) == {1024} and set(near["mode"]) == {"eager", "cuda_graph"}


def test_every_figure_renders():
    import matplotlib.pyplot as plt

    from decodelab.plots import dispatch as fig

    frame = _synthetic()
    figures = [fig.stacked_bars(frame), fig.crossover_figure(frame, crossovers(frame)),
               fig.ratio_figure(graph_ratios(frame), 15.0),
               fig.point_figure(nearest_point(frame, 64, 4, 1))]
    cpu = frame.assign(device_us_per_step=float("nan"), backend="cpu", origin="local")
    figures.append(fig.stacked_bars(cpu))
    for f in figures:
        assert isinstance(f, plt.Figure)
        plt.close(f)


def test_notebook_params_validate():
    assert NotebookParams(profile="smoke", interactive=False).measure_live
    with pytest.raises(ConfigError, match="profile"):
        NotebookParams(profile="fast", interactive=False)
    with pytest.raises(ConfigError, match="interactive"):
        NotebookParams(profile="cpu", interactive="no")


# --- GPU: graph and compiled modes equal eager -----------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ultra-light", "medium"])
@pytest.mark.parametrize("mode", [m for m in MODES if m != "eager"])
def test_fast_modes_equal_eager_on_gpu(mode, name):
    w, x0, x1 = _setup(name, "cuda")
    with torch.no_grad():
        stepper = make_step(w, x0, mode)
        result = check_against_eager(stepper, w, x0, x1, n_steps=100)
    assert result.max_state_err <= result.tolerance


@pytest.mark.gpu
def test_graph_launches_once_per_step_on_gpu():
    w, x0, _ = _setup("h256", "cuda")
    with torch.no_grad():
        eager = profile_counts(make_step(w, x0, "eager"), 5, on_cuda=True)
        graph = profile_counts(make_step(w, x0, "cuda_graph"), 5, on_cuda=True)
    assert graph.kernels >= 2 * toy.named("h256").layers
    assert graph.launches < eager.launches / 4  # one graph launch vs one per kernel
    assert graph.device_us > 0


@pytest.mark.slow
def test_notebook_01_runs_in_smoke_profile(local_results, tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    import nbformat

    from decodelab import notebooks

    monkeypatch.setenv("DECODELAB_FIGURES", str(tmp_path / "figures"))
    path = notebooks.run("01_dispatch", {"profile": "smoke", "interactive": False},
                         tmp_path / "executed", progress=False)
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert (local_results / "dispatch.csv").exists()
