"""The ``paged_attention`` table as a reader compares it: one line per (origin, batch, context,
contexts), each implementation's µs per layer side by side, and ours against the fastest peer
measured on the same line (a peer absent there, or not installed in that run: missing)."""

from __future__ import annotations

import pandas as pd

IMPLS = ("paged", "paged_uncapped", "paged_batch_order", "flashinfer",
         "sdpa_contiguous")  # the columns, in order
PEERS = ("flashinfer", "sdpa_contiguous")
KEYS = ("origin", "batch", "context", "lens")


def attention_view(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns: the keys the frame has, ``<impl>_us`` for every impl of :data:`IMPLS`, and
    ``paged_vs_best_peer`` (ours ÷ the fastest of :data:`PEERS` on that line)."""
    keys = [k for k in KEYS if k in frame]
    wide = (frame.pivot_table(index=keys, columns="impl", values="us_per_layer",
                              aggfunc="first", sort=False)
            .reindex(columns=list(IMPLS)))
    out = wide.rename(columns=lambda impl: f"{impl}_us")
    out["paged_vs_best_peer"] = wide["paged"] / wide[list(PEERS)].min(axis=1)
    out.columns.name = None
    return out.reset_index()
