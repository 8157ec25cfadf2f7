"""The notebook pipeline: find notebooks, validate parameters, run through papermill, export.

The jupytext ``py:percent`` file ``notebooks/NN_name.py`` is the source; the paired ``.ipynb``
is kept in sync for JupyterLab users. Runs build the notebook from the ``.py`` so the two can
never disagree at run time. Each notebook's parameters are the fields of a params dataclass
(``NOTEBOOK_PARAMS``): their names, defaults and allowed values come from it, it validates them
before anything runs, and ``python -m decodelab params`` lists them from it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from decodelab.core import paths
from decodelab.core.params import NotebookParams
from decodelab.core.validate import ConfigError

NOTEBOOK_PARAMS: dict[str, str] = {
    "00_environment": "decodelab.env.notebook:NotebookParams",
    "01_dispatch": "decodelab.dispatch.notebook:NotebookParams",
    "02_replay": "decodelab.replay.notebook:NotebookParams",
    "03_persistent": "decodelab.persistent.notebook:NotebookParams",
    "04_model": "decodelab.model.notebook:NotebookParams",
    "04_runtime": "decodelab.engine.notebook:NotebookParams",
    "05_report": "decodelab.analysis.notebook:NotebookParams",
    "06_multi_gpu": "decodelab.parallel.notebook:NotebookParams",
}
CELL_TIMEOUT_S = 900  # seconds; the slowest cell (a GPU-profile sweep) takes a few minutes
_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


def available() -> list[str]:
    """Notebook names (``NN_name``) that exist as jupytext sources, in order."""
    return sorted(p.stem for p in paths.notebooks_dir().glob("*.py") if _NAME.match(p.stem))


def resolve(name: str) -> str:
    """Accept ``01_dispatch``, ``01`` or ``dispatch``; raise ConfigError listing the choices
    (also when a number names two notebooks, as ``04`` does)."""
    names = available()
    found = [full for full in names
             if name in (full, full[:2], full[3:], f"{full}.py", f"{full}.ipynb")]
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(f"notebook {name!r} is ambiguous: {', '.join(found)}")
    raise ConfigError(f"unknown notebook {name!r}; available: {', '.join(names) or '(none)'}")


def source_path(name: str) -> Path:
    return paths.notebooks_dir() / f"{name}.py"


def read_notebook(name: str):
    """The notebook built from its jupytext source."""
    import jupytext

    return jupytext.read(source_path(name))


def parameter_defaults(name: str) -> dict[str, Any]:
    """Names and default values of the ``parameters`` cell (plain literals only)."""
    text = source_path(name).read_text()
    match = re.search(r"^# %%.*tags=\[[^\]]*\"parameters\"[^\]]*\].*\n((?:(?!# %%).*\n)*)",
                      text, flags=re.M)
    if not match:
        raise ConfigError(f"notebook {name!r} has no cell tagged 'parameters'")
    defaults: dict[str, Any] = {}
    for node in ast.parse(match.group(1)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            defaults[node.targets[0].id] = ast.literal_eval(node.value)
    return defaults


def _coerce(name: str, key: str, raw: Any, default: Any) -> Any:
    """Turn a command-line string into the default's type, or say what was expected."""
    if not isinstance(raw, str) or isinstance(default, str) or default is None:
        return raw
    kind = type(default).__name__
    try:
        if isinstance(default, bool):
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError
            return lowered in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, list | tuple):
            value = ast.literal_eval(raw)
            if not isinstance(value, list | tuple):
                raise ValueError
            return list(value)
    except (ValueError, SyntaxError):
        raise ConfigError(f"notebook {name}: parameter {key}={raw!r} must be of type {kind} "
                          f"(default {default!r})") from None
    return raw


def validate_parameters(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Merge overrides into the dataclass defaults, check names and types, build the dataclass.

    Returns the full parameter dict that papermill will inject. Raises ConfigError.
    """
    params_cls = params_class(name)
    defaults = {f.name: f.default for f in dataclasses.fields(params_cls)}
    unknown = [k for k in overrides if k not in defaults]
    if unknown:
        raise ConfigError(f"notebook {name}: unknown parameter {unknown[0]!r}; "
                          f"allowed: {', '.join(defaults)}")
    merged = dict(defaults)
    for key, raw in overrides.items():
        merged[key] = _coerce(name, key, raw, defaults[key])
    params_cls(**merged)
    return merged


def params_class(name: str) -> type[NotebookParams]:
    """The dataclass holding notebook ``name``'s parameters (``NOTEBOOK_PARAMS``)."""
    target = NOTEBOOK_PARAMS.get(name)
    if target is None:
        raise ConfigError(f"notebook {name!r} has no parameters class; known: "
                          f"{', '.join(NOTEBOOK_PARAMS)}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def describe_parameters(name: str) -> str:
    """A table of the notebook's parameters: name, type, default, allowed values, and what
    each does, read from the same dataclass fields that validate them."""
    rows = params_class(name).describe()
    width = max(len(r.name) for r in rows)
    lines = [f"{name}  (python -m decodelab run {name} -p NAME VALUE)"]
    for r in rows:
        lines.append(f"  {r.name:<{width}}  {r.type:<5} default {r.default!r:<13} {r.allowed}")
        lines.append(f"  {'':<{width}}  # {r.doc}")
    return "\n".join(lines)


def run(name: str, overrides: dict[str, Any], out_dir: Path, *, progress: bool = True) -> Path:
    """Validate, then execute one notebook through papermill; return the executed notebook.

    The executed notebook is written to a temporary file and moved into place only when the
    run succeeds, so a failed run leaves no half-executed copy behind.
    """
    import nbformat
    import papermill as pm

    name = resolve(name)
    params = validate_parameters(name, overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.ipynb"
        nbformat.write(read_notebook(name), src)
        result = Path(tmp) / f"{name}.executed.ipynb"
        # A per-cell limit turns a stalled kernel into an error instead of a hung report run.
        pm.execute_notebook(str(src), str(result), parameters=params, kernel_name="python3",
                            cwd=str(paths.notebooks_dir()), progress_bar=progress,
                            execution_timeout=CELL_TIMEOUT_S)
        final = out_dir / f"{name}.ipynb"
        shutil.move(str(result), final)
    return final
