"""What every notebook's parameters cell holds, validated in one place.

Each phase's ``notebook.NotebookParams`` subclasses :class:`NotebookParams` and declares its
fields with :func:`param`: a default, a one-line description and what the field accepts
(:class:`Allowed`, kept as field metadata). The base class checks every field against its
``Allowed`` and ``python -m decodelab params`` lists the same ``Allowed`` in words, so the check
and the listing cannot drift. Checks that span fields go in :meth:`NotebookParams.check`.
``NOTEBOOK`` names the notebook in error messages (``02_replay.p_stop=2: ...``).

In a notebook, the cell after the parameters builds the dataclass with
:meth:`NotebookParams.from_cell`; a bad value then ends that cell with one line, the message
the command line prints, instead of a traceback through the library. There ``interactive``
becomes False in a batch run (:func:`batch_run`: papermill, ``decodelab run``/``report``,
nbconvert), where no one can move a slider, whatever the cell or the run set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from decodelab.core.precision import AUTO as DTYPE_AUTO
from decodelab.core.precision import CHOICES as DTYPE_CHOICES
from decodelab.core.profiles import AUTO, CHOICES, measured_device, resolve_profile
from decodelab.core.validate import ConfigError


@dataclass(frozen=True, slots=True)
class Allowed:
    """What one parameter accepts. ``choices`` may be a function (a listing of folders, read
    when checked); otherwise bools are True/False and numbers lie in [low, high] (``low_open``:
    (low, high]). ``what`` names a choice list in words (``a folder of data/reference/``)."""

    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    what: str = ""

    def options(self) -> tuple[Any, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def describe(self, default: Any) -> str:
        options = self.options()
        if options is not None:
            listed = ", ".join(repr(o) for o in options) or "(none)"
            return f"{self.what}: {listed}" if self.what else f"one of {listed}"
        if isinstance(default, bool):
            return "True or False"
        kind = "an integer" if isinstance(default, int) else "a number"
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low}"
        return f"{kind} in {'(' if self.low_open else '['}{self.low}, {self.high}]"

    def admits(self, value: Any, default: Any) -> bool:
        options = self.options()
        if options is not None:  # type and value: True must not pass for 1, nor 1 for 1.0
            return any(type(value) is type(o) and value == o for o in options)
        if isinstance(default, bool) or isinstance(value, bool):
            return isinstance(default, bool) and isinstance(value, bool)
        if not isinstance(value, int | float) or (isinstance(default, int)
                                                  and not isinstance(value, int)):
            return False
        too_low = self.low is not None and (value <= self.low if self.low_open
                                            else value < self.low)
        too_high = self.high is not None and value > self.high
        return not (too_low or too_high or value != value)  # value != value: NaN


def param(default: Any, doc: str, **allowed: Any) -> Any:
    """A notebook parameter: its default, a one-line description, and ``Allowed(**allowed)``."""
    return dataclasses.field(default=default,
                             metadata={"doc": doc, "allowed": Allowed(**allowed)})


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One line of ``python -m decodelab params``."""

    name: str
    type: str
    default: Any
    allowed: str
    doc: str


class ParameterError(ConfigError):
    """A bad parameter met inside a notebook kernel. IPython asks an exception for
    ``_render_traceback_`` before it formats one, so the cell (and papermill's error) shows
    the command line's one-line message and no frames of the library."""

    def _render_traceback_(self) -> list[str]:
        return [f"error: {self}"]


def batch_run() -> bool:
    """True where no person can answer the notebook: outside a kernel, or in a kernel whose
    current request accepts no input. papermill, nbclient and nbconvert send every cell with
    ``allow_stdin=False``; JupyterLab, Colab and VS Code send it with True."""
    import sys

    ipython = sys.modules.get("IPython")
    kernel = getattr(ipython.get_ipython(), "kernel", None) if ipython else None
    if kernel is None:
        return True
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else kernel._parent_header
    return not parent.get("content", {}).get("allow_stdin", False)


@dataclass(frozen=True, slots=True)
class NotebookParams:
    NOTEBOOK: ClassVar[str] = "notebook"

    profile: str = param(AUTO, "auto: gpu with a CUDA device, else cpu; smoke: tiny sizes",
                         choices=CHOICES)
    interactive: bool = param(True, "sliders and widgets (False under papermill: static figures)")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value, allowed = getattr(self, field.name), field.metadata.get("allowed")
            if allowed is None:
                raise TypeError(f"{type(self).__name__}.{field.name}: declare it with "
                                "decodelab.core.params.param(default, doc, ...)")
            if not allowed.admits(value, field.default):
                kind = "" if type(value) is type(field.default) else f" ({type(value).__name__})"
                raise ConfigError(f"{self.NOTEBOOK}.{field.name}={value!r}{kind}: must be "
                                  f"{allowed.describe(field.default)}")
        if self.profile == AUTO:  # the hardware decides, here and nowhere else
            object.__setattr__(self, "profile", resolve_profile(AUTO))
        measured_device(self.profile, f"{self.NOTEBOOK}.profile")  # gpu needs CUDA
        self.check()

    def check(self) -> None:
        """Checks that span several fields (none here)."""

    @classmethod
    def from_cell(cls, namespace: Mapping[str, Any]) -> NotebookParams:
        """Build from the notebook's globals (the parameters cell, after papermill's injection);
        ``interactive`` is False in a :func:`batch_run`.

        A bad or missing value raises :class:`ParameterError`: one line in the notebook."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in namespace]
        try:
            if missing:
                raise ConfigError(f"{cls.NOTEBOOK}: the parameters cell lacks {missing[0]!r}")
            params = cls(**{n: namespace[n] for n in names})
        except ConfigError as exc:
            raise ParameterError(str(exc)) from None
        if params.interactive and batch_run():  # no one to move the sliders: static figures
            object.__setattr__(params, "interactive", False)
        return params

    @classmethod
    def describe(cls) -> list[ParamInfo]:
        """Every parameter with its type, default, what it accepts and what it does."""
        return [ParamInfo(f.name, type(f.default).__name__, f.default,
                          f.metadata["allowed"].describe(f.default), f.metadata["doc"])
                for f in dataclasses.fields(cls)]


@dataclass(frozen=True, slots=True)
class ModelParams(NotebookParams):
    """A notebook that runs the model (04_model, 04_runtime, 06_multi_gpu) also takes its
    ``dtype``, resolved here for the device the profile measures (``core.precision``)."""

    dtype: str = param(DTYPE_AUTO, "model dtype; auto: bfloat16 from sm_80, float16 below, "
                       "float32 on the CPU", choices=DTYPE_CHOICES)

    def __post_init__(self) -> None:
        from decodelab.core.device import run_dtype

        NotebookParams.__post_init__(self)
        object.__setattr__(self, "dtype", run_dtype(self.dtype, measured_device(self.profile),
                                                    f"{self.NOTEBOOK}.dtype"))
