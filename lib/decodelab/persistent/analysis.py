"""Phase 3's tables become numbers: the seed comparison, the latency model's check, the stage
breakdown and the clock summary (pandas, no torch)."""

from __future__ import annotations

import pandas as pd

from decodelab.core.seed import quoted
from decodelab.toy import step as toy

KERNEL_PREFIXES = ("block_", "grid_", "cluster_")
NAMED = ("ultra-light", "h256")
# This project's targets on the H200: steps/s and ratio to the single-step graph replay.
TARGETS = {"ultra-light": (2.1e6, 30.0), "h256": (500e3, None)}
MODEL_TOLERANCE = 0.25  # the stage model must land within 25% of the measured cycles


def seed_claims() -> dict[str, float]:
    """The seed study's persistent-kernel claims (steps/s), read where quotations live."""
    return {"ultra-light": quoted("persistent_ultra_light"), "h256": quoted("persistent_h256")}


def _origin_col(frame: pd.DataFrame) -> str:
    return "origin" if "origin" in frame else "device"


def _shape(frame: pd.DataFrame, name: str) -> pd.Series:
    cfg = toy.named(name)
    return ((frame["hidden"] == cfg.hidden) & (frame["layers"] == cfg.layers)
            & (frame["batch"] == cfg.batch) & (frame["vocab"] == cfg.vocab))


def kernels(frame: pd.DataFrame) -> pd.DataFrame:
    """Persistent-kernel rows that were validated and timed (not the graph peers)."""
    rows = frame[frame["variant"].astype(str).str.startswith(KERNEL_PREFIXES)]
    rows = rows.dropna(subset=["steps_per_s"])
    if "validated" in rows:
        rows = rows[rows["validated"].astype(str) == "True"]
    return rows


def seed_comparison(frame: pd.DataFrame) -> pd.DataFrame:
    """Per named config and origin: the seed's claim, our fastest variant, the single-step graph
    replay on the same shape, and the targets."""
    out = []
    for name, claim in seed_claims().items():
        for origin, sub in frame[_shape(frame, name)].groupby(_origin_col(frame)):
            timed = kernels(sub)
            graph = sub[sub["variant"] == "graph_k1"]["steps_per_s"]
            if timed.empty:
                continue
            best = timed.loc[timed["steps_per_s"].idxmax()]
            target, ratio_target = TARGETS[name]
            ratio = best["steps_per_s"] / graph.max() if len(graph) else float("nan")
            out.append({"config": name, "origin": origin, "seed_steps_per_s": claim,
                        "best_variant": best["variant"], "threads": best["threads"],
                        "group": best["group"], "steps_per_s": best["steps_per_s"],
                        "graph_k1_steps_per_s": graph.max() if len(graph) else float("nan"),
                        "x_graph_k1": ratio, "target_steps_per_s": target,
                        "target_x_graph_k1": ratio_target,
                        "meets_target": bool(best["steps_per_s"] >= target and
                                             (ratio_target is None or ratio >= ratio_target))})
    return pd.DataFrame(out)


def model_check(frame: pd.DataFrame, named_only: bool = True) -> pd.DataFrame:
    """Measured cycles per step against the stage model (and the peak model) per launch."""
    rows = kernels(frame).dropna(subset=["cycles_per_step", "model_cycles"])
    if named_only:
        rows = rows[_shape(rows, NAMED[0]) | _shape(rows, NAMED[1])]
    out = rows[["hidden", "variant", "threads", "group", "cycles_per_step",
                "clocked_cycles_per_step", "model_cycles", "model_err", "peak_model_cycles"]].copy()
    if _origin_col(rows) in rows:
        out.insert(0, "origin", rows[_origin_col(rows)])
    out["within_25pct"] = out["model_err"].abs() <= MODEL_TOLERANCE
    return out.sort_values(["hidden", "cycles_per_step"]).reset_index(drop=True)


def stage_table(stages: pd.DataFrame, name: str) -> pd.DataFrame:
    """One named config's stage clock, a row per launch: work and barrier wait per stage
    (cycles per step) and their sum, fastest launch first."""
    sub = stages[_shape(stages, name)]
    if sub.empty:
        return pd.DataFrame()
    keys = ["variant", "threads", "group"]
    work = sub.pivot_table(index=keys, columns="stage", values="work_cycles", aggfunc="median")
    wait = sub.pivot_table(index=keys, columns="stage", values="wait_cycles", aggfunc="median")
    order = sorted(work.columns, key=lambda s: sub[sub["stage"] == s]["index"].iloc[0])
    wide = pd.concat({f"{s} work": work[s] for s in order} |
                     {f"{s} wait": wait[s] for s in order if s != "token"}, axis=1)
    wide = wide[[c for s in order for c in (f"{s} work", f"{s} wait") if c in wide]]
    wide["total"] = wide.sum(axis=1)
    return wide.sort_values("total").reset_index()


def clock_summary(frame: pd.DataFrame, barriers: pd.DataFrame | None) -> str:
    """Markdown: the SM clock the kernels ran at (their own clock64 / globaltimer), and per named
    config the fastest launch in cycles against the stage model and the peak model."""
    timed = kernels(frame).dropna(subset=["cycles_per_step"])
    if timed.empty:
        return "These results carry no in-kernel clock."
    lines = []
    for origin, sub in timed.groupby(_origin_col(timed)):
        ghz = sub["sm_clock_ghz"]
        line = (f"- {origin}: SM clock during the persistent runs {ghz.median():.2f} GHz "
                f"(median; {ghz.min():.2f}–{ghz.max():.2f} over {len(sub)} runs)")
        if barriers is not None and "sm_clock_ghz" in barriers:
            same = barriers[barriers["origin"] == origin] if "origin" in barriers else barriers
            bar = same["sm_clock_ghz"].dropna()
            if len(bar):
                line += f"; during the barrier microbenchmarks {bar.median():.2f} GHz"
        lines.append(line + ".")
        for name in NAMED:
            shape = sub[_shape(sub, name)]
            if shape.empty:
                continue
            best = shape.loc[shape["cycles_per_step"].idxmin()]
            lines.append(f"  - {name}: fastest {best['variant']} ({best['threads']} threads, "
                         f"{best['group']} blocks per row) {best['us_per_step']:.3f} µs/step = "
                         f"{best['cycles_per_step']:,.0f} cycles/step; stage model "
                         f"{best['model_cycles']:,.0f} ({best['model_err']:+.0%}); peak model "
                         f"{best['peak_model_cycles']:,.0f}.")
    if "validated" in frame:
        failed = frame[frame["variant"].astype(str).str.startswith(KERNEL_PREFIXES)
                       & (frame["validated"].astype(str) != "True")]
        for row in failed.itertuples():
            lines.append(f"- not validated, not timed: {row.variant} at H={row.hidden} "
                         f"L={row.layers} B={row.batch} ({row.error}).")
    return "\n".join(lines)


def stall_table(ncu: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Per profiled launch: cycles per issued instruction, the ``top`` stall reasons (cycles a
    warp waits per issued instruction, by reason) and shared-memory wavefronts per step."""
    keys = ["config", "variant", "threads", "group"]
    wide = ncu.pivot_table(index=keys, columns="metric", values="value", aggfunc="median")
    stalls = [c for c in wide.columns if str(c).startswith("stall_")]
    totals = wide[stalls].mean().sort_values(ascending=False)
    keep = [c for c in ("warp_cycles_per_issued_instruction", "shared_wavefronts_per_step",
                        "shared_bank_conflicts_per_step", "warp_instructions_per_step")
            if c in wide.columns]
    return wide[keep + list(totals.index[:top])].reset_index()


def findings(frame: pd.DataFrame, stages: pd.DataFrame | None, ncu: pd.DataFrame | None) -> str:
    """Markdown, per named config and origin: the fastest launch against its target, its
    costliest stage, the shared-memory wavefronts it issues per step, the model's error."""
    lines = []
    seeds = seed_comparison(frame)
    for row in seeds.itertuples():
        verdict = "meets" if row.meets_target else "misses"
        line = (f"- **{row.config}** ({row.origin}): {row.best_variant} at {row.threads} threads, "
                f"{row.steps_per_s:,.0f} steps/s = {row.x_graph_k1:.1f}x the single-step graph; "
                f"it {verdict} the target of {row.target_steps_per_s:,.0f} steps/s")
        if pd.notna(row.target_x_graph_k1):
            line += f" and {row.target_x_graph_k1:.0f}x the graph"
        line += "."
        if stages is not None and len(stages):
            sub = stages[_shape(stages, row.config) & (stages["variant"] == row.best_variant)
                         & (stages["threads"] == row.threads)]
            if len(sub):
                by_stage = sub.groupby("stage")[["work_cycles", "wait_cycles"]].median()
                cost = by_stage.sum(axis=1)
                share = cost / cost.sum()
                line += (f" Its costliest stage is {share.idxmax()} ({share.max():.0%} of the "
                         f"diagnostic build's step); barrier waits take "
                         f"{by_stage['wait_cycles'].sum() / cost.sum():.0%}.")
        if ncu is not None and len(ncu):
            hit = ncu[(ncu["config"] == row.config) & (ncu["variant"] == row.best_variant)
                      & (ncu["metric"] == "shared_wavefronts_per_step")]
            if len(hit):
                line += (f" It issues {hit['value'].iloc[0]:,.0f} shared-memory wavefronts per "
                         "step (at most one per SM cycle).")
        lines.append(line)
    return "\n".join(lines)
