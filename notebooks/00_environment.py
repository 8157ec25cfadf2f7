# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Environment: what we run on, and the ceilings
#
# Every later figure is compared with a ceiling measured here: how long the host needs to issue
# one tiny kernel (the unit of *dispatch* cost), how fast device memory can be streamed (the
# *memory-bandwidth* floor of a decode step), and how fast the matrix units run (the *compute*
# floor). Datasheet numbers are leads; these are measurements on this machine, next to the
# shipped H200 reference.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
calibrate_live = True  # measure this machine's ceilings (False: stored results only)

# %%
import pandas as pd
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.core.device import collect_info
from decodelab.core.results import has_table, load_table, to_frame, write_table
from decodelab.env.calibrate import calibrate
from decodelab.env.notebook import NotebookParams
from decodelab.plots.environment import ceilings_figure

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## The machine

# %%
info = collect_info()
to_frame([info]).T.rename(columns={0: "value"})

# %% [markdown]
# ## Calibrations
#
# Measured now on this machine (written to `data/local/environment.csv`), merged with the
# shipped reference results in `data/reference/<device>/environment.csv`. `value` is the median
# over repeats; `q1`/`q3` show the spread.

# %%
if params.calibrate_live:
    write_table("environment", calibrate(params.calibration), config=params.calibration,
                profile=params.profile)
table = load_table("environment") if has_table("environment") else pd.DataFrame()
if table.empty:
    display(Markdown("No calibration results yet: run with `calibrate_live=True`."))
else:
    display(table[["origin", "device", "quantity", "value", "unit", "q1", "q3", "detail"]])

# %%
if not table.empty:
    fig = ceilings_figure(table)
    plots.save(fig, "environment_ceilings")

# %% [markdown]
# ## What the ceilings mean for the phases that follow
#
# - **Launch cost** (`launch_host`, `launch_wall`; on a CPU `op_dispatch_overhead`) is what an
#   eager decode step pays per kernel on the host. A step of a few dozen tiny kernels costs that
#   many launches, whatever the arithmetic: phase 1 measures when this dominates.
# - **Copy bandwidth** (`d2d_copy_bandwidth`, bytes read + written) bounds a memory-bound decode
#   step from below: a step that must read W bytes of weights and KV cache cannot beat
#   W / bandwidth. Phase 4 reports its decode as a percentage of this roofline.
# - **Matmul rate** (`matmul_bf16`, `matmul_fp32`) bounds compute-heavy work (large batches,
#   prefill).

# %%
def _summary(frame: pd.DataFrame) -> str:
    lines = []
    for origin, rows in frame.groupby("origin"):
        parts = [f"{r.quantity} = {r.value:,.2f} {r.unit}" for r in rows.itertuples()]
        lines.append(f"- **{plots.origin_label(origin)}** ({rows['device'].iloc[0]}): "
                     + "; ".join(parts))
    return "\n".join(lines)


if not table.empty:
    display(Markdown(_summary(table)))
