"""Column types of a result table: each column is ``str``, ``int``, ``float`` or ``bool``,
recorded in the table's sidecar and used to parse the CSV back, so every value reads back as
written: strings such as '', 'NA', 'nan', 'None' or 'True' stay strings, ints stay ints, bools
stay bools, floats (NaN, inf and -0.0 included) come back bit for bit. A column's type comes
from its pandas dtype; a row dataclass's ``float`` fields (or unions with float) are float even
when this run's values are whole. A column that a CSV would not read back as written (None or
NaN among strings, a mix of types, lists) is refused on writing, naming it and its values.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pandas as pd

# The column types a table round-trips exactly, and the dtype each is read back as.
DTYPES: dict[str, Any] = {"str": str, "int": "int64", "float": "float64", "bool": bool}


def declared_floats(rows: pd.DataFrame | list[Any]) -> frozenset[str]:
    """Fields of the row dataclass typed ``float`` (or a union with float): whole numbers there
    are written as floats, so the column's type does not depend on this run's values."""
    if isinstance(rows, pd.DataFrame) or not rows or not dataclasses.is_dataclass(rows[0]):
        return frozenset()
    hints = typing.get_type_hints(type(rows[0]))
    return frozenset(f for f, t in hints.items() if t is float or float in typing.get_args(t))


def types_of(frame: pd.DataFrame, floats: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each column's type (a key of DTYPES), ``floats`` float even when whole; raises
    ValueError, naming the column and its values, where a CSV would not read back as written."""
    return {col: _column_type(col, frame[col], col in floats) for col in frame.columns}


def read_options(types: Any) -> dict[str, Any]:
    """``pandas.read_csv`` arguments that parse each column back as its type; ``types`` as a
    sidecar records them (ValueError if it is not that)."""
    if not isinstance(types, dict) or not all(t in DTYPES for t in types.values()):
        raise ValueError(f"its sidecar's column_types is {types!r}, must map columns to one of "
                         f"{sorted(DTYPES)}")
    return {"dtype": {c: DTYPES[t] for c, t in types.items()},
            "keep_default_na": False,  # 'NA', 'nan', 'null', '' are strings in a str column
            "na_values": {c: [""] for c, t in types.items() if t == "float"}}  # NaN is written ''


def _column_type(col: str, values: pd.Series, declared_float: bool) -> str:
    api = pd.api.types
    if api.is_float_dtype(values.dtype):
        return "float"
    complete = not values.isna().any()  # a missing int or bool would read back as a float
    if api.is_bool_dtype(values.dtype) and complete:
        return "bool"
    if api.is_integer_dtype(values.dtype) and complete:
        return "float" if declared_float else "int"
    return _str_type(col, values)


def _str_type(col: str, values: pd.Series) -> str:
    """'str' for a column of strings only: anything else among Python objects (None, a mix of
    types, a list) would not read back as written."""
    first: dict[type, Any] = {}
    for value in values:
        first.setdefault(str if isinstance(value, str) else type(value), value)  # TorchVersion
    if list(first) == [str]:
        return "str"
    (kind, value), *others = first.items()
    allowed = "a column holds one type: str ('' for none), int, float (NaN for none) or bool"
    if not others:
        raise ValueError(f"column {col!r} holds {value!r} ({kind.__name__}), which would not "
                         f"read back as written; {allowed}")
    other, other_value = others[0]
    raise ValueError(f"column {col!r} mixes {kind.__name__} and {other.__name__} values "
                     f"({value!r}, {other_value!r}), which would not read back as written; "
                     f"{allowed}")
