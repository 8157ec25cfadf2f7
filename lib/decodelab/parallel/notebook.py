"""Notebook 06_multi_gpu: its parameters, a local run, and the prose built from the tables.

The local run spawns its own ranks (no torchrun needed in a notebook): two NCCL ranks on a
machine with two or more GPUs and the ``gpu`` profile, else two gloo ranks on the CPU running
the tiny model (a correctness-and-mechanics run: TP=2's logits are checked against TP=1's; its
timings say what gloo costs, not what NVLink does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from decodelab.core.params import ModelParams as BaseParams
from decodelab.core.params import param

__all__ = ["NotebookParams", "collectives_prose", "crossover_prose", "load_tables", "local_plan",
           "local_check_prose", "profile_prose", "run_local_bench", "split_timed"]

TABLES = ("tp", "tp_collectives", "tp_profile")


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 06_multi_gpu (``profile``, ``interactive`` and ``dtype`` come from
    the base)."""

    NOTEBOOK: ClassVar[str] = "06_multi_gpu"

    run_bench: bool = param(True, "run the two-rank bench here (False: stored results only)")


def local_plan(profile: str) -> tuple[str, str]:
    """(bench profile, backend) this machine can run: NCCL across GPUs only with the ``gpu``
    profile and two or more GPUs; otherwise gloo on the CPU (``smoke`` stays ``smoke``). ``gpu``
    without CUDA is refused (:func:`~decodelab.core.profiles.measured_device`); with one GPU,
    two ranks cannot each have one, and the CPU run stands in."""
    import torch

    from decodelab.core.profiles import measured_device

    if measured_device(profile) == "cuda" and torch.cuda.device_count() >= 2:
        return "gpu", "nccl"
    return ("smoke" if profile == "smoke" else "cpu"), "gloo"


def _bench_on_rank(world, profile: str, out_dir: str, dtype: str) -> list[Path]:
    from dataclasses import replace

    from decodelab.parallel.bench import TPBenchConfig, run

    cfg = TPBenchConfig.for_profile(profile)
    return run(replace(cfg, dtype=dtype if world.device.type == "cuda" else cfg.dtype), world,
               Path(out_dir))


def run_local_bench(params: NotebookParams, ranks: int = 2) -> list[Path]:
    from decodelab.core import paths
    from decodelab.parallel.check import run_on_ranks

    if not params.run_bench:
        return []
    profile, backend = local_plan(params.profile)
    return run_on_ranks(_bench_on_rank, ranks, profile, str(paths.local_dir()), params.dtype,
                        backend=backend) or []


def load_tables() -> dict[str, pd.DataFrame]:
    """Every stored copy (shipped reference and this machine) of the tensor-parallel tables."""
    from decodelab.core.results import stored_tables

    return stored_tables(TABLES)


def split_timed(tables: dict[str, pd.DataFrame]
                ) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """(rows whose timings mean something, rows from CPU runs): a CPU run's two gloo ranks
    exchange tensors over loopback sockets, so its times measure the socket path and two
    processes sharing a few cores, not a GPU interconnect."""
    timed, cpu = {}, {}
    for name, frame in tables.items():
        on_cpu = (frame["device"].astype(str) == "cpu" if "device" in frame
                  else pd.Series(False, index=frame.index))
        if (~on_cpu).any():
            timed[name] = frame[~on_cpu]
        if on_cpu.any():
            cpu[name] = frame[on_cpu]
    return timed, cpu


def local_check_prose(tp: pd.DataFrame) -> str:
    """What a CPU run does establish: per model, TP=n's logits against TP=1's and whether the
    greedy tokens agree."""
    lines = []
    for (_, model, n), g in tp[tp["tp"] > 1].groupby(["origin", "model", "tp"], sort=False):
        equal = g["tokens_equal_tp1"].astype(str).eq("True").all()
        lines.append(f"- `{model}`, TP={n} against TP=1 on the same weights: largest relative "
                     f"logit difference {g['max_rel_err_vs_tp1'].max():.2g}, greedy tokens "
                     f"{'equal' if equal else 'not all equal'} ({g['dtype'].iloc[0]}).")
    return "\n".join(lines)


def _fmt_batch(b: float) -> str:
    return "not within the measured batches" if pd.isna(b) else f"batch {int(b)}"


def crossover_prose(tp: pd.DataFrame) -> str:
    """One line per origin and model: from which batch TP=n pays off, with the speed-ups."""
    from decodelab.core.results import origin_label
    from decodelab.parallel.analysis import TIE_MARGIN, crossover

    lines = []
    for mode in ("graph", "eager"):
        for r in crossover(tp, mode).itertuples():
            ties = (f"; a tie (within {TIE_MARGIN:.1%}) at batch "
                    f"{', '.join(map(str, r.ties))}" if r.ties else "")
            pays = ("does not pay off **within the measured batches**"
                    if pd.isna(r.pays_off_from) else
                    f"pays off from **{_fmt_batch(r.pays_off_from)}**")
            lines.append(
                f"- {origin_label(r.origin)}, `{r.model}`, {mode}: TP={r.tp} {pays}; speed-up "
                f"{r.speedup_smallest:.2f}x at batch {r.batch_smallest}, "
                f"{r.speedup_largest:.2f}x at batch {r.batch_largest}{ties}.")
    return "\n".join(lines) or "No TP=1 / TP=n pair in the tables yet."


def collectives_prose(coll: pd.DataFrame) -> str:
    from decodelab.core.results import origin_label
    from decodelab.parallel.analysis import peak_bus_bandwidth, small_message_latency

    lat = small_message_latency(coll).set_index(["origin", "mode"])
    peak = peak_bus_bandwidth(coll).set_index(["origin", "mode"])
    lines = []
    for origin in dict.fromkeys(lat.index.get_level_values(0)):
        parts = []
        for mode in ("eager", "graph"):
            if (origin, mode) in lat.index:
                r = lat.loc[(origin, mode)]
                parts.append(f"{mode} {r['us_per_op']:.1f} µs (host {r['host_us_per_op']:.1f} µs)")
        line = f"- {origin_label(origin)}: all-reduce up to 64 KiB, median " + ", ".join(parts)
        if (origin, "graph") in peak.index:
            p = peak.loc[(origin, "graph")]
            line += (f"; peak bus bandwidth {p['busbw_gb_s']:.0f} GB/s at "
                     f"{p['nbytes'] / 2**20:.0f} MiB")
        lines.append(line + ".")
    return "\n".join(lines)


def profile_prose(profile: pd.DataFrame, tp: pd.DataFrame | None = None) -> str:
    """Per origin and mode: each rank's NCCL all-reduce kernel time and process-group host
    call per collective, from ``tp_profile``; how long one profiled step took (the profiler
    slows every launch) beside the same step timed without it (table ``tp``), so that a sum
    over the profiled step is never read against the timed one; and which rank waits."""
    from decodelab.core.results import origin_label
    from decodelab.parallel.analysis import collective_ops

    ops = collective_ops(profile)
    lines = []
    for (origin, model, mode), g in ops.groupby(["origin", "model", "mode"], sort=False):
        parts, waits = [], {}
        for rank, r in g.groupby("rank"):
            ar = r[r["op"].str.startswith("ncclDevKernel_AllReduce")]
            kernel = ar["device_us_per_call"]
            host = r[r["op"] == "c10d::allreduce_"]["host_us_per_call"]
            text = f"rank {rank}: NCCL all-reduce kernel {kernel.sum():.1f} µs"
            if not host.empty:
                text += f", host call {host.sum():.1f} µs"
            parts.append(text)
            waits[rank] = float((ar["device_us_per_call"] * ar["calls_per_step"]).sum())
        lines.append(f"- {origin_label(origin)}, `{model}`, {mode}, per all-reduce: "
                     + "; ".join(parts) + "." + _profiled_step(profile, tp, origin, model,
                                                               mode, waits))
    return "\n".join(lines)


def _profiled_step(profile: pd.DataFrame, tp: pd.DataFrame | None, origin: str, model: str,
                   mode: str, waits: dict) -> str:
    """One profiled step's length (the profiler's step range on the device, the longest rank)
    against the same step timed without the profiler, and the rank whose all-reduce kernels
    hold most of it (they wait for the other rank to arrive)."""
    p = profile if "origin" in profile else profile.assign(origin="local")
    sel = p[(p["origin"] == origin) & (p["model"] == model) & (p["mode"] == mode)
            & p["op"].str.startswith("ProfilerStep")]
    if sel.empty:
        return ""
    step_us = float(sel["device_us_per_step"].max())
    text = f" One profiled step takes {step_us / 1e3:.3g} ms on the device"
    if tp is not None:
        t = tp if "origin" in tp else tp.assign(origin="local")
        timed = t[(t["origin"] == origin) & (t["model"] == model) & (t["mode"] == mode)
                  & (t["tp"] > 1) & (t["batch"] == 1)]
        if not timed.empty:
            ms = float(timed["ms_per_step"].iloc[0])
            text += f", the same step timed without the profiler {ms:.3g} ms"
            if step_us > 1.2e3 * ms:
                text += (": the profiler's hooks slow every launch, so these kernel times are "
                         "shares of the profiled step, not of the timed one")
    rank, most = max(waits.items(), key=lambda kv: kv[1])
    if most > 0.5 * step_us:
        text += (f". Rank {rank}'s all-reduce kernels add up to {most / 1e3:.3g} ms of it: "
                 "each waits on the device for the other rank's matching kernel, whose host "
                 "issues it later")
    return text + "."
