"""The tensor-parallel regime: the transformer-decode step split over n GPUs, where the
collectives inside every layer add the communication layer T_comm.

From table ``tp`` (graph mode, the headline model batch and context, the largest TP size
measured, the model of the transformer-decode regime where the table has it):

- comm = the TP=n step - the same step with every collective replaced by a local stand-in of
  the same shape (``comm_ms``, measured in the same run);
- replay = wall - device span (the graph launch and the input copies, as in the transformer
  regime);
- compute = the rest: the kernels on 1/n of the weights (remainder).

TP=n is compared with TP=1 of the same run (:func:`tp1_step`: the same code path, a group of
one), never with the transformer-decode regime's step, which table ``paged_model`` measured in
another run, possibly at another commit (:func:`one_gpu_note` says which and by how much).

Rows from a CPU run are refused: two gloo processes on a CPU time loopback sockets, not a GPU
interconnect.
"""

from __future__ import annotations

import math

import pandas as pd

from decodelab.analysis.layers import (
    Headline,
    MissingData,
    Regime,
    Tables,
    Term,
    fmt_us,
    selector_of,
)
from decodelab.analysis.regimes import serial_transformer_us

NAN = math.nan
DEFAULT_MODEL = "llama-3.2-1b"  # the model of the other transformer regimes' reference runs


def tp_model(tables: Tables, h: Headline) -> str:
    """The transformer-decode regime's model when ``paged_model`` names one, else the default."""
    try:
        frame = tables.frame("paged_model", ["model"])
    except MissingData:
        return DEFAULT_MODEL
    return str(frame["model"].iloc[0])


def _gpu_rows(tables: Tables, h: Headline) -> tuple[pd.DataFrame, dict]:
    """The ``tp`` rows of the headline point (graph mode) measured on GPUs, and their selector."""
    where = {"mode": "graph", "model": tp_model(tables, h), "batch": h.model_batch,
             "context": h.context}
    frame, _ = tables.rows("tp", where, ["tp", "ms_per_step", "device_ms_per_step", "comm_ms"])
    if "device" in frame.columns:
        frame = frame[frame["device"].astype(str) != "cpu"]
    return frame, where


def tensor_parallel(tables: Tables, h: Headline) -> Regime:
    frame, where = _gpu_rows(tables, h)
    model = where["model"]
    frame = frame[frame["tp"] > 1]
    if frame.empty:
        raise MissingData(f"no GPU rows with TP > 1 in {selector_of('tp', tables.origin, where)}")
    row = frame.loc[frame["tp"].idxmax()]
    n = int(row["tp"])
    origin = str(row.get("origin", tables.origin))
    src = selector_of("tp", origin, {**where, "tp": n})
    wall, span = float(row["ms_per_step"]) * 1e3, float(row["device_ms_per_step"]) * 1e3
    comm = float(row["comm_ms"]) * 1e3
    replay = wall - span if math.isfinite(span) else 0.0
    return Regime("tensor parallel", wall, NAN, NAN, src, (
        Term("replay", replay, NAN, NAN, src,
             "wall - device span (CUDA events): graph launch and input copies"),
        Term("comm", comm, NAN, NAN, src,
             "step - the same step with its collectives replaced by local stand-ins"),
        Term("compute", wall - replay - comm, NAN, NAN, src,
             f"the rest (remainder): kernels on 1/{n} of the weights")),
        f"{model}, B={h.model_batch}, context {h.context}, TP={n}", origin)


def tp1_step(tables: Tables, h: Headline) -> tuple[float, str, str]:
    """The TP=1 step (µs) of the run the tensor-parallel regime reads, its selector and origin:
    the same code path (``TensorParallelLlama`` over a group of one is ``PagedLlama``), the same
    run, model, point and mode. TP=n is compared with this step, never with another table's."""
    frame, where = _gpu_rows(tables, h)
    frame = frame[frame["tp"] == 1]
    if frame.empty:
        raise MissingData(f"no GPU row with TP = 1 in {selector_of('tp', tables.origin, where)}")
    row = frame.iloc[0]
    origin = str(row.get("origin", tables.origin))
    return (float(row["ms_per_step"]) * 1e3, selector_of("tp", origin, {**where, "tp": 1}),
            origin)


def tp_speedup_line(tables: Tables, regime: Regime, h: Headline) -> str:
    """TP=n against TP=1 of the same run, in words ("" where the run has no TP=1 row)."""
    try:
        tp1, src, _ = tp1_step(tables, h)
    except MissingData:
        return ""
    n = regime.config.rsplit("TP=", 1)[-1]
    return (f"TP=1 of the same run and code path takes {fmt_us(tp1)} µs (`{src}`), so TP={n} "
            f"is a speed-up of {tp1 / regime.step_us:.2f}x")


def one_gpu_note(tables: Tables, h: Headline) -> str:
    """Why the transformer-decode regime's one-GPU step (table ``paged_model``) differs from the
    tensor-parallel run's TP=1 step (table ``tp``): two runs, possibly at two commits, with the
    numbers of both tables; "" where either is missing."""
    try:
        tp1, tp_src, tp_origin = tp1_step(tables, h)
        row, pm_src = tables.one("paged_model", {"mode": "graph", "batch": h.model_batch,
                                                 "context": h.context}, ["ms_per_step"])
    except MissingData:
        return ""
    pm = float(row["ms_per_step"]) * 1e3
    text = (f"The one-GPU step of the transformer-decode regime ({fmt_us(pm)} µs, `{pm_src}`) "
            f"is not the tensor-parallel run's TP=1 step ({fmt_us(tp1)} µs, `{tp_src}`): two "
            "benches, two runs. ")
    stamps = sorted([(*tables.stamp("paged_model"), "paged_model"),
                     (*tables.stamp("tp", tp_origin), "tp")], key=lambda s: s[1])
    (old, _, old_name), (new, _, new_name) = stamps
    if old and new and old != new:
        changed = _commits_between(old, new, "lib/decodelab/model")
        what = ("the model's code may have changed in between" if changed is None else
                f"{changed} commits changed the model's code in between")
        text += (f"Table `{old_name}` was measured at commit {old}, table `{new_name}` at {new}: "
                 f"{what} (`git log --oneline {old}..{new} -- lib/decodelab/model`), so the two "
                 "steps need not run the same kernels. ")
    elif old and new:
        text += f"Both were measured at commit {old}, with the same kernels. "
    serial = serial_transformer_us(tables, h)
    if math.isfinite(serial):
        text += (f"The paged_model run's own step without programmatic dependent launch takes "
                 f"{fmt_us(serial)} µs")
        text += (f": PDL accounts for {fmt_us(serial - pm)} µs of the {fmt_us(tp1 - pm)} µs "
                 "between the two one-GPU steps. " if pm < serial <= tp1 else ". ")
    return text + ("Tensor parallelism is therefore compared with TP=1 of its own run only; "
                   "`make bench-gpu-tp` at the paged_model run's commit would put both tables "
                   "on the same kernels.")


def _commits_between(old: str, new: str, folder: str) -> int | None:
    """How many commits from ``old`` to ``new`` touched ``folder`` (git, in this checkout);
    None where git or either commit is not at hand."""
    import subprocess

    from decodelab.core import paths

    try:
        out = subprocess.run(["git", "rev-list", "--count", f"{old}..{new}", "--", folder],
                             cwd=paths.repo_root(), capture_output=True, text=True, timeout=10,
                             check=True)
        return int(out.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
