"""Which measured bandwidth a floor of read-dominated work uses, and what it says about it.

A decode step reads its weights and its K/V and writes a few KB: its bytes are reads. The
copy bandwidth (``d2d_copy_bandwidth``, ``memory_copy_bandwidth``) counts a read and a write
of every byte, so a read-only stream can run faster than it (04a's lm_head gemv and its K/V
reads at long context do): a floor at the copy bandwidth is no floor. The read ceiling
(``read_bandwidth``, ``memory_read_bandwidth``: the fastest read-only stream phase 0 times,
``env.read_stream``) is; where an
origin has both, the higher of the two is the ceiling (a reduction that is not yet at the
memory's limit must not make the floor looser than the copy already shows), and where a kernel
of the origin's model tables read faster still (the LM head's gemv can beat a reduction),
that kernel's rate is (:func:`fastest_kernel_read`): no kernel on the page beats its floor.
Where an origin has no read ceiling (tables measured before it existed), the copy bandwidth
stands in and the caveat says so, with the command that measures it.

Pandas only, no torch: every function takes the ``environment`` table as ``load_table``
returns it (an ``origin`` column), or None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

READ = {"cuda": "read_bandwidth", "cpu": "memory_read_bandwidth"}  # GB/s, bytes read
COPY = {"cuda": "d2d_copy_bandwidth", "cpu": "memory_copy_bandwidth"}  # GB/s, read + written
MEASURE = "python -m decodelab bench env --profile gpu --out data/reference/{device}"


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The bandwidth a read-dominated floor uses: its value, its name, the row it comes from
    and, where it is the copy bandwidth standing in, the caveat a reader needs."""

    gb_s: float
    name: str  # "read ceiling" or "copy bandwidth"
    source: str  # the row (or the run's own copy measurement)
    caveat: str = ""  # why this floor can be beaten, where the copy bandwidth stands in
    read_measured: bool = True  # False: no read ceiling measured, the copy bandwidth stands in

    @property
    def words(self) -> str:
        """"the read ceiling (4,500 GB/s)" or "the copy bandwidth (4,271 GB/s; caveat)"."""
        return f"the {self.name} ({self.gb_s:,.0f} GB/s" + (f"; {self.caveat}" if self.caveat
                                                              else "") + ")"


def environment_origin(origin: str) -> str:
    """The folder whose environment table holds an origin's ceilings: a multi-GPU reference
    (``reference/h200x2``) is calibrated on one GPU of the same model (``reference/h200``)."""
    return re.sub(r"x\d+$", "", origin)


def _value(environment: pd.DataFrame | None, origin: str, quantity: str
           ) -> tuple[float, str]:
    if environment is None or environment.empty or "quantity" not in environment:
        return math.nan, ""
    rows = environment[(environment["quantity"] == quantity)]
    if "origin" in rows:
        rows = rows[rows["origin"] == origin]
    if rows.empty:
        return math.nan, ""
    value = float(rows["value"].iloc[-1])
    return (value, f"environment[origin={origin}, quantity={quantity}]") if value > 0 \
        else (math.nan, "")


# Tables whose rows are a kernel's measured read rate (GB/s of bytes read): the model's matmul
# candidates over their weights, attention (ours and its peers) over its K/V.
KERNEL_READS = {"paged_model_linear": "weight_gb_s", "paged_attention": "kv_gb_s"}
_ROW_KEYS = ("impl", "candidate", "n", "k", "batch", "context", "lens")


def fastest_kernel_read(frames: Mapping[str, pd.DataFrame | None] | None, origin: str
                        ) -> tuple[float, str]:
    """The fastest read any kernel of ``origin`` reached in the model's tables
    (:data:`KERNEL_READS`; frames as ``load_table`` returns them), and the row it is: (NaN, "")
    where none is known. A read stream that a kernel on the page beats is no ceiling, so
    :func:`read_ceiling` takes this where it is faster."""
    where = environment_origin(origin)
    best, source = math.nan, ""
    for table, column in KERNEL_READS.items():
        frame = (frames or {}).get(table)
        if frame is None or frame.empty or column not in frame:
            continue
        rows = frame[frame["origin"] == where] if "origin" in frame else frame
        rows = rows[rows[column] > 0]
        if rows.empty:
            continue
        top = rows.loc[rows[column].idxmax()]
        if not float(top[column]) <= best:  # NaN-safe: the first found, then the faster
            best = float(top[column])
            keys = ", ".join(f"{k}={top[k]}" for k in _ROW_KEYS if k in top.index)
            source = f"{table}[origin={where}, {keys}]"
    return best, source


def fallback_caveat(origin: str, device: str = "h200") -> str:
    return (f"no read ceiling measured for {origin} yet: the copy bandwidth, which counts a read "
            "and a write of every byte, stands in, and a read-only kernel can beat it; measure "
            f"it with `{MEASURE.format(device=device)}`")


def read_ceiling(environment: pd.DataFrame | None, origin: str, backend: str = "cuda",
                 copy_gb_s: float = math.nan, copy_source: str = "",
                 kernel_read: tuple[float, str] = (math.nan, "")) -> Ceiling:
    """The ceiling of read-dominated work on ``origin``: its read ceiling (the higher of it and
    its copy bandwidth) where measured, else the copy bandwidth (``copy_gb_s``, e.g. the one a
    run measured itself, else the environment table's) with the caveat; ``kernel_read``
    (:func:`fastest_kernel_read`: a kernel's measured read and its row) where that is faster,
    so that no kernel on the page beats its floor. NaN where nothing is known."""
    found = _stream_ceiling(environment, origin, backend, copy_gb_s, copy_source)
    fastest, source = kernel_read
    if fastest > found.gb_s or (fastest > 0 and not found.gb_s > 0):
        below = (f"; above the {found.name} measured ({found.gb_s:,.0f} GB/s, {found.source})"
                 if found.gb_s > 0 else "")
        return Ceiling(fastest, "read ceiling", f"the fastest kernel read measured, {source}"
                       + below)
    return found


def _stream_ceiling(environment: pd.DataFrame | None, origin: str, backend: str,
                    copy_gb_s: float, copy_source: str) -> Ceiling:
    where = environment_origin(origin)
    backend = "cpu" if backend == "cpu" else "cuda"
    read, read_src = _value(environment, where, READ[backend])
    copy, copy_src = (copy_gb_s, copy_source) if math.isfinite(copy_gb_s) \
        else _value(environment, where, COPY[backend])
    if math.isfinite(read):
        if math.isfinite(copy) and copy > read:
            return Ceiling(copy, "copy bandwidth", copy_src,
                           f"above the read ceiling measured ({read:,.0f} GB/s, {read_src})")
        return Ceiling(read, "read ceiling", read_src)
    device = where.split("/", 1)[-1] if where.startswith("reference/") else "<device>"
    return Ceiling(copy, "copy bandwidth", copy_src, fallback_caveat(origin, device), False)


def lacking_read_ceiling(environment: pd.DataFrame | None) -> list[str]:
    """The origins whose environment table has a copy bandwidth but no read ceiling."""
    if environment is None or environment.empty:
        return []
    out = []
    for origin, rows in environment.groupby("origin", sort=False):
        have = set(rows["quantity"])
        if any(COPY[b] in have and READ[b] not in have for b in COPY):
            out.append(str(origin))
    return out
