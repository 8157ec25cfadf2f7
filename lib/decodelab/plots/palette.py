"""One colour per quantity, per origin and per mode, the same in every figure.

A figure encodes one of these families by colour and the others by line style or marker, so a
colour never means two things in one report: green is device-busy time (the layered model's
compute term) wherever it appears, vermillion is dispatch, grey is time the GPU sat idle.
The hues are Okabe-Ito's colour-blind-safe set, extended with Tol's muted set for the
families that need more.
"""

from __future__ import annotations

from decodelab.core.results import origin_label  # noqa: F401 - the plots' name for it

# Quantities of a decode step: the five layers of T_step, communication across GPUs, and the
# measured views of a step they are computed from.
QUANTITY_COLORS: dict[str, str] = {
    "dispatch": "#d55e00",  # vermillion
    "replay": "#0072b2",  # blue
    "node": "#56b4e9",  # sky blue
    "orchestration": "#cc79a7",  # reddish purple
    "compute": "#009e73",  # bluish green
    "comm": "#e69f00",  # orange: the collectives across GPUs (T_comm)
    "communication": "#e69f00",
    "device busy": "#009e73",  # the same time as compute: GPU-busy is how compute is measured
    "GPU idle": "#bbbbbb",  # light grey: the GPU waits
    "host CPU": "#332288",  # indigo: the issuing thread
    "wall": "#000000",  # black: the clock the user sees
    "memory floor": "#888888",  # mid grey: bytes / measured bandwidth
    # The compute term's parts (analysis.layers.COMPUTE_PARTS), each named for what it is.
    "floor": "#888888",  # the memory floor, as a part of a step
    "kernel fixed cost": "#f0e442",  # yellow
    "latency chains": "#cc6677",  # rose
    "matmul above floor": "#117733",  # dark green
    "small kernels": "#bbcc33",  # pear: norms, rotary, copies
    "attention above floor": "#ee8866",  # salmon
    "kernel gaps": "#dddddd",  # pale grey: the device between kernels
    "kernel overlap": "#c49c94",  # (negative: drawn as zero)
    "above floor, not split": "#8c564b",  # brown
    "forward pass": "#009e73",  # the compute term, not split
    # The runtime loop's host phases (engine.metrics.PHASES other than forward, which is the
    # forward pass): one hue each, so that a stacked breakdown reads band by band.
    "schedule": "#4477aa",  # blue
    "prepare": "#66ccee",  # cyan
    "sample": "#aa3377",  # purple
    "update": "#997700",  # ochre
    "emit": "#cc79a7",  # the orchestration colour: the phase that carries most of it
    "sync wait": "#ffffff",  # white, hatched: the host blocked on the device
}

# Dispatch and run modes: ours eager and graph-captured, torch.compile, transformers', and the
# replay variant that reads its tokens back.
MODE_COLORS: dict[str, str] = {
    "eager": "#882255",  # wine
    "cuda_graph": "#44aa99",  # teal
    "graph": "#44aa99",
    "compile": "#999933",  # olive
    "compile_graphs": "#661100",  # brown
    "hf_dynamic": "#ee3377",  # magenta
    "hf_static": "#ddcc77",  # sand
    "readout": "#aa4499",  # purple: a graph replay that also copies its tokens to the host
}
# Where a row was measured: this machine, and each shipped reference in a fixed order.
_ORIGIN_FIXED = {"local": "#e41a1c", "reference/h200": "#377eb8", "reference/h200x2": "#4daf4a"}
_ORIGIN_CYCLE = ("#984ea3", "#ff7f00", "#a65628", "#f781bf", "#666666")
ORIGIN_MARKERS = "osD^v"


def quantity_color(name: str) -> str:
    """The colour of a quantity (a layer or a measured view of a step); KeyError names the
    known ones, so a figure cannot silently invent a colour."""
    try:
        return QUANTITY_COLORS[name]
    except KeyError:
        raise KeyError(f"no colour for quantity {name!r}; known: "
                       f"{', '.join(QUANTITY_COLORS)}") from None


def mode_color(mode: str) -> str:
    return MODE_COLORS.get(mode, "#666666")


def origin_color(origin: str) -> str:
    """This machine and the known references get fixed colours; any other reference folder one
    from a cycle, chosen by its name so that it is the same in every figure of a run."""
    if origin in _ORIGIN_FIXED:
        return _ORIGIN_FIXED[origin]
    return _ORIGIN_CYCLE[sum(origin.encode()) % len(_ORIGIN_CYCLE)]


def origin_marker(origins: list[str], origin: str) -> str:
    """A marker per origin, by its position among the origins of one figure."""
    return ORIGIN_MARKERS[origins.index(origin) % len(ORIGIN_MARKERS)]
