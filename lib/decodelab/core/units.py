"""The units a result-table column can declare, and how a table writes each (no torch).

Each table declares its columns' units where its row type is defined (a ``UNITS`` mapping of
column -> unit beside the row dataclasses, or beside the function that derives a shown frame);
:mod:`decodelab.plots.units` gathers them and :func:`decodelab.plots.tables.show_table` formats
every cell by its column's declared unit. Nothing is guessed from a column's name: a column
that contains "share" or "ratio" is a share or a ratio only if it says so.
"""

from __future__ import annotations

# unit -> what it is (the label a reader sees, where the column's own label has none)
UNITS: dict[str, str] = {
    "ns": "ns", "us": "µs", "ms": "ms", "s": "s",
    "cycles": "cycles",  # SM clock cycles
    "count": "",  # a whole number of things: kernels, calls, wavefronts, rows, tokens
    "number": "",  # a plain number without a unit (a size, an index, a setting)
    "bytes": "bytes",  # written in SI units (2.49 GB), never as a raw digit string
    "MiB": "MiB", "GiB": "GiB",
    "GB/s": "GB/s", "TB/s": "TB/s", "TFLOP/s": "TFLOP/s",
    "tokens/s": "tokens/s", "steps/s": "steps/s", "req/s": "req/s",
    "fraction": "",  # a share of a whole, written as a percentage
    "ratio": "",  # one quantity over another of the same kind, written as "1.23x"
    "r2": "",  # a fit's coefficient of determination, four decimals
    "text": "",  # words; never formatted as a number
}


def check_units(owner: str, mapping: dict[str, str]) -> dict[str, str]:
    """``mapping`` (column -> unit) if every unit is one of :data:`UNITS`; ValueError naming the
    column, its unit and the allowed ones otherwise."""
    bad = {c: u for c, u in mapping.items() if u not in UNITS}
    if bad:
        col, unit = next(iter(bad.items()))
        raise ValueError(f"{owner}: column {col!r} declares unit {unit!r}; allowed: "
                         f"{', '.join(UNITS)}")
    return mapping
