"""Validation helpers: every bad value is named, with what is allowed, before any work starts."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """A bad user-supplied value. The CLI turns it into exit code 2."""


def check_int(owner: str, name: str, value: Any, low: int, high: int | None = None) -> None:
    """``value`` must be an int in [low, high]."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{owner}.{name}={value!r} ({type(value).__name__}): must be {allowed}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{owner}.{name}={value!r}: must be {allowed}")


def check_float(owner: str, name: str, value: Any, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """``value`` must be a real number in the given interval."""
    lb, hb = ("(" if low_open else "["), (")" if high_open else "]")
    allowed = f"a number in {lb}{low}, {high}{hb}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{owner}.{name}={value!r} ({type(value).__name__}): must be {allowed}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high or value != value:  # value != value: NaN
        raise ConfigError(f"{owner}.{name}={value!r}: must be {allowed}")


def check_bool(owner: str, name: str, value: Any) -> None:
    """``value`` must be a bool (Python's or NumPy's): a switch read by truthiness would take
    'no', 'False' and 1 for True, and None for False."""
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"{owner}.{name}={value!r} ({type(value).__name__}): must be a bool "
                          "(True or False)")


def check_choice(owner: str, name: str, value: Any, allowed: Collection[Any]) -> None:
    """``value`` must be one of ``allowed``."""
    if value not in allowed:
        listed = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{owner}.{name}={value!r}: must be one of {listed}")


def check_int_list(owner: str, name: str, values: Any, low: int, high: int) -> None:
    """``values`` must be a non-empty list or tuple of ints, each in [low, high] (the sweeps'
    K and n lists); nothing more, e.g. no power of two."""
    if not isinstance(values, list | tuple) or not values:
        raise ConfigError(f"{owner}.{name}={values!r}: must be a non-empty list of integers")
    for v in values:
        check_int(owner, f"{name}[]", v, low, high)
