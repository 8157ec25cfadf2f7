"""The memory floor of a paged-model step: the bytes it must move at the bandwidth its origin's
read-dominated work can reach.

A decode step reads its weights and its K/V and writes a few KB: its floor is its bytes at the
read ceiling of its origin's ``environment`` table, or the fastest read a kernel of the
origin's model tables reached where that is faster (:func:`decodelab.env.ceilings.read_ceiling`).
Where the origin has none (tables measured before it existed), the copy bandwidth the run
measured itself stands in; a read-only kernel can beat that floor, and ``ceiling_caveat`` says
so. Pandas only, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd


def with_ceiling(pm: pd.DataFrame, environment: pd.DataFrame | None,
                 kernel_tables: Mapping[str, pd.DataFrame | None] | None = None) -> pd.DataFrame:
    """Table ``paged_model`` with, per origin, the bandwidth its floors use (``floor_gb_s``:
    the read ceiling of its environment table, or the fastest read of a kernel in
    ``kernel_tables`` where faster, else its run's copy bandwidth), its name (``ceiling``), the
    caveat where the copy bandwidth stands in (``ceiling_caveat``), and ``roofline_fraction``
    recomputed at that bandwidth."""
    from decodelab.env.ceilings import fastest_kernel_read, read_ceiling

    pm = (pm if "origin" in pm else pm.assign(origin="local")).copy()
    for col, value in (("floor_gb_s", math.nan), ("ceiling", ""), ("ceiling_caveat", "")):
        pm[col] = value
    for origin, rows in pm.groupby("origin", sort=False):
        device = str(rows["device"].iloc[0]) if "device" in rows else "cuda"
        found = read_ceiling(environment, str(origin), device, float(rows["copy_gb_s"].median()),
                             f"paged_model[origin={origin}] (its run's copy bandwidth)",
                             fastest_kernel_read(kernel_tables, str(origin)))
        pm.loc[rows.index, ["floor_gb_s", "ceiling", "ceiling_caveat"]] = \
            [found.gb_s, found.name, found.caveat]
    pm["roofline_fraction"] = floor_ms(pm) / pm["ms_per_step"]
    return pm


def ceiling_gb_s(frame: pd.Series | pd.DataFrame):
    """The bandwidth a floor uses: ``floor_gb_s`` (:func:`with_ceiling`) where the rows have
    it, else the run's copy bandwidth."""
    return frame["floor_gb_s"] if "floor_gb_s" in frame else frame["copy_gb_s"]


def ceiling_lines(pm: pd.DataFrame) -> list[str]:
    """Per origin, which bandwidth its floors use and, for the copy bandwidth standing in, why
    a kernel can beat them (rows from :func:`with_ceiling`)."""
    from decodelab.core.results import origin_label

    if "ceiling" not in pm:
        return []
    return [f"{origin_label(str(o))}: floors at the {r['ceiling']} ({r['floor_gb_s']:,.0f} GB/s)"
            + (f"; {r['ceiling_caveat']}" if r["ceiling_caveat"] else "")
            for o, r in pm.groupby("origin", sort=False).first().iterrows()]


def floor_ms(row: pd.Series | pd.DataFrame):
    """The memory floor of a step: bytes it must move / the ceiling of its origin
    (:func:`ceiling_gb_s`), in ms."""
    return row["bytes_per_step"] / (ceiling_gb_s(row) * 1e9) * 1e3
