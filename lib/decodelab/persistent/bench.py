"""Phase-3 bench: every persistent variant validated, then timed, next to the graph replay.

Tables written by :func:`run_bench`:
- ``persistent``: one row per (sweep, launch, shape) (rows.PersistentRow): steps/s and µs/step
  (device time of one launch of N steps / N), host CPU time per launch, the launch plan and work
  split, validation outcome (a variant that fails validation or raises gets a row without
  timings and the others go on), the run clock (``cycles_per_step`` from clock64 of block 0's
  step loop, ``sm_clock_ghz``), the diagnostic build's cycles, and the latency models; the
  single-step graph (``graph_k1``) and the best multi-step graph (``graph_best``) of phase 2
  measured in the same run on the same shapes.
- ``persistent_stages``: the stage clock of every timed launch (rows.StageRow).
- ``persistent_barriers``: µs and cycles per barrier (__syncthreads, grid.sync, cluster.sync).
- ``persistent_sanitizer``, ``persistent_ncu`` (gpu profile, where the tools exist):
  compute-sanitizer over every variant; ncu stall reasons and shared-memory wavefronts.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from decodelab.core.device import require_cuda
from decodelab.core.profiles import PROFILES, measured_device
from decodelab.core.results import write_table
from decodelab.core.validate import check_choice
from decodelab.persistent import kernel, measure, model, validation
from decodelab.persistent import profile as tools
from decodelab.persistent.rows import (
    NO_TIMING,
    Clock,
    Launch,
    Model,
    PersistentRow,
    Shape,
    StageRow,
    Timing,
    Validation,
)
from decodelab.persistent.sweep import PersistentBenchConfig, launch_configs
from decodelab.toy import step as toy


def _shape(sweep: str, cfg: toy.ToyConfig) -> Shape:
    return Shape(sweep, cfg.hidden, cfg.layers, cfg.batch, cfg.vocab, cfg.flops_per_step)


def stage_names(layers: int) -> list[str]:
    return [f"layer_{i}" for i in range(layers)] + ["output", "token"]


def _model(cfg: toy.ToyConfig, launch: Launch, clock: Clock, stages, barriers) -> Model:
    """Both latency models of one launch; ``stages`` (L + 2, 2) work/wait cycles per step."""
    exchange = kernel.exchange_of(launch.variant)
    size = launch.blocks if exchange == "grid" else launch.group
    bar = model.barrier_for(barriers, exchange, launch.threads, size)
    bar_us = model.barrier_for(barriers, exchange, launch.threads, size, "us")
    n_bar = cfg.layers + 1
    cycles = (model.stage_model_cycles([float(w) for w in stages[:, 0]], n_bar, bar)
              if stages is not None else float("nan"))
    return Model(n_bar, bar_us, bar, cycles, cycles / clock.sm_clock_ghz * 1e-3,
                 model.relative_error(cycles, clock.cycles_per_step),
                 model.peak_model_cycles(n_bar, bar, cfg.flops_per_step, launch.blocks))


def _validated_timing(w, x0, ref, kcfg, plan: PersistentBenchConfig):
    """Validate (with and without the stop token), then time; raises on any failure."""
    stop = validation.stop_token_for(ref)
    check = validation.validate(w, x0, ref, kcfg)
    stop_check = validation.validate(w, x0, ref, kcfg, stop=stop) if check.ok else check
    if not (check.ok and stop_check.ok):
        raise AssertionError(f"{check.describe()}; with stop token {stop}: {stop_check.describe()}")
    n_steps = measure.steps_for(w, x0, kcfg, plan.target_launch_s)
    timing, clock, stages = measure.measure_variant(w, x0, kcfg, n_steps, plan.repeats)
    return timing, clock, stages, Validation(True, "", plan.n_validate, stop, check.max_state_err,
                                            check.state_tol)


def variant_rows(sweep: str, cfg: toy.ToyConfig, w, x0, ref, plan: PersistentBenchConfig,
                 barriers, build_s: float) -> tuple[list[PersistentRow], list[StageRow]]:
    rows, stage_rows = [], []
    for kcfg in launch_configs(sweep, cfg, kernel.cluster_available()):
        p = kernel.plan(cfg, kcfg)
        if not p.ok or (sweep != "named" and "global" in (p.w_place, p.wout_place)):
            print(f"[persistent] {kcfg.variant} T={kcfg.threads} {cfg}: not run "
                  f"({p.why or 'weights in global memory'})", flush=True)
            continue
        launch = Launch(kcfg.variant, kcfg.threads, p.group, p.blocks, 0, p.weights,
                        p.lanes_layer, p.rounds_layer, p.lanes_out, p.rounds_out)
        try:
            timing, clock, stages, valid = _validated_timing(w, x0, ref, kcfg, plan)
        except Exception as exc:  # noqa: BLE001 - a failed variant is recorded, the rest go on
            error = f"{type(exc).__name__}: {exc}"[:300]
            print(f"[persistent] {kcfg} {cfg}: NOT VALIDATED, not timed ({error})", flush=True)
            timing, clock, stages, valid = NO_TIMING, Clock(), None, Validation(False, error)
        rows.append(PersistentRow.of(_shape(sweep, cfg), launch, timing, clock, valid,
                                     _model(cfg, launch, clock, stages, barriers), build_s))
        if stages is not None:
            stage_rows += [StageRow(sweep, cfg.hidden, cfg.layers, cfg.batch, cfg.vocab,
                                    kcfg.variant, kcfg.threads, p.group, name, i,
                                    float(stages[i, 0]), float(stages[i, 1]))
                           for i, name in enumerate(stage_names(cfg.layers))]
    return rows, stage_rows


def graph_rows(sweep: str, cfg: toy.ToyConfig, w, x0, ref, plan: PersistentBenchConfig,
               build_s: float) -> list[PersistentRow]:
    k1 = measure.measure_graph(w, x0, ref, 1, plan.repeats)
    multi = [(k, measure.measure_graph(w, x0, ref, k, plan.repeats)) for k in plan.graph_ks]
    best_k, best = min(multi, key=lambda kv: kv[1].us_per_step)
    timings: list[tuple[str, int, Timing]] = [("graph_k1", 1, k1), ("graph_best", best_k, best)]
    return [PersistentRow.of(_shape(sweep, cfg), Launch(name, k_steps=k), timing,
                             validation=Validation(True, "", k), build_s=build_s)
            for name, k, timing in timings]


def shape_pass(plan: PersistentBenchConfig, t0: float, barriers, build_s: float):
    """Rows of every shape until the plan's time budget is spent; the shapes skipped."""
    rows: list[PersistentRow] = []
    stages: list[StageRow] = []
    skipped = []
    for sweep, cfg in plan.shapes:
        label = f"{sweep}:H{cfg.hidden}L{cfg.layers}B{cfg.batch}"
        if time.perf_counter() - t0 > plan.budget_s:
            skipped.append(label)
            continue
        print(f"[persistent] {label} at {time.perf_counter() - t0:.1f} s", flush=True)
        w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
        ref = toy.run_eager(w, x0, plan.n_validate)
        got, got_stages = variant_rows(sweep, cfg, w, x0, ref, plan, barriers, build_s)
        rows += got + graph_rows(sweep, cfg, w, x0, ref, plan, build_s)
        stages += got_stages
    return rows, stages, skipped


def run_bench(profile_name: str, out_dir: Path) -> list[Path]:
    from decodelab.core.device import collect_info
    from decodelab.core.kernel_build import load_persistent

    t0 = time.perf_counter()
    device = collect_info()  # before any kernel runs: a sticky fault later cannot hide the device
    built = load_persistent()
    print(f"[persistent] kernels for {built.arch}: {built.build_s:.1f} s "
          f"({'cached' if built.cached else 'compiled'})", flush=True)
    plan = PersistentBenchConfig.for_profile(profile_name)
    attrs = kernel.device_attrs()
    warm = measure.warm_up()
    print(f"[persistent] warm-up {warm['seconds']:.2f} s: SM clock {warm['sm_clock_ghz']:.2f} GHz",
          flush=True)
    barriers = measure.measure_barriers(attrs["sms"])
    bar_dicts = [dataclasses.asdict(b) for b in barriers]
    rows, stages, skipped = shape_pass(plan, t0, bar_dicts, built.build_s)
    if skipped:
        print(f"[persistent] not measured (time budget): {', '.join(skipped)}", flush=True)
    config = {"plan": plan, "device_attrs": attrs, "warm_up": warm, "arch": built.arch,
              "library": built.path.name, "build_s": built.build_s, "build_cached": built.cached,
              "skipped": skipped}

    def table(name: str, table_rows) -> list[Path]:
        return [write_table(name, table_rows, out_dir=out_dir, config=config,
                            profile=profile_name, info=device)] if table_rows else []

    paths = table("persistent", rows) + table("persistent_stages", stages)
    paths += table("persistent_barriers", barriers)
    if profile_name == "gpu":
        check = load_persistent(check=True).path
        paths += table("persistent_sanitizer", tools.run_sanitizer(check, timeout_s=120))
        paths += table("persistent_ncu", tools.run_ncu(check, timeout_s=150))
    print(f"[persistent] bench done in {time.perf_counter() - t0:.1f} s", flush=True)
    return paths


def bench(profile: str, out_dir: Path) -> list[Path]:
    """Validate every variant, then measure and write the phase-3 tables."""
    check_choice("bench", "profile", profile, PROFILES)
    measured_device(profile)  # gpu without CUDA: refused as in every phase
    require_cuda("running the persistent kernels")
    return run_bench(profile, Path(out_dir))
