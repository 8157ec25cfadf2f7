"""The serving tables in words, for notebook 04_runtime: per origin and variant, the offline
runs against their floors, the online sweep's saturation and tail, the offline steps' host
share, the steps slow for their work, how the run's prefill ran and its Triton compiles.
Reads tables only (``bench serve`` writes them)."""

from __future__ import annotations

import pandas as pd


def serve_summary(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown, one line per origin and variant: the offline runs against their floors, where
    the online sweep's TTFT p99 first passed its limit, the half-rate run's inter-token tail,
    the offline steps' host share, how prefill ran and whether a kernel compiled mid-run."""
    from decodelab.core.results import origin_label

    off, on = tables.get("serve_offline"), tables.get("serve_online")
    if off is None:
        return "No serving results are stored yet: run the bench (`run_bench=True`)."
    lines = []
    for (origin, variant), sel in off.groupby(["origin", "variant"], sort=False):
        runs = "; ".join(
            f"`{r.run}` ({r.requests} requests, {r.prompt_tokens:,} prompt and "
            f"{r.output_tokens:,} output tokens): **{r.output_tok_s:,.0f} output tok/s**, "
            f"{r.total_tok_s:,.0f} total tok/s, busy time **{r.ratio_to_floor:.1f}x** its floor"
            for r in sel.itertuples())
        lines.append(f"- **{origin_label(origin)}**, {sel['model'].iloc[0]} {sel['dtype'].iloc[0]}"
                     f", `{variant}` ({sel['max_num_seqs'].iloc[0]} rows): {runs}."
                     + _knee(on, origin, variant) + _tail(on, origin, variant)
                     + _issue(tables.get("serve_steps"), origin, variant)
                     + _slow(tables.get("serve_steps"), origin, variant)
                     + _prefill(sel) + _cold(sel, on, origin, variant))
    return "\n".join(lines)


def _tail(on: pd.DataFrame | None, origin: str, variant: str) -> str:
    """The half-rate run's inter-token latency p99 against its median decode step (empty where
    the sweep has no half rate or the table does not record the ratio)."""
    if on is None or "itl_p99_x_decode" not in on:
        return ""
    sel = on[(on["origin"] == origin) & (on["variant"] == variant) & (on["rate_fraction"] == 0.5)
             & on["itl_p99_x_decode"].notna()]
    if sel.empty:
        return ""
    r = sel.iloc[0]
    return (f" At half the offline request rate, inter-token latency p99 {r['itl_p99_ms']:.1f} ms, "
            f"{r['itl_p99_x_decode']:.1f}x the median decode step ({r['decode_step_ms']:.2f} ms).")


def _prefill(runs: pd.DataFrame) -> str:
    """How the variant's prefill ran: through CUDA graphs (how many token buckets) or eagerly."""
    if "prefill_buckets" not in runs:
        return ""
    buckets = runs["prefill_buckets"].iloc[0]
    if buckets != buckets:  # NaN: the table predates the column, and prefill graphs with it
        return " Prefill: eager (measured before prefill graphs)."
    if buckets == 0:
        return " Prefill: eager."
    return f" Prefill: CUDA graphs of {int(buckets)} token buckets (larger packs eager)."


def _issue(steps: pd.DataFrame | None, origin: str, variant: str) -> str:
    """The offline run's steps by kind: median device time (wall where the table has none)
    against the host's time issuing them (empty where the table does not record it)."""
    if steps is None or "issue_ms" not in steps:
        return ""
    sel = steps[(steps["origin"] == origin) & (steps["variant"] == variant)
                & (steps["run"] == "offline") & steps["issue_ms"].notna()]
    kinds = [(kind, g) for kind, g in sel.groupby("kind", sort=False)
             if kind in ("decode", "mixed", "prefill")]
    if not kinds:
        return ""
    own = "device_ms" if "device_ms" in sel and sel["device_ms"].notna().any() else "wall_ms"
    return f" Offline, median {own[:-3]} time / host issuing per step: " + ", ".join(
        f"{kind} {g[own].median():.2f} / {g['issue_ms'].median():.2f} ms"
        for kind, g in kinds) + "."


def _slow(steps: pd.DataFrame | None, origin: str, variant: str, factor: float = 3.0) -> str:
    """Steps over ``factor`` times their kind's median in each run, each step's own time taken
    over its own floor: a mixed step of 4,000 prompt tokens is not slow for its work, a cold
    shape or a stall is (``steps_over_3x`` counts by time alone). Empty without floors."""
    if steps is None or "floor_ms" not in steps:
        return ""
    sel = steps[(steps["origin"] == origin) & (steps["variant"] == variant)
                & steps["kind"].isin(("decode", "mixed", "prefill")) & (steps["floor_ms"] > 0)]
    if sel.empty:
        return ""
    own = "device_ms" if "device_ms" in sel and sel["device_ms"].notna().any() else "wall_ms"
    per_floor = sel[own] / sel["floor_ms"]
    median = per_floor.groupby([sel["run"], sel["kind"]]).transform("median")
    slow = int((per_floor > factor * median).sum())
    return (f" Steps over {factor:g}x their kind's median {own[:-3]} time per floor unit in "
            f"their run: {slow} of {len(sel):,}.")


def _cold(runs: pd.DataFrame, on: pd.DataFrame | None, origin: str, variant: str) -> str:
    """Triton compiles during the variant's measured runs (empty where not recorded)."""
    both = [runs] + ([on[(on["origin"] == origin) & (on["variant"] == variant)]]
                     if on is not None else [])
    counts = pd.concat([t["jit_compiles"] for t in both if "jit_compiles" in t]).dropna()
    if counts.empty:
        return ""
    if counts.sum() == 0:
        return f" No Triton kernel compiled during its {len(counts)} measured runs."
    return (f" Triton compiled {int(counts.sum())} kernel specialisations during its measured "
            "runs: cold shapes.")


def _knee(on: pd.DataFrame | None, origin: str, variant: str) -> str:
    """The online sweep's saturation, in words (empty without a sweep)."""
    if on is None:
        return ""
    sel = on[(on["origin"] == origin) & (on["variant"] == variant)]
    if sel.empty:
        return ""
    limit_ms, knee = sel["ttft_limit_s"].iloc[0] * 1e3, sel["rate_ttft_p99_over_limit"].iloc[0]
    base = sel["offered_rate"].iloc[0] / sel["rate_fraction"].iloc[0]  # the sweep's 1x
    if knee != knee:  # NaN: no rate of the sweep passed the limit
        return (f" Online, TTFT p99 stayed under {limit_ms:.0f} ms up to "
                f"{sel['offered_rate'].max():.1f} requests/s.")
    return (f" Online, TTFT p99 first exceeds {limit_ms:.0f} ms at **{knee:.1f} requests/s** "
            f"({knee / base:.2f}x the sweep's base rate, {base:.1f} requests/s).")

