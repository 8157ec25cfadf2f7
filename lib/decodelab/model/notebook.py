"""Notebook 04_model: its parameters, the local run, and the prose built from the paged-model
tables (every number computed by :mod:`decodelab.model.analysis`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from decodelab.core.params import ModelParams as BaseParams
from decodelab.core.params import param
from decodelab.model import analysis, floors
from decodelab.model.modes import COMPILED, OURS, SERIAL
from decodelab.model.pdl_policy import MAX_ROWS as PDL_MAX_ROWS

TABLES = ("paged_model", "paged_model_kernels", "paged_model_linear", "paged_model_gemm",
          "paged_attention", "environment")  # environment: the read ceiling of the floors


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 04_model (``profile``, ``interactive`` and ``dtype`` come from
    the base)."""

    NOTEBOOK: ClassVar[str] = "04_model"

    run_bench: bool = param(True, "measure this machine (GPU: Llama-3.2-1B shapes, sized to "
                                  "its memory; CPU: the tiny model)")
    batch: int = param(1, "batch the prose reads the step at", low=1, high=4096)
    context: int = param(512, "tokens of context the prose reads the step at", low=1,
                         high=1 << 20)


def run_local_bench(params: NotebookParams) -> list[Path]:
    from decodelab.core import paths
    from decodelab.model.bench import bench

    return bench(params.profile, paths.local_dir(), params.dtype) if params.run_bench else []


def load_tables() -> dict[str, pd.DataFrame]:
    """Every stored copy (shipped reference and this machine) of the paged-model tables."""
    from decodelab.core.results import stored_tables

    return stored_tables(TABLES)


def _label(origin: str) -> str:
    from decodelab.core.results import origin_label

    return origin_label(origin)


def step_prose(pm: pd.DataFrame, batch: int, context: int) -> str:
    """Per origin: the step at (batch, context) against its HBM floor, eager against graph,
    and how the share of the roofline moves from the smallest to the largest batch."""
    lines = []
    for origin in dict.fromkeys(pm["origin"]):
        b, c, moved = _nearest_point(pm, origin, batch, context)
        graph = analysis.point(pm, origin, "graph", b, c)
        eager = analysis.point(pm, origin, "eager", b, c)
        fast = graph if graph is not None else eager
        if fast is None:
            continue
        floor = float(analysis.floor_ms(fast))
        text = (f"- **{_label(origin)}**, `{fast['model']}` ({fast['dtype']}), batch {b}, "
                f"context {c}{moved}: the {fast['mode']} step takes {fast['ms_per_step']:.3g} ms "
                f"({fast['tokens_per_s']:,.0f} tokens/s), **{fast['roofline_fraction']:.0%} of "
                f"the roofline**: its {fast['bytes_per_step'] / 1e9:.3g} GB at the "
                f"{fast.get('ceiling') or 'copy bandwidth'} "
                f"({float(floors.ceiling_gb_s(fast)):,.0f} GB/s) need {floor:.3g} ms.")
        if graph is not None and eager is not None:
            text += (f" Eager takes {eager['ms_per_step']:.3g} ms, "
                     f"{eager['ms_per_step'] / graph['ms_per_step']:.1f}x the graph: the "
                     "host issuing kernels one by one, the dispatch layer.")
        lines.append(text + _batch_trend(pm, origin, fast["mode"], context))
    return "\n".join(lines)


def _nearest_point(pm: pd.DataFrame, origin: str, batch: int, context: int
                   ) -> tuple[int, int, str]:
    """(batch, context) to read an origin at: the asked point when measured, else its smallest
    measured batch at its shortest context, with a note saying so."""
    ours = pm[(pm["origin"] == origin) & pm["mode"].isin(OURS)]
    if ((ours["batch"] == batch) & (ours["context"] == context)).any() or ours.empty:
        return batch, context, ""
    c = int(ours["context"].min())
    b = int(ours[ours["context"] == c]["batch"].min())
    return b, c, f" (batch {batch} at context {context} not measured here)"


def _batch_trend(pm: pd.DataFrame, origin: str, mode: str, context: int) -> str:
    rows = analysis.step_view(pm)
    rows = rows[(rows["origin"] == origin) & (rows["mode"] == mode)
                & (rows["context"] == context)].sort_values("batch")
    if len(rows) < 2:
        return ""
    lo, hi = rows.iloc[0], rows.iloc[-1]
    text = (f" From batch {lo['batch']} to {hi['batch']} the step grows "
            f"{hi['ms_per_step'] / lo['ms_per_step']:.1f}x while its bytes grow "
            f"{hi['floor_ms'] / lo['floor_ms']:.1f}x, so the share of the roofline goes from "
            f"{lo['roofline_fraction']:.0%} to {hi['roofline_fraction']:.0%}")
    if hi["roofline_fraction"] < lo["roofline_fraction"]:
        text += ": the larger the batch, the less of the step is reading the weights"
    return text + "."


def peers_prose(vs: pd.DataFrame) -> str:
    """One line per origin and batch: our step's tokens/s against transformers' faster cache."""
    if vs.empty:
        return "transformers was not timed here (it is an optional dependency)."
    return "\n".join(
        f"- {_label(r['origin'])}, batch {r['batch']}, context {r['context']}: ours "
        f"({r['ours']}) {r[r['ours']]:,.0f} tokens/s, transformers' generate "
        f"{r[r['best_peer']]:,.0f} tokens/s with `{r['best_peer']}` (the faster of its two "
        f"caches): **{r['speedup']:.1f}x**." for _, r in vs.iterrows())


def boundary_prose(effect: pd.DataFrame) -> str:
    """Per origin: what removing the kernel boundaries' drain-and-launch gaps (PDL) saved, at
    the smallest batch of the shortest context and across every point that used it; points
    whose graph step launched serially too give the run-to-run spread instead."""
    if effect.empty:
        return ("No step without programmatic dependent launch was timed here (it needs "
                "sm_90 or newer): the boundary layer is not separated.")
    lines = []
    for origin, sel in effect.groupby("origin", sort=False):
        used, serial = sel[sel["pdl"]], sel[~sel["pdl"]]
        parts = []
        if not used.empty:
            first = used.sort_values(["context", "batch"]).iloc[0]
            parts.append(
                f"at batch {first['batch']}, context {first['context']}, the step without PDL "
                f"takes {first[SERIAL + '_ms']:.3g} ms and with it "
                f"{first['ms_per_step']:.3g} ms: **{first['saved_us']:.0f} µs saved**, from "
                f"{first['roofline_before']:.0%} to {first['roofline_after']:.0%} of the "
                "roofline. " + _boundary_range(used))
        if not serial.empty:
            spread = serial["saved_us"].abs()
            batches = ", ".join(str(b) for b in sorted(set(serial["batch"])))
            parts.append(
                f"At batch {batches} the step launches its kernels serially either way (PDL is "
                f"used up to {PDL_MAX_ROWS} rows): the two timings differ by "
                f"{spread.min():.0f}-{spread.max():.0f} µs, the run-to-run spread of the same "
                "kernels.")
        lines.append(f"- {_label(origin)}: " + " ".join(parts))
    return "\n".join(lines)


def table_edits(name: str) -> list[str]:
    """What the metadata of each stored copy of table ``name`` says was changed after its run
    (the ``edited`` field), labelled by origin."""
    from decodelab.core.results import read_meta, table_files

    notes = []
    for origin, path in table_files(name):
        try:
            edited = read_meta(path).get("edited")
        except (FileNotFoundError, ValueError):
            continue
        if edited:
            notes.append(f"{_label(origin)}: {edited}")
    return notes


def _boundary_range(sel: pd.DataFrame) -> str:
    lo, hi = sel.loc[sel["saved_us"].idxmin()], sel.loc[sel["saved_us"].idxmax()]
    text = (f"Across the {len(sel)} points the saving ranges from {lo['saved_us']:.0f} µs "
            f"(batch {lo['batch']}, context {lo['context']}) to {hi['saved_us']:.0f} µs (batch "
            f"{hi['batch']}, context {hi['context']})")
    if lo["saved_us"] < 0:
        text += (": where a few long kernels fill the step, PDL costs time instead (not "
                 "profiled further; a likely cause is successors that become resident early "
                 "and hold SM slots while they wait)")
    return text + "."


def compiled_prose(vs: pd.DataFrame, edits: list[str] = ()) -> str:
    """One line per point where ``compile_static`` was timed: its step against ours; without
    any, why (including what the tables' metadata say was removed)."""
    if vs.empty:
        return "\n".join([
            "`compile_static` was not timed in these tables (it is measured on a GPU, at the "
            "points its configuration names).", *(f"- {e}" for e in edits)])
    return "\n".join(
        f"- {_label(r['origin'])}, batch {r['batch']}, context {r['context']}: "
        f"`compile_static` {r[COMPILED + '_ms']:.3g} ms per step (after "
        f"{r['compile_s']:.0f} s of compilation), ours {r['ms_per_step']:.3g} ms: "
        f"**{r['speedup']:.2f}x**." for _, r in vs.iterrows())


def kernel_prose(profile: pd.DataFrame) -> str:
    """Per origin: how much of the step the matmuls and attention take and the rate each
    reached against the copy bandwidth."""
    lines = []
    for origin, sel in profile.groupby("origin", sort=False):
        total = sel["us_per_step"].sum()
        mm = sel[sel["role"].str.startswith("matmul")]
        attn = sel[sel["role"] == "attention"]
        parts = [f"- {_label(origin)} (batch {int(sel['batch'].iloc[0])}, context "
                 f"{int(sel['context'].iloc[0])}): {len(sel)} distinct kernels, "
                 f"{sel['calls_per_step'].sum():,.0f} launches, {total:,.0f} µs per step."]
        if not mm.empty:
            rate = mm["bytes_per_step"].sum() / (mm["us_per_step"].sum() * 1e-6) / 1e12
            copy = (mm["tb_s"] / mm["of_ceiling"]).dropna()
            share = (f" = {rate / copy.iloc[0]:.0%} of the {mm['ceiling'].iloc[0]}" if len(copy)
                     else "")
            parts.append(f"The matmuls take {mm['us_per_step'].sum() / total:.0%} of it and "
                         f"read the weights at {rate:.2f} TB/s{share}.")
        if not attn.empty:
            slow = attn["of_ceiling"].iloc[0] < 0.25
            parts.append(f"Attention takes {attn['us_per_step'].sum() / total:.0%} and reads "
                         f"its K/V at {attn['tb_s'].iloc[0]:.2f} TB/s "
                         f"({attn['of_ceiling'].iloc[0]:.0%} of the {attn['ceiling'].iloc[0]})"
                         + (": at this context it is bound by latency, not bytes." if slow
                            else "."))
        noted = sel[sel["note"] != ""]
        parts += [f"`{r['name']}`: {r['note']}." for _, r in noted.iterrows()]
        lines.append(" ".join(parts))
    return "\n".join(lines)


def headroom_prose(headroom: pd.DataFrame, profile: pd.DataFrame | None = None) -> str:
    """Per origin: the batch-1 matmuls' time per step against their weights' floor, the
    weights that hold most of the difference, and the range of the difference per call; with
    the kernel profile (:func:`analysis.kernel_profile`), the same matmuls' time inside one
    profiled step beside the plan's, and why the two differ."""
    lines = []
    for origin, sel in headroom.groupby("origin", sort=False):
        took = (sel["calls_per_step"] * sel["us"]).sum()
        floor = (sel["calls_per_step"] * sel["floor_us"]).sum()
        top = sel.sort_values("above_us", ascending=False).head(2)
        layer = sel[sel["calls_per_step"] > 1]  # one call per layer: qkv, o, gate_up, down
        per_call = layer["us"] - layer["floor_us"]
        faster = sel[sel["above_us"] < 0]
        lines.append(
            f"- {_label(origin)}: as the matmul plan timed them (back to back inside a graph), "
            f"the batch-1 matmuls take {took:,.0f} µs per step where their weights need "
            f"{floor:,.0f} µs at the {sel['ceiling'].iloc[0]}: **{took - floor:,.0f} µs above "
            "the floor**, most of it in "
            + " and ".join(f"`{r['weight']}` ({r['above_us']:,.0f} µs over "
                           f"{r['calls_per_step']:g} calls)" for _, r in top.iterrows())
            + f". Per call, a layer's matmuls sit {per_call.min():.2f} to {per_call.max():.2f} "
            "µs above their floor"
            + "".join(f"; `{r['weight']}` runs {-r['above_us']:,.0f} µs under it (the copy "
                      "bandwidth stands in for a read ceiling here: a read-only kernel can "
                      "outrun the copy, which also writes every byte it reads)"
                      for _, r in faster.iterrows())
            + "." + _plan_vs_profile(took, origin, profile))
    return "\n".join(lines)


def _plan_vs_profile(took: float, origin: str, profile: pd.DataFrame | None) -> str:
    """The plan's matmul time beside the same matmuls' time in the profiled step: two
    measurements of one quantity, and what each includes."""
    if profile is None or profile.empty:
        return ""
    mm = profile[(profile["origin"] == origin) & profile["role"].str.startswith("matmul")]
    if mm.empty or int(mm["batch"].iloc[0]) != 1:
        return ""
    in_step = float(mm["us_per_step"].sum())
    return (f" These are the plan's timings: each shape alone, back to back inside a graph, "
            "with programmatic dependent launch where the step uses it, cycling weight copies "
            f"larger than the L2 cache. In the profiled step (the kernel table above) the same "
            f"matmuls take {in_step:,.0f} µs, {in_step - took:,.0f} µs more: that step is "
            "launched without PDL, so each kernel starts only after the one before has "
            "drained and fetches its first weight tile from nothing, and the profile counts "
            "that start in the kernel's time. What PDL takes off the whole step is measured "
            "in the kernel-boundary section.")


def attention_prose(marginal: pd.DataFrame) -> str:
    """Per origin: the K/V read rate at long context, at the smallest and largest batch."""
    lines = []
    for origin, sel in marginal.groupby("origin", sort=False):
        sel = sel.sort_values("batch")
        lo, hi = sel.iloc[0], sel.iloc[-1]
        lines.append(
            f"- {_label(origin)}: from context {lo['context_short']} to {lo['context_long']}, "
            f"the extra K/V is read at {lo['kv_tb_s']:.2f} TB/s ({lo['of_ceiling']:.0%} of the "
            f"{lo['ceiling']}) at batch {lo['batch']} and {hi['kv_tb_s']:.2f} TB/s "
            f"({hi['of_ceiling']:.0%}) at batch {hi['batch']}, where K/V is "
            f"{hi['kv_share_long']:.0%} of the step's bytes"
            + (": at long context and large batch attention, not the weights, sets the step."
               if hi["kv_share_long"] > 0.5 else ".")
            + (" Above 100% of the copy bandwidth: a read-only stream can run faster than a "
               "copy, which moves every byte twice; no read ceiling was measured for this "
               "origin yet." if sel["of_ceiling"].max() > 1 and hi["ceiling"] != "read ceiling"
               else ""))
    return "\n".join(lines) or "Only one context measured: no long-context comparison."


def capture_prose(capture: pd.DataFrame) -> str:
    return "\n".join(
        f"- {_label(r['origin'])}, `{r['model']}`: capturing the decode graphs (buckets "
        f"{r['buckets']}) takes {r['capture_s']:.2f} s once and holds "
        f"{r['graph_mem_mib']:,.0f} MiB of graph memory." for _, r in capture.iterrows()
    ) or "No graph was captured here (CUDA graphs need a GPU)."
