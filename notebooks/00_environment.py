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
# shipped H200 reference. Notebook `04_model` sets the real-shaped model's decode step against
# the bandwidth ceiling (its roofline); notebooks 01 and 02 set the toy step against the launch
# cost.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
calibrate_live = True  # measure this machine's ceilings (False: stored results only)

# %%
import pandas as pd
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.core.device import collect_info
from decodelab.core.results import has_table, load_table, write_table
from decodelab.env.calibrate import calibrate, spread_warning
from decodelab.env.ceilings import MEASURE, lacking_read_ceiling
from decodelab.env.notebook import NotebookParams, machine_table
from decodelab.plots import show_table
from decodelab.plots.environment import ceilings_figure, ceilings_markdown

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## The machine

# %%
show_table(machine_table(collect_info()))

# %% [markdown]
# ## Calibrations
#
# Measured now on this machine (written to `data/local/environment.csv`), merged with the
# shipped reference results in `data/reference/<device>/environment.csv`. The value is the
# median over repeats; the quartiles show the spread.

# %%
if params.calibrate_live:
    write_table("environment", calibrate(params.calibration), config=params.calibration,
                profile=params.profile)
table = load_table("environment") if has_table("environment") else pd.DataFrame()
if table.empty:
    display(Markdown("No calibration results yet: run with `calibrate_live=True`."))
else:
    display(show_table(table, {"origin": "source", "device": "device", "quantity": "quantity",
                               "value": "median", "q1": "first quartile",
                               "q3": "third quartile", "unit": "unit", "detail": "what is timed"},
                       formats={"unit": lambda u: "µs" if u == "us" else str(u)}))
    lacking = lacking_read_ceiling(table)
    if lacking:
        display(Markdown(
            "**No read ceiling** in " + ", ".join(plots.origin_label(o) for o in lacking)
            + " (calibrated before it was measured): the floors of read-dominated work there "
            "fall back to the copy bandwidth, which counts a read and a write of every byte, so "
            "a read-only kernel can beat them; every such floor says so. Measure it on the GPU "
            f"with `{MEASURE.format(device='<device>')}` (e.g. `h200`)."))
    local = table[table["origin"] == "local"]
    if not local.empty:
        spread = spread_warning(local)
        display(Markdown(
            "**This machine's calibrations are one sample.** Other processes share its cores "
            "and memory, so its ceilings move with their load from one run to the next (on a "
            "busy small host, several-fold), beyond the quartiles of one run: compare its "
            "figures with care, and re-run on an idle machine before trusting a digit."
            + (" Within this run: " + "; ".join(spread) + "." if spread else "")))

# %% [markdown]
# One comparison: every ceiling on one logarithmic axis, this machine's bar beside each shipped
# reference's, the value written at the end of each bar. The unit and which way is better are in
# each row's label; a host that issues a tiny operation in fewer µs and a device that copies
# more GB/s are both "faster".

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
# - **Read ceiling** (`read_bandwidth`, on a CPU `memory_read_bandwidth`: a sum over the same
#   bytes, bytes read per second) bounds a memory-bound decode step from below: a step that must
#   read W bytes of weights and KV cache cannot beat W / read ceiling. Notebook `04_model` reports
#   the real-shaped model's decode as a percentage of this roofline.
# - **Copy bandwidth** (`d2d_copy_bandwidth`, bytes read + written) moves every byte twice over
#   the same memory, so a read-only stream can beat it: it stands in for the read ceiling only
#   where none was measured (the floors then say so).
# - **Matmul rate** (`matmul_bf16`, `matmul_fp32`) bounds compute-heavy work (large batches,
#   prefill).

# %%
if not table.empty:
    display(Markdown(ceilings_markdown(table)))
