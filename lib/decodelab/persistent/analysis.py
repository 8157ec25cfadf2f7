"""Phase 3's tables become numbers: the seed comparison and the clock summary."""

from __future__ import annotations

import pandas as pd

from decodelab.core.seed import quoted
from decodelab.persistent.kernel import VARIANTS
from decodelab.toy import step as toy

# The seed study's persistent-kernel claims (steps/s), read from the one place quotations live.
SEED_CLAIMS = {"ultra-light": quoted("persistent_ultra_light"),
               "h256": quoted("persistent_h256")}
# This project's targets on the H200 (issue text): steps/s and ratio to the 1-step graph.
TARGETS = {"ultra-light": (2.0e6, 30.0), "h256": (500e3, None)}


def seed_comparison(frame: pd.DataFrame) -> pd.DataFrame:
    """Per named config and origin: the seed's claim, our fastest persistent variant, the 1-step
    graph replay on the same shape, and the targets."""
    out = []
    for name, claim in SEED_CLAIMS.items():
        cfg = toy.named(name)
        shape = ((frame["hidden"] == cfg.hidden) & (frame["layers"] == cfg.layers)
                 & (frame["batch"] == cfg.batch) & (frame["vocab"] == cfg.vocab))
        for origin, sub in frame[shape].groupby("origin" if "origin" in frame else "device"):
            kernels = sub[sub["variant"].isin(VARIANTS)].dropna(subset=["steps_per_s"])
            if "validated" in kernels:  # a failed variant has a row but no timing
                kernels = kernels[kernels["validated"].astype(str) == "True"]
            graph = sub[sub["variant"] == "graph_k1"]["steps_per_s"]
            if kernels.empty:
                continue
            best = kernels.loc[kernels["steps_per_s"].idxmax()]
            target, ratio_target = TARGETS[name]
            ratio = best["steps_per_s"] / graph.max() if len(graph) else float("nan")
            out.append({"config": name, "origin": origin, "seed_steps_per_s": claim,
                        "best_variant": best["variant"], "steps_per_s": best["steps_per_s"],
                        "graph_k1_steps_per_s": graph.max() if len(graph) else float("nan"),
                        "x_graph_k1": ratio, "target_steps_per_s": target,
                        "target_x_graph_k1": ratio_target,
                        "meets_target": bool(best["steps_per_s"] >= target and
                                             (ratio_target is None or ratio >= ratio_target))})
    return pd.DataFrame(out)


def clock_summary(frame: pd.DataFrame, barriers: pd.DataFrame | None) -> str:
    """Markdown: the SM clock the kernels ran at (their own clock64 / globaltimer), cycles per
    step against the model's cycles on the named configs, and variants that failed validation."""
    if "cycles_per_step" not in frame or frame["cycles_per_step"].isna().all():
        return "These results carry no in-kernel clock (recorded before the run clock existed)."
    kernels = frame[frame["variant"].isin(VARIANTS)].dropna(subset=["cycles_per_step"])
    lines = []
    for origin, sub in kernels.groupby("origin" if "origin" in kernels else "device"):
        ghz = sub["sm_clock_ghz"]
        line = (f"- {origin}: SM clock during the persistent runs {ghz.median():.2f} GHz "
                f"(median; {ghz.min():.2f}–{ghz.max():.2f} over {len(sub)} runs)")
        if barriers is not None and "sm_clock_ghz" in barriers:
            same = barriers[barriers["origin"] == origin] if "origin" in barriers else barriers
            bar = same["sm_clock_ghz"].dropna()
            if len(bar):
                line += f"; during the barrier microbenchmarks {bar.median():.2f} GHz"
        lines.append(line + ".")
        for name in SEED_CLAIMS:
            cfg = toy.named(name)
            shape = sub[(sub["hidden"] == cfg.hidden) & (sub["layers"] == cfg.layers)
                        & (sub["batch"] == cfg.batch) & (sub["vocab"] == cfg.vocab)]
            if shape.empty:
                continue
            best = shape.loc[shape["us_per_step"].idxmin()]
            lines.append(f"  - {name}: fastest {best['variant']} ({best['threads']} threads, "
                         f"{best['blocks']} blocks) {best['us_per_step']:.3f} µs/step = "
                         f"{best['cycles_per_step']:,.0f} cycles/step, model "
                         f"{best['model_cycles']:,.0f} cycles "
                         f"({best['cycles_per_step'] / best['model_cycles']:.1f}× the model).")
    if "validated" in frame:
        failed = frame[frame["variant"].isin(VARIANTS) & (frame["validated"].astype(str) != "True")]
        for row in failed.itertuples():
            lines.append(f"- not validated, not timed: {row.variant} at H={row.hidden} "
                         f"L={row.layers} B={row.batch} ({row.error}).")
    return "\n".join(lines)
