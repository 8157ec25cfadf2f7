"""Notebook 01_dispatch: its parameters and the helpers it calls (measurement with progress,
the per-origin views of table ``dispatch``, the prose built from them, the explorer's points)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 01_dispatch (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "01_dispatch"

    measure_live: bool = param(True, "measure this machine (without CUDA: eager on the CPU "
                                     "backend)")


def measure(profile: str) -> tuple[list, list[str]]:
    """Validate and time every point of the profile's plan, with a progress bar where a person
    watches (a notebook widget in JupyterLab; none in a batch run, whose executed notebook and
    report would keep the widget's first frame, 0%): (rows, failures)."""
    import torch
    from tqdm.auto import tqdm

    from decodelab.core.params import batch_run
    from decodelab.dispatch.bench import DispatchBenchConfig, points, run

    plan = DispatchBenchConfig.for_profile(profile)
    with tqdm(total=2 * len(points(plan)), desc="dispatch points (time, then profile)",
              unit="pt", disable=batch_run()) as bar:
        def log(line: str) -> None:
            bar.update(1)
            bar.set_postfix_str(line.removeprefix("[dispatch] ")[:60], refresh=False)

        with torch.no_grad():
            rows, failures = run(plan, log=log)
    return rows, failures


def measure_and_store(profile: str) -> list[str]:
    """Measure, write table ``dispatch`` under ``data/local/`` and return the failures."""
    from decodelab.core.results import write_table
    from decodelab.dispatch.bench import TABLE, DispatchBenchConfig

    rows, failures = measure(profile)
    if rows:
        write_table(TABLE, rows, config=DispatchBenchConfig.for_profile(profile),
                    profile=profile)
    return failures


def load() -> pd.DataFrame:
    """Every stored copy of table ``dispatch`` (reference and this machine), or an empty one."""
    from decodelab.core.results import stored_tables
    from decodelab.dispatch.bench import TABLE

    return stored_tables([TABLE]).get(TABLE, pd.DataFrame())


def by_backend(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(GPU rows, CPU-backend rows) of the table."""
    if table.empty:
        return table, table
    return table[table["backend"] == "cuda"], table[table["backend"] == "cpu"]


def origins(frame: pd.DataFrame) -> list[str]:
    """The origins of a frame, shipped references first, in a stable order."""
    if frame.empty:
        return []
    return sorted(frame["origin"].unique(), key=lambda o: (o == "local", o))


def sources(table: pd.DataFrame) -> pd.DataFrame:
    """Rows per origin, device and backend: what the figures below are made of."""
    return table.groupby(["origin", "device", "backend"]).size().rename("rows").reset_index()


def slug(origin: str) -> str:
    """An origin as part of a file name: ``reference/h200`` -> ``reference_h200``."""
    return origin.replace("/", "_")


def ratio_lines(ratios: pd.DataFrame, seed_ratio: float) -> str:
    """One Markdown line per named config and origin: host CPU and wall, eager / graph."""
    from decodelab.core.results import origin_label

    return "\n".join(
        f"- **{r['config']}** ({origin_label(r['origin'])}): host CPU {r['host_ratio']:.1f}x "
        f"lower with a graph, wall {r['wall_ratio']:.2f}x (seed: ~{seed_ratio:g}x host CPU)"
        for _, r in ratios.iterrows())


def per_op(cpu: pd.DataFrame) -> pd.DataFrame:
    """CPU-backend rows with the host cost per ATen operator (host time / ops per step)."""
    out = cpu.assign(us_per_op=cpu["host_us_per_step"] / cpu["kernels_per_step"])
    return out[["origin", "config", "hidden", "layers", "batch", "wall_us_per_step",
                "host_us_per_step", "kernels_per_step", "us_per_op"]]


def explorer_rows(gpu: pd.DataFrame, cpu: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series | None]:
    """The rows the explorer picks from (the first GPU origin's, else the CPU's) and its start
    point (the sweep's first row, else the first row)."""
    frame = gpu if not gpu.empty else cpu
    if frame.empty:
        return frame, None
    rows = frame[frame["origin"] == origins(frame)[0]]
    sweep = rows[rows["config"] == "sweep"]
    return rows, (sweep.iloc[0] if not sweep.empty else rows.iloc[0])


def shown_as(rows: pd.DataFrame, point: pd.Series) -> str | None:
    """The named config measured at the same (H, L, B) as ``point`` (already drawn in the
    per-config figure), or None."""
    same = rows[(rows["config"] != "sweep") & (rows["hidden"] == point["hidden"])
                & (rows["layers"] == point["layers"]) & (rows["batch"] == point["batch"])]
    return str(same["config"].iloc[0]) if not same.empty else None


def _hlb(row) -> str:
    return f"H={row['hidden']}, L={row['layers']}, B={row['batch']}"


def explorer_point(rows: pd.DataFrame, hidden: int, layers: int,
                   batch: int) -> tuple[pd.DataFrame, str]:
    """The rows (every mode) the explorer draws for the chosen (H, L, B) and a Markdown line
    saying what they are. The sweep varies one of H, L, B at a time, so most choices were not
    measured: then the nearest measured configuration (log distance) stands in, the line says
    so and lists what was measured at the chosen H."""
    from decodelab.dispatch.analysis import nearest_point

    point = nearest_point(rows, hidden, layers, batch)
    shown = point.drop_duplicates("mode").iloc[0]  # the row point_figure titles
    what = f"{_hlb(shown)} (`{shown['config']}`)"
    if (shown["hidden"], shown["layers"], shown["batch"]) == (hidden, layers, batch):
        return point, f"Measured: {what}."
    chosen = {"hidden": hidden, "layers": layers, "batch": batch}
    at_h = rows[rows["hidden"] == hidden].drop_duplicates(["layers", "batch", "config"])
    listed = "; ".join(f"L={r['layers']}, B={r['batch']} (`{r['config']}`)"
                       for _, r in at_h.sort_values(["layers", "batch"]).iterrows())
    return point, (f"**Not measured at {_hlb(chosen)}**: shown is the nearest measured "
                   f"configuration (log distance), {what}. Measured at H={hidden}: {listed}.")


def show_point(rows: pd.DataFrame, hidden: int, layers: int, batch: int,
               figure: Callable[[pd.DataFrame], object]) -> None:
    """One step of the explorer: :func:`explorer_point`'s line, then ``figure`` of its rows,
    shown under ``core.interact.DRAWING`` (one point at a time: matplotlib is not
    thread-safe, and JupyterLab may run two slider callbacks at once)."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    from decodelab.core.interact import DRAWING

    with DRAWING:
        point, line = explorer_point(rows, hidden, layers, batch)
        display(Markdown(line))
        figure(point)
        plt.show()
