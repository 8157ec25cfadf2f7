"""Which measured bandwidth a floor of read-dominated work uses, and what it says about it.

A decode step reads its weights and its K/V and writes a few KB: its bytes are reads. The
copy bandwidth (``d2d_copy_bandwidth``, ``memory_copy_bandwidth``) counts a read and a write
of every byte, so a read-only stream can run faster than it (04a's lm_head gemv and its K/V
reads at long context do): a floor at the copy bandwidth is no floor. The read ceiling
(``read_bandwidth``, ``memory_read_bandwidth``: a reduction over the same bytes) is; where an
origin has both, the higher of the two is the ceiling (a reduction that is not yet at the
memory's limit must not make the floor looser than the copy already shows). Where an origin
has no read ceiling (tables measured before it existed), the copy bandwidth stands in and the
caveat says so, with the command that measures it.

Pandas only, no torch: every function takes the ``environment`` table as ``load_table``
returns it (an ``origin`` column), or None.
"""

from __future__ import annotations

import math
import re
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


def fallback_caveat(origin: str, device: str = "h200") -> str:
    return (f"no read ceiling measured for {origin} yet: the copy bandwidth, which counts a read "
            "and a write of every byte, stands in, and a read-only kernel can beat it; measure "
            f"it with `{MEASURE.format(device=device)}`")


def read_ceiling(environment: pd.DataFrame | None, origin: str, backend: str = "cuda",
                 copy_gb_s: float = math.nan, copy_source: str = "") -> Ceiling:
    """The ceiling of read-dominated work on ``origin``: its read ceiling (the higher of it and
    its copy bandwidth) where measured, else the copy bandwidth (``copy_gb_s``, e.g. the one a
    run measured itself, else the environment table's) with the caveat. NaN where neither is
    known."""
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
