"""Where the project's data lives: the repository root, reference and local result folders."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # lib/decodelab


def repo_root() -> Path:
    """The checkout holding ``data/`` and ``notebooks/``.

    ``DECODELAB_ROOT`` wins; else the folder above ``lib/`` (an editable or PYTHONPATH install);
    else the current directory or one of its parents that has ``data/reference``.
    """
    env = os.environ.get("DECODELAB_ROOT")
    if env:
        return Path(env).resolve()
    above_lib = PACKAGE_DIR.parent.parent
    if (above_lib / "data" / "reference").is_dir():
        return above_lib
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "data" / "reference").is_dir():
            return folder
    return Path.cwd()


def reference_dir() -> Path:
    """The shipped reference results. ``DECODELAB_REFERENCE`` overrides (tests point it at an
    empty folder to reach the no-data paths)."""
    env = os.environ.get("DECODELAB_REFERENCE")
    return Path(env).resolve() if env else repo_root() / "data" / "reference"


def reference_folders() -> tuple[str, ...]:
    """Names of the folders in ``data/reference/`` (one per device or device group), sorted."""
    root = reference_dir()
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir())) if root.is_dir() else ()


def local_dir() -> Path:
    """Results of this machine's runs (git-ignored). ``DECODELAB_LOCAL`` overrides."""
    env = os.environ.get("DECODELAB_LOCAL")
    return Path(env).resolve() if env else repo_root() / "data" / "local"


def figures_dir() -> Path:
    """Where notebooks export figures. ``DECODELAB_FIGURES`` overrides (tests use a tmp dir)."""
    env = os.environ.get("DECODELAB_FIGURES")
    return Path(env).resolve() if env else repo_root() / "figures"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"
