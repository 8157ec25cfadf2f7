"""A request's sampling settings as the sampler reads them: one declared row, and what derives
from it.

:class:`RowSampling` declares each field once: its name, its 32-bit word type (the
annotation, ``F32`` or ``I32``) and its padding value (the default). From it come the packed
per-row layout (``ROW_DTYPE``: the engine's slot tables and step buffer hold rows of it), the
index of each field in a row (``RowField``: the fused kernels' constexpr offsets) and the
sampler's named device views (:class:`RowParams`). A request's row is built from its
:class:`SamplingParams` by field name; ``greedy`` and ``inv_temperature`` are derived here,
once per request, so the greedy test stays ``SamplingParams.greedy``'s alone.
"""

from __future__ import annotations

import enum
from dataclasses import astuple, dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from decodelab.core.host_copy import to_device
from decodelab.engine.requests import SamplingParams

NO_TOP_K = 2**31 - 1  # the device's top-k of a row without one: more than any vocabulary
F32, I32 = "F32", "I32"  # the word type of a field: its annotation


@dataclass(frozen=True, slots=True)
class RowSampling:
    """One row of the sampler's packed block; the defaults are the padding row (greedy, every
    filter and penalty off). The fields a request sets carry SamplingParams' names (top-k in
    the device's form, NO_TOP_K for none); ``uniform`` and ``slot`` are set per step."""

    temperature: F32 = 0.0
    top_k: I32 = NO_TOP_K
    top_p: F32 = 1.0
    min_p: F32 = 0.0
    repetition_penalty: F32 = 1.0
    presence_penalty: F32 = 0.0
    frequency_penalty: F32 = 0.0
    greedy: I32 = 1  # SamplingParams.greedy: the device reads this, never the temperature
    inv_temperature: F32 = 1.0  # float32 1 / temperature (IEEE, as on the device); greedy: 1
    uniform: F32 = 0.5  # this step's draw (``randomness.key_uniforms``)
    slot: I32 = 0  # the row's slot in the per-slot tables

    @classmethod
    def of(cls, p: SamplingParams, **per_step: Any) -> RowSampling:
        """A request's row (``per_step``: its uniform and slot, where known)."""
        row = cls(**{name: getattr(p, name) for name in _FROM_PARAMS}, **per_step)
        inv_t = 1.0 if p.greedy else float(np.float32(1.0) / np.float32(p.temperature))
        return replace(row, top_k=p.top_k or NO_TOP_K, greedy=int(p.greedy),
                       inv_temperature=inv_t)


_FROM_PARAMS = [f.name for f in fields(RowSampling)
                if f.name in SamplingParams.__dataclass_fields__]  # set by a request
ROW_DTYPE = np.dtype([(f.name, {F32: np.float32, I32: np.int32}[f.type])
                      for f in fields(RowSampling)])  # one packed row
RowField = enum.IntEnum("RowField", {f.name.upper(): i for i, f in enumerate(fields(RowSampling))})
ROW_WORDS = len(RowField)


def row_array(rows: list[RowSampling]) -> np.ndarray:
    """(len(rows),) ROW_DTYPE: the rows packed."""
    return np.array([astuple(r) for r in rows], dtype=ROW_DTYPE).reshape(len(rows))


class RowParams:
    """A batch's per-row sampling inputs on the device: ``block`` (B, ROW_WORDS) int32, row r
    holding batch row r's RowSampling words in field order (float fields by their bits).
    Each field is a (B,) view by its name, float32 or int32 as the schema declares it;
    assigning a field writes its column. The fused kernels read ``block`` through one pointer
    with the field offsets as constants."""

    __slots__ = ("block",)

    def __init__(self, block: torch.Tensor) -> None:
        if block.dtype != torch.int32 or block.dim() != 2 or block.shape[1] != ROW_WORDS:
            raise ValueError(f"RowParams: block {tuple(block.shape)} {block.dtype}; must be "
                             f"(rows, {ROW_WORDS}) int32")
        self.block = block

    @classmethod
    def of(cls, rows: list[RowSampling] | np.ndarray, device: torch.device | str = "cpu"
           ) -> RowParams:
        """The packed rows (RowSampling rows, or a ROW_DTYPE array) on ``device``."""
        packed = np.ascontiguousarray(rows if isinstance(rows, np.ndarray) else row_array(rows))
        words = packed.view(np.int32).reshape(len(packed), ROW_WORDS)
        return cls(to_device(torch.from_numpy(words), device))

    def sampling(self) -> torch.Tensor:
        return self.greedy == 0

    def inv_t(self) -> torch.Tensor:
        return self.inv_temperature


def _column(index: int, is_int: bool) -> property:
    def get(self: RowParams) -> torch.Tensor:
        return (self.block if is_int else self.block.view(torch.float32))[:, index]

    def put(self: RowParams, value: torch.Tensor) -> None:
        get(self).copy_(value)

    return property(get, put)


for _f in fields(RowSampling):  # RowParams.temperature, .top_k, ...: the schema's fields
    setattr(RowParams, _f.name, _column(RowField[_f.name.upper()], _f.type == I32))
