"""The tensor-parallel regime: the transformer-decode step split over n GPUs, where the
collectives inside every layer add the communication layer T_comm.

From table ``tp`` (graph mode, the headline model batch and context, the largest TP size
measured, the model of the transformer-decode regime where the table has it):

- comm = the TP=n step - the same step with every collective replaced by a local stand-in of
  the same shape (``comm_ms``, measured in the same run);
- replay = wall - device span (the graph launch and the input copies, as in the transformer
  regime);
- compute = the rest: the kernels on 1/n of the weights (remainder).

Rows from a CPU run are refused: two gloo processes on a CPU time loopback sockets, not a GPU
interconnect.
"""

from __future__ import annotations

import math

from decodelab.analysis.layers import Headline, MissingData, Regime, Tables, Term, selector_of

NAN = math.nan
DEFAULT_MODEL = "llama-3.2-1b"  # the model of the other transformer regimes' reference runs


def tp_model(tables: Tables, h: Headline) -> str:
    """The transformer-decode regime's model when ``paged_model`` names one, else the default."""
    try:
        frame = tables.frame("paged_model", ["model"])
    except MissingData:
        return DEFAULT_MODEL
    return str(frame["model"].iloc[0])


def tensor_parallel(tables: Tables, h: Headline) -> Regime:
    model = tp_model(tables, h)
    where = {"mode": "graph", "model": model, "batch": h.model_batch, "context": h.context}
    frame, _ = tables.rows("tp", where, ["tp", "ms_per_step", "device_ms_per_step", "comm_ms"])
    frame = frame[frame["tp"] > 1]
    if "device" in frame.columns:
        frame = frame[frame["device"].astype(str) != "cpu"]
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
