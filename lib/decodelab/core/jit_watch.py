"""Triton kernels specialised while a block runs: each is a cold shape that a serving loop pays
at that step (a compile of 0.3-1 s, or a load from Triton's disk cache).

Triton compiles a kernel once per specialisation: its constexprs and, for every integer
argument not marked ``do_not_specialize``, whether it is 1 or a multiple of 16. An argument
that follows a step's shape (a prefill pack's token count or table width) makes a new
specialisation whenever the shape first meets such a value, at a random step long after the
warm-up. Watching the compiles tells that apart from any other slow step:

    with JitCompiles() as compiles:
        ...                          # the measured run, after its warm-up
    compiles.count, compiles.kernels  # how many, and which kernels (name: count)

It hooks Triton's ``knobs.runtime.jit_post_compile_hook`` (called after every new
specialisation) for the block and puts back any hook that was there. Where Triton is missing,
or has no such hook, ``count`` is None: nothing could be watched.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field


def _runtime_knobs():
    """Triton's runtime knobs, or None (no Triton, or one without the hook)."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if hasattr(runtime, "jit_post_compile_hook") else None


@dataclass
class JitCompiles:
    """Triton specialisations made inside the block (module docstring)."""

    kernels: Counter[str] = field(default_factory=Counter)  # kernel name -> specialisations
    watched: bool = False
    _runtime: object = None
    _previous: object = None

    @property
    def count(self) -> int | None:
        return sum(self.kernels.values()) if self.watched else None

    def __enter__(self) -> JitCompiles:
        self._runtime = _runtime_knobs()
        if self._runtime is not None:
            self._previous = self._runtime.jit_post_compile_hook
            self._runtime.jit_post_compile_hook = self._hook
            self.watched = True
        return self

    def __exit__(self, *exc) -> None:
        if self._runtime is not None:
            self._runtime.jit_post_compile_hook = self._previous
            self._runtime = None

    def _hook(self, *, fn, **kwargs):
        self.kernels[getattr(fn, "name", str(fn))] += 1
        return self._previous(fn=fn, **kwargs) if self._previous is not None else None

    def describe(self) -> str:
        """``'2 (_attn_rows_kernel 2)'``, ``'0'``, or ``'not watched'``."""
        if not self.watched:
            return "not watched"
        if not self.kernels:
            return "0"
        return f"{self.count} ({', '.join(f'{k} {n}' for k, n in self.kernels.most_common())})"
