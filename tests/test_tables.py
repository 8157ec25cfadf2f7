"""The one table look (plots.show_table) and the one palette (plots.palette)."""

import math

import pandas as pd
import pytest

pytest.importorskip("jinja2")  # pandas' Styler renders through it

from decodelab.plots import palette  # noqa: E402
from decodelab.plots.tables import (  # noqa: E402
    MISSING,
    column_label,
    fmt_number,
    show_table,
    tidy,
)


def _cells(styler) -> list[list[str]]:
    """The rendered body cells, row by row (what the reader sees)."""
    ctx = styler._translate(styler.uuid, styler.cell_ids)  # noqa: SLF001 - the rendered grid
    return [[c["display_value"] for c in row if c["type"] == "td"] for row in ctx["body"]]


def test_numbers_are_rounded_by_what_they_measure():
    assert fmt_number(507223.075987) == "507,223"
    assert fmt_number(0.0123456) == "0.0123"
    assert fmt_number(2.0) == "2"
    assert fmt_number(24.649) == "24.6"
    assert fmt_number(-3.14159) == "-3.14"
    assert fmt_number(math.nan) == MISSING
    assert "e" not in fmt_number(1.2e-7)


def test_columns_get_labels_with_units():
    assert column_label("wall_us_per_step") == "wall (µs/step)"
    assert column_label("achieved_gb_s") == "achieved (GB/s)"
    assert column_label("capture_s") == "capture (s)"
    assert column_label("graph_mem_mib") == "graph mem (MiB)"
    assert column_label("origin") == "source"
    assert column_label("kernel") == "kernel"
    assert column_label("seed_steps_per_s") == "seed (steps/s)"  # was "seed steps per (s)"


def test_show_table_hides_the_index_formats_and_notes_missing_values():
    frame = pd.DataFrame({"origin": ["reference/h200", "local"], "wall_us_per_step": [507223.07, 1.5],
                          "roofline_fraction": [0.5692, math.nan], "ratio_to_bare": [1.4271, 1.0],
                          "of_ceiling": [0.747, 0.05],
                          "batch": [1, 128000], "validated": [True, False],
                          "kernel": ["void f<int>(x)", "g"]}, index=[52, 53])
    styler = show_table(frame, caption="Synthetic rows.")
    html = styler.to_html()
    assert "row_heading" not in html and ">52<" not in html  # no positional index
    assert _cells(styler) == [
        ["H200 (shipped reference)", "507,223", "57%", "1.43x", "75%", "1", "yes",
         "void f&lt;int&gt;(x)"],
        ["this machine", "1.5", MISSING, "1.00x", "5.0%", "128,000", "no", "g"]]
    assert "Synthetic rows." in html and "not measured" in html
    assert "wall (µs/step)" in html and "of roofline" in html
    clean = show_table(frame.dropna()).to_html()
    assert "not measured" not in clean  # the note appears only with a missing value


def test_a_named_index_becomes_columns_and_labels_can_be_chosen():
    frame = pd.DataFrame({"us": [1.0, 2.0]}, index=pd.Index(["a", "b"], name="layer"))
    rows, labels = tidy(frame)
    assert list(rows.columns) == ["layer", "us"] and labels["us"] == "us"
    styler = show_table(frame, {"layer": "layer", "us": "µs per step"})
    assert _cells(styler) == [["a", "1"], ["b", "2"]]
    wide = pd.DataFrame([[1.0, 2.0]], columns=pd.MultiIndex.from_tuples([("count", "a"),
                                                                        ("count", "b")]))
    assert list(tidy(wide)[0].columns) == ["count a", "count b"]


def test_bad_columns_are_named():
    frame = pd.DataFrame({"a": [1], "b": [2]})
    with pytest.raises(KeyError, match="'c'"):
        show_table(frame, ["a", "c"])
    with pytest.raises(ValueError, match="given twice"):
        show_table(frame, {"a": "x", "b": "x"})


def test_displayed_frames_go_through_the_helper():
    from IPython.core.interactiveshell import InteractiveShell

    from decodelab.plots.tables import register_formatter

    shell = InteractiveShell.instance()
    register_formatter()
    html = shell.display_formatter.formatters["text/html"](
        pd.DataFrame({"wall_us": [1234.5678]}))
    assert "1,235" in html and "row_heading" not in html


def test_palette_one_colour_per_quantity():
    layers = ("dispatch", "replay", "node", "orchestration", "compute", "comm")
    colours = [palette.quantity_color(q) for q in layers + ("GPU idle", "host CPU", "wall")]
    assert len(set(colours)) == len(colours)  # no two quantities share a colour
    assert palette.quantity_color("device busy") == palette.quantity_color("compute")
    with pytest.raises(KeyError, match="known"):
        palette.quantity_color("latency")
    assert palette.origin_color("reference/t4") == palette.origin_color("reference/t4")
    assert palette.origin_label("reference/h200x2") == "2× H200 (shipped reference)"
    assert palette.origin_label("reference/t4") == "T4 (shipped reference)"
    assert palette.origin_label("local") == "this machine"


def test_units_come_from_declarations_not_from_column_names():
    """Issue 25.8: a count whose name contains "share" is a count, a time whose name contains
    "ratio" is a time; a share or ratio is one only where its unit is declared."""
    frame = pd.DataFrame({"shared_wavefronts_per_step": [39009.2895, 16143.6765],
                          "orchestration_us": [130.25, 253.07],
                          "an_undeclared_share": [0.25, 0.5],
                          "bytes_per_step": [2472966656.0, 16777216.0],
                          "calls_per_step": [65.0, 16.0]})
    styler = show_table(frame)
    assert _cells(styler) == [["39,009", "130", "0.25", "2.47 GB", "65"],
                              ["16,144", "253", "0.5", "16.8 MB", "16"]]
    assert 'data-units="count|us|none|bytes|count"' in styler.to_html()
    declared = show_table(frame[["an_undeclared_share"]], units={"an_undeclared_share": "fraction"})
    assert _cells(declared) == [["25%"], ["50%"]]


def test_every_declared_unit_is_known_and_no_column_has_two():
    from decodelab.core.units import UNITS
    from decodelab.plots.units import column_units

    units = column_units()  # raises on a column declared with two units
    assert set(units.values()) <= set(UNITS)
    assert units["roofline_fraction"] == "fraction" and units["ratio_to_bare"] == "ratio"
    assert units["shared_wavefronts_per_step"] == "count"


def test_every_numeric_field_of_the_row_dataclasses_declares_a_unit():
    """The row modules' UNITS cover every numeric field of their rows, so a new column cannot
    be added without saying what it measures."""
    import dataclasses
    import importlib
    import typing

    from decodelab.plots.units import ROW_MODULES, unit_of

    missing = []
    for name in ROW_MODULES:
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)
                    and cls.__module__ == name and cls.__name__.endswith("Row")):
                continue
            for field, hint in typing.get_type_hints(cls).items():
                numeric = hint in (int, float) or float in typing.get_args(hint)
                if numeric and unit_of(field) is None:
                    missing.append(f"{cls.__name__}.{field}")
    assert missing == []


def test_code_spans_in_cells_and_captions_are_code_not_backticks():
    frame = pd.DataFrame({"how": ["run `make bench-gpu` <now>"]})
    html = show_table(frame, caption="Rows of table `dispatch`.").to_html()
    assert "<code>make bench-gpu</code> &lt;now&gt;" in html
    assert "table <code>dispatch</code>." in html and "`" not in html
