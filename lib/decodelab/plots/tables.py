"""One look for every table a notebook shows: :func:`show_table`.

A result table's own column names (``wall_us_per_step``, ``roofline_fraction``) are for code;
a reader gets a label with its unit ("wall (µs/step)", "of roofline"), numbers written by the
unit their column declares (:mod:`decodelab.plots.units`: three significant digits for times,
percentages for fractions, ``x`` for ratios, whole numbers for counts, bytes in SI units,
thousands separators, never an exponent or six decimals), origins in words, missing values as
"–" with a note saying so, no positional index, and cells that wrap instead of widening the
page. A column's name never decides that it is a share or a ratio: only its declared unit
does. Each rendered table carries its columns' units (``data-units``) for the report's checks.
"""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from decodelab.plots.palette import origin_label
from decodelab.plots.units import unit_of

MISSING = "–"
MISSING_NOTE = f"{MISSING}: not measured, or not applicable to that row."

# Labels of columns that many tables share; any other column is labelled by its unit suffix.
LABELS: dict[str, str] = {
    "origin": "source", "ms_per_step": "step (ms)", "tokens_per_s": "tokens/s",
    "device_ms_per_step": "device span (ms)", "host_ms_per_step": "host (ms/step)",
    "bytes_per_step": "bytes per step", "achieved_gb_s": "achieved (GB/s)",
    "copy_gb_s": "copy bandwidth (GB/s)", "roofline_fraction": "of roofline",
    "us_per_step": "µs per step", "steps_per_s": "steps/s", "nbytes": "message (bytes)",
    "r2": "R²", "r2_per_replay": "R² per replay", "tp": "TP", "k_steps": "K",
    "idle_fraction": "GPU idle", "setup_s": "capture / compile (s)",
}
# Unit suffixes, longest first: ``wall_us_per_step`` -> "wall (µs/step)".
_UNITS: tuple[tuple[str, str], ...] = (
    ("_us_per_step", "µs/step"), ("_ms_per_step", "ms/step"), ("_us_per_op", "µs/op"),
    ("_us_per_call", "µs/call"), ("_us_per_token", "µs/token"), ("_gb_s", "GB/s"),
    ("_tb_s", "TB/s"), ("_tok_s", "tokens/s"), ("_steps_per_s", "steps/s"), ("_per_s", "/s"),
    ("_mib", "MiB"), ("_gib", "GiB"),
    ("_bytes", "bytes"), ("_us", "µs"), ("_ms", "ms"), ("_s", "s"),
)
_CSS = [
    {"selector": "", "props": "max-width: 100%; border-collapse: collapse; font-size: 0.85em; "
                              "margin-bottom: 0.6em;"},
    {"selector": "th, td", "props": "white-space: normal; overflow-wrap: break-word; "
                                    "padding: 2px 8px; vertical-align: top;"},
    {"selector": "th", "props": "text-align: left; font-weight: 600;"},
    {"selector": "caption", "props": "caption-side: bottom; text-align: left; "
                                     "font-size: 0.9em; color: #555; padding-top: 4px;"},
]


def column_label(name: str) -> str:
    """A reader's label for a result-table column, with its unit."""
    if name in LABELS:
        return LABELS[name]
    for suffix, unit in _UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return f"{name[: -len(suffix)].replace('_', ' ')} ({unit})"
    return name.replace("_", " ")


def fmt_number(value: float, digits: int = 3) -> str:
    """Three significant digits, thousands separators, no exponent: 507223.07 -> "507,223",
    0.0123456 -> "0.0123", 2.0 -> "2"."""
    if not math.isfinite(value):
        return MISSING
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:,.{min(decimals, 8)}f}".rstrip("0").rstrip(".")


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _origins(column: pd.Series) -> bool:
    """Whether every value is an origin (``local`` or ``reference/<name>``)."""
    values = column.dropna()
    return not values.empty and values.map(
        lambda v: isinstance(v, str) and (v == "local" or v.startswith("reference/"))).all()


def _percent(value: float) -> str:
    return f"{value:.1%}" if abs(value) < 0.1 else f"{value:.0%}"


def fmt_bytes(value: float) -> str:
    """Bytes in SI units, three significant digits: 2,472,966,656 -> "2.47 GB"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{fmt_number(value / scale)} {prefix}B"
    return f"{value:.0f} B"


def _whole(column: pd.Series) -> bool:
    return pd.api.types.is_integer_dtype(column) or column.dropna().map(float.is_integer).all()


def _integer(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.0f}"


def formatter(name: str, column: pd.Series, unit: str | None = None) -> Callable[[object], str]:
    """How one column's cells are written: by its declared ``unit`` (None: a plain number,
    never a percentage or a ratio), origins and booleans in words."""
    lower = name.lower()
    if lower == "origin" or (lower == "source" and _origins(column)):
        return lambda v: origin_label(str(v))
    if pd.api.types.is_bool_dtype(column):
        return lambda v: "yes" if v else "no"
    if not pd.api.types.is_numeric_dtype(column) or unit == "text":
        return str
    if unit == "fraction":
        return _percent
    if unit == "ratio":
        return lambda v: f"{v:,.2f}x"
    if unit == "r2":
        return lambda v: f"{v:.4f}"
    if unit == "bytes":
        return fmt_bytes
    if _whole(column):
        return _integer
    return fmt_number


_CODE = re.compile(r"`([^`]+)`")


def markup(text: str) -> str:
    """Plain text for an HTML cell or caption: escaped, and `code` spans (the Markdown the
    prose uses) as <code> instead of literal backticks."""
    return _CODE.sub(r"<code>\1</code>", html.escape(str(text), quote=False))


def _cell(fmt: Callable[[object], str]) -> Callable[[object], str]:
    def write(value: object) -> str:
        if _missing(value):
            return MISSING
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return fmt(float(value)) if fmt is not str else str(value)
        return fmt(value)
    return write


def tidy(frame: pd.DataFrame, columns: Sequence[str] | Mapping[str, str] | None = None
         ) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows to show (a named index becomes columns, a positional one is dropped) and the
    label of each shown column."""
    if any(n is not None for n in frame.index.names):
        frame = frame.reset_index()
    else:
        frame = frame.reset_index(drop=True)
    if isinstance(frame.columns, pd.MultiIndex):  # a pivot's (value, origin) headers
        frame = frame.set_axis([" ".join(str(p) for p in c if str(p)) for c in frame.columns],
                               axis=1)
    if columns is None:
        labels = {c: column_label(str(c)) for c in frame.columns}
    elif isinstance(columns, Mapping):
        labels = dict(columns)
    else:
        labels = {c: column_label(str(c)) for c in columns}
    twice = sorted({v for v in labels.values() if list(labels.values()).count(v) > 1})
    if twice:
        raise ValueError(f"column label(s) {', '.join(map(repr, twice))} given twice")
    missing = [c for c in labels if c not in frame.columns]
    if missing:
        raise KeyError(f"no column(s) {', '.join(map(repr, missing))}; "
                       f"the table has {', '.join(map(str, frame.columns))}")
    return frame[list(labels)], labels


def shown_units(rows: pd.DataFrame, units: Mapping[str, str] | None = None) -> list[str]:
    """The unit each shown column is written by: declared (``units`` first, then
    :func:`decodelab.plots.units.unit_of`), "text" for words and booleans, "none" for a
    number no declaration covers (written as a plain number)."""
    out = []
    for c in rows.columns:
        numeric = (pd.api.types.is_numeric_dtype(rows[c])
                   and not pd.api.types.is_bool_dtype(rows[c]))
        out.append((unit_of(str(c), dict(units or {})) or "none") if numeric else "text")
    return out


def show_table(frame: pd.DataFrame, columns: Sequence[str] | Mapping[str, str] | None = None,
               *, caption: str = "", formats: Mapping[str, Callable[[object], str]] | None = None,
               units: Mapping[str, str] | None = None):
    """A pandas Styler of ``frame`` for display: ``columns`` picks (and, as a mapping, labels)
    the columns; each is written by its declared unit (``units`` declares those a caller names
    itself, e.g. a pivot's columns); ``formats`` overrides how a column's cells are written.
    Missing values are shown as "–" and the caption then says what that means."""
    rows, labels = tidy(frame, columns)
    formats = dict(formats or {})
    kinds = shown_units(rows, units)
    cells = {c: _cell(formats.get(c) or formatter(str(c), rows[c], None if k == "none" else k))
             for c, k in zip(rows.columns, kinds, strict=True)}
    shown = pd.DataFrame({labels[c]: rows[c].map(cells[c]).map(markup) for c in rows.columns})
    note = MISSING_NOTE if rows.map(_missing).to_numpy().any() else ""
    styler = (shown.style.hide(axis="index").set_table_styles(_CSS)
              .format_index(escape="html", axis=1)
              .set_table_attributes(f'data-units="{"|".join(kinds)}"'))
    numeric = [labels[c] for c in rows.columns
               if pd.api.types.is_numeric_dtype(rows[c]) and not pd.api.types.is_bool_dtype(rows[c])]
    text_cols = [label for label in shown.columns if label not in numeric]
    if numeric:
        styler = styler.set_properties(subset=numeric, **{"text-align": "right",
                                                          "white-space": "nowrap"})
    if text_cols:
        styler = styler.set_properties(subset=text_cols, **{"text-align": "left"})
    text = " ".join(part for part in (caption, note) if part)
    return styler.set_caption(markup(text)) if text else styler


def _frame_html(frame: pd.DataFrame) -> str:
    try:
        return show_table(frame).to_html()
    except (KeyError, ValueError, TypeError):  # a frame the helper cannot read: pandas' own
        return frame.to_html()


def register_formatter() -> None:
    """Inside IPython, every DataFrame a notebook displays goes through :func:`show_table`, so
    a table shown without the helper still gets its look (no positional index, rounding)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, _frame_html)
