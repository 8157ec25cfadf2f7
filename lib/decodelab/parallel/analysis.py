"""The tensor-parallel tables, read for notebook 06: speed-ups, where TP starts to pay off, the
step split into compute and communication, and what a CUDA graph saves on each collective.

Every function takes the tables as ``load_table`` returns them (an ``origin`` column labels the
shipped reference and this machine's runs) and computes; nothing here holds a number.
"""

from __future__ import annotations

import pandas as pd

KEYS = ["origin", "model", "mode", "batch"]


def _with_origin(df: pd.DataFrame) -> pd.DataFrame:
    return df if "origin" in df else df.assign(origin="local")


def speedups(tp: pd.DataFrame) -> pd.DataFrame:
    """One row per origin x model x mode x batch x tp > 1: ms per step at TP=1 and at TP=n,
    and ``speedup`` = TP=1 time / TP=n time (> 1: the split is faster)."""
    tp = _with_origin(tp)
    one = tp[tp["tp"] == 1].set_index(KEYS)["ms_per_step"].rename("ms_tp1")
    many = tp[tp["tp"] > 1].set_index(KEYS)[["tp", "ms_per_step"]]
    out = many.join(one, how="inner").reset_index()
    out["speedup"] = out["ms_tp1"] / out["ms_per_step"]
    return out.sort_values(KEYS).reset_index(drop=True)


# Two graph-mode runs of ``bench tp`` on the H200 pair agreed within 2.2% at every point: a
# speed-up closer to 1 than this is a tie, not a win.
TIE_MARGIN = 0.025


def crossover(tp: pd.DataFrame, mode: str = "graph", margin: float = TIE_MARGIN) -> pd.DataFrame:
    """Per origin x model x tp: ``pays_off_from``, the smallest measured batch from which TP=n
    is faster than TP=1 by more than ``margin`` at that batch and at every larger measured batch
    (NaN: not within the measured range); ``ties``, the batches where the two are within
    ``margin`` of each other; and the speed-up at the smallest and largest batch."""
    s = speedups(tp)
    s = s[s["mode"] == mode]
    rows = []
    for (origin, model, n), g in s.groupby(["origin", "model", "tp"], sort=False):
        g = g.sort_values("batch")
        faster = (g["speedup"] > 1 + margin).tolist()
        start = next((i for i in range(len(faster)) if all(faster[i:])), None)
        ties = g[(g["speedup"] - 1).abs() <= margin]["batch"].astype(int).tolist()
        rows.append(dict(origin=origin, model=model, tp=n, mode=mode,
                         pays_off_from=float("nan") if start is None
                         else int(g["batch"].iloc[start]), ties=ties,
                         speedup_smallest=g["speedup"].iloc[0],
                         batch_smallest=int(g["batch"].iloc[0]),
                         speedup_largest=g["speedup"].iloc[-1],
                         batch_largest=int(g["batch"].iloc[-1])))
    return pd.DataFrame(rows)


def decomposition(tp: pd.DataFrame) -> pd.DataFrame:
    """The step of each TP > 1 row split in two: ``compute_ms`` (the step with its collectives
    left out) and ``comm_ms`` (what they add); ``comm_alone_ms`` is the same collectives run
    alone, and ``comm_share`` = comm_ms / ms_per_step. TP=1 rows have no communication:
    compute_ms is their whole step."""
    tp = _with_origin(tp).copy()
    single = tp["tp"] == 1
    tp["compute_ms"] = tp["ms_no_comm"].where(~single, tp["ms_per_step"])
    tp["comm_ms"] = tp["comm_ms"].where(~single, 0.0)
    tp["comm_alone_ms"] = tp["ms_comm_alone"].where(~single, 0.0)
    tp["comm_share"] = tp["comm_ms"] / tp["ms_per_step"]
    cols = KEYS + ["tp", "ms_per_step", "compute_ms", "comm_ms", "comm_alone_ms", "comm_share",
                   "all_reduces_per_step", "all_reduce_bytes", "all_gather_bytes"]
    return tp[cols].sort_values(KEYS + ["tp"]).reset_index(drop=True)


def per_collective_us(tp: pd.DataFrame) -> pd.DataFrame:
    """What one collective costs inside the step (comm_ms / collectives per step) and alone
    (comm_alone_ms / collectives), eager and graph, for each TP > 1 row."""
    d = decomposition(tp)
    d = d[d["tp"] > 1].copy()
    n = d["all_reduces_per_step"] + 1  # the all-reduces and the logits' all-gather
    d["in_step_us"] = d["comm_ms"] * 1e3 / n
    d["alone_us"] = d["comm_alone_ms"] * 1e3 / n
    return d[KEYS + ["tp", "in_step_us", "alone_us"]]


def graph_saving(coll: pd.DataFrame) -> pd.DataFrame:
    """Per origin x message size: all-reduce wall time eager and from a graph, host time of
    each, and ``saved_us`` = eager - graph (the host and launch work the graph removes)."""
    coll = _with_origin(coll)
    piv = coll.pivot_table(index=["origin", "ranks", "nbytes"], columns="mode",
                           values=["us_per_op", "host_us_per_op", "busbw_gb_s"])
    piv.columns = [f"{a}_{b}" for a, b in piv.columns]
    out = piv.reset_index()
    if {"us_per_op_eager", "us_per_op_graph"} <= set(out.columns):
        out["saved_us"] = out["us_per_op_eager"] - out["us_per_op_graph"]
        out["ratio"] = out["us_per_op_eager"] / out["us_per_op_graph"]
    return out


def small_message_latency(coll: pd.DataFrame, max_bytes: int = 64 << 10) -> pd.DataFrame:
    """Median all-reduce latency over messages up to ``max_bytes`` (decode's sizes: a (B, d)
    bf16 hidden state is 4 KiB to 1 MiB), per origin and mode."""
    coll = _with_origin(coll)
    small = coll[coll["nbytes"] <= max_bytes]
    return small.groupby(["origin", "mode"], as_index=False)[
        ["us_per_op", "host_us_per_op", "device_us_per_op"]].median()


def peak_bus_bandwidth(coll: pd.DataFrame) -> pd.DataFrame:
    """The highest bus bandwidth measured per origin and mode, and the message size it took."""
    coll = _with_origin(coll)
    idx = coll.groupby(["origin", "mode"])["busbw_gb_s"].idxmax()
    return coll.loc[idx, ["origin", "mode", "nbytes", "busbw_gb_s"]].reset_index(drop=True)


def headline_table(tp: pd.DataFrame, origin: str, batches: tuple[int, ...] = (1, 8, 32, 128),
                   mode: str = "graph") -> str:
    """The README's tensor-parallel table (markdown): per model and batch, the step at TP=1
    and TP=n, the speed-up, and T_comm with its share of the TP=n step."""
    d = decomposition(tp)
    s = speedups(tp).set_index(KEYS)
    d = d[(d["origin"] == origin) & (d["mode"] == mode) & (d["tp"] > 1)
          & d["batch"].isin(batches)]
    lines = ["| model | batch | TP=1 ms | TP=n ms | n | speed-up | T_comm ms | T_comm share |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d.itertuples():
        sp = s.loc[(r.origin, r.model, r.mode, r.batch)]
        lines.append(f"| {r.model} | {r.batch} | {sp['ms_tp1']:.2f} | {r.ms_per_step:.2f} | "
                     f"{r.tp} | {sp['speedup']:.2f}x | {r.comm_ms:.2f} | {r.comm_share:.0%} |")
    return "\n".join(lines)


def collective_ops(profile: pd.DataFrame) -> pd.DataFrame:
    """From ``tp_profile``: the communication operations only (the process group's host calls
    ``c10d::*`` and NCCL's kernels), per origin, mode, rank and op, with the host and device
    time of one call."""
    p = _with_origin(profile)
    p = p[p["op"].str.contains(r"c10d::|nccl", case=False, regex=True)].copy()
    calls = p["calls_per_step"].where(p["calls_per_step"] > 0)
    p["host_us_per_call"] = p["host_us_per_step"] / calls
    p["device_us_per_call"] = p["device_us_per_step"] / calls
    p["op"] = p["op"].str.replace(r"\(.*", "", regex=True)  # kernel names without signatures
    cols = ["origin", "model", "mode", "rank", "op", "calls_per_step", "host_us_per_call",
            "device_us_per_call"]
    return p[cols].sort_values(["origin", "model", "mode", "rank", "op"]).reset_index(drop=True)
