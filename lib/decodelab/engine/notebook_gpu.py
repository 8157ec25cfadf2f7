"""Notebook 04_runtime's summaries of the tables only a GPU writes: the batch-invariance checks,
costs and matmul tiles, and the sampler grid (on a CPU machine, the shipped reference's
copies)."""

from __future__ import annotations

import pandas as pd

TABLES = ("batch_invariance", "batch_invariance_cost", "batch_invariance_tiles", "sampler_grid")


def load_tables() -> dict[str, pd.DataFrame]:
    """Every stored copy of the batch-invariance and sampler-grid tables (GPU only: none on a
    CPU machine but the shipped reference)."""
    from decodelab.core.results import stored_tables

    return stored_tables(TABLES)


def invariance_summary(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown, one line per origin: how many compared outputs were the same bits under the
    batch-invariant switch, by check, and what the switch costs (invariant / default)."""
    from decodelab.core.results import origin_label

    checks, cost = tables.get("batch_invariance"), tables.get("batch_invariance_cost")
    if checks is None:
        return ("No batch-invariance results are stored yet: `python -m decodelab bench runtime "
                "--profile gpu` writes them on a GPU.")
    lines = []
    for origin, sel in checks.groupby("origin", sort=False):
        by_check = ", ".join(f"`{c}` {g['identical'].sum()}/{g['compared'].sum()}"
                             for c, g in sel.groupby("check", sort=False))
        line = (f"- **{origin_label(origin)}**, {sel['model'].iloc[0]} {sel['dtype'].iloc[0]}: "
                f"**{sel['identical'].sum()} of {sel['compared'].sum()}** compared outputs "
                f"the same bits ({by_check}), batches {sel['batch'].min()}-"
                f"{sel['batch'].max()}.")
        mine = None if cost is None else cost[cost["origin"] == origin]
        if mine is not None and not mine.empty:
            line += " Cost, invariant / default kernels: " + "; ".join(
                f"{step} {g['ratio'].min():.2f}-{g['ratio'].max():.2f}x "
                f"({_points(step, g)})" for step, g in mine.groupby("step", sort=False)) + "."
        lines.append(line)
    return "\n".join(lines)


def _points(step: str, rows: pd.DataFrame) -> str:
    if step == "prefill":
        return "prompts of " + ", ".join(f"{c:,}" for c in rows["context"]) + " tokens"
    return (f"batch {rows['batch'].min()}-{rows['batch'].max()}, context "
            + " and ".join(f"{c:,}" for c in sorted(rows["context"].unique())))


def sampler_grid_view(grid: pd.DataFrame, batch: int, vocab: int) -> pd.DataFrame:
    """Per setting (``kind``) at one batch and vocabulary, each sampler's device time (µs) and
    the fused sampler against the fastest other one (``fused / best other``)."""
    sel = grid[(grid["batch"] == batch) & (grid["vocab"] == vocab)]
    wide = sel.pivot_table(index="kind", columns="sampler", values="device_us", sort=False)
    others = wide.drop(columns="fused")
    view = wide.assign(**{"fused / best other": wide["fused"] / others.min(axis=1)})
    return view.reset_index()


def tile_rule_view(tiles: pd.DataFrame) -> pd.DataFrame:
    """Per weight and row count of one origin's ``batch_invariance_tiles``: the tile the rule
    picks, its µs, the fastest tile whose rows were the same bits (and its µs), cuBLAS's, and
    the pick against both; ``same bits``: tiles of that weight the same bits / tried."""
    same = tiles.drop_duplicates(["weight", "block_m", "block_n", "block_k", "warps"]).groupby(
        "weight", sort=False)["same_bits"].agg(lambda s: f"{int(s.sum())}/{len(s)}")
    name = tiles["block_m"].astype(str) + "x" + tiles["block_n"].astype(str) + "x" + tiles[
        "block_k"].astype(str) + "/" + tiles["warps"].astype(str)
    tiles = tiles.assign(tile=name)
    rows = []
    for (weight, count), g in tiles.groupby(["weight", "rows"], sort=False):
        picked, same_bits = g[g["picked"]], g[g["same_bits"]]
        if picked.empty or same_bits.empty:
            continue  # a sweep cut short: nothing to set the pick against
        pick, best = picked.iloc[0], same_bits.sort_values("tile_us").iloc[0]
        rows.append({"weight": weight, "rows": count, "picked": pick["tile"],
                     "picked µs": pick["tile_us"], "fastest": best["tile"],
                     "fastest µs": best["tile_us"], "cuBLAS µs": pick["cublas_us"],
                     "picked / fastest": pick["tile_us"] / best["tile_us"],
                     "picked / cuBLAS": pick["x_cublas"], "same bits": same[weight]})
    return pd.DataFrame(rows)


def sampler_grid_losses(view: pd.DataFrame) -> str:
    """Markdown: the settings of a :func:`sampler_grid_view` where the fused sampler is not the
    fastest, each with the sampler ahead of it and by how much (or that it is fastest at all)."""
    ratio = "fused / best other"
    others = view.drop(columns=["kind", "fused", ratio])
    behind = view[view[ratio] > 1.0]
    if behind.empty:
        return f"The fused sampler is the fastest at every setting ({len(view)})."
    return "The fused sampler is not the fastest at: " + "; ".join(
        f"`{r['kind']}` ({r[ratio]:.2f}x {others.loc[i].idxmin()}'s time)"
        for i, r in behind.iterrows()) + "."
