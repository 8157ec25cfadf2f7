"""Figure and table helpers shared by the notebooks (one submodule per phase).

Every figure in a notebook comes from a function here that a test can call; figures are saved
to ``figures/`` by :func:`save`. Colours come from :mod:`.palette` (one per quantity, origin
and mode), and every table is shown through :func:`show_table` (:mod:`.tables`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

from decodelab.core import paths
from decodelab.plots.palette import origin_color, origin_label, quantity_color
from decodelab.plots.tables import show_table

__all__ = ["origin_color", "origin_label", "quantity_color", "save", "show_table", "use_style"]


def use_style() -> None:
    """One look for every figure and table (a DataFrame displayed in a notebook is shown
    through :func:`show_table`)."""
    import seaborn as sns

    from decodelab.plots.tables import register_formatter

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 130, "figure.figsize": (8, 4.5)})
    register_formatter()


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

