"""Figure helpers shared by the notebooks (one submodule per phase).

Every figure in a notebook comes from a function here that a test can call; figures are saved
to ``figures/`` by :func:`save`.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

from decodelab.core import paths


def use_style() -> None:
    """One look for every figure."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 130, "figure.figsize": (8, 4.5)})


def save(fig, name: str, folder: Path | None = None) -> Path:
    """Save ``fig`` as ``figures/NAME.png`` (atomically) and return the path."""
    import os
    import tempfile

    folder = folder if folder is not None else paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.png"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".png", dir=folder)
    os.close(fd)
    try:
        fig.savefig(tmp, bbox_inches="tight", format="png")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def origin_label(origin: str) -> str:
    """'reference/h200' -> 'H200 (shipped reference)', 'local' -> 'this machine'."""
    if origin.startswith("reference/"):
        return f"{origin.split('/', 1)[1].upper()} (shipped reference)"
    return "this machine"
