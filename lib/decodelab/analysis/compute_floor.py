"""The physical floor of a decode step and the measured costs the compute split rests on.

The floor is ``max(bytes the step must move / read ceiling, FLOPs / matmul rate)``, both rates
measured (phase 0's ``environment`` table). A decode step's bytes are reads (weights, K/V), so
their ceiling is the read ceiling (:func:`decodelab.env.ceilings.read_ceiling`): at it, no kernel
can beat the floor. Where an origin has no read ceiling yet, the copy bandwidth (the
environment's, or the one the paged-model run measured itself) stands in: it counts a read and
a write of every byte, a read-only kernel can beat it, and every floor derived from it says
so. Kernels of a profile are classed by name through the paged model's kernel roles
(:data:`decodelab.model.analysis.ROLES`); a name no pattern matches is "other".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from decodelab.analysis.layers import Headline, MissingData, Tables, fmt_si, fmt_us, selector_of
from decodelab.analysis.regimes import graph
from decodelab.core.validate import ConfigError
from decodelab.env.ceilings import Ceiling, fastest_kernel_read, read_ceiling
from decodelab.model.analysis import role_of
from decodelab.replay.fit import fit_nodes
from decodelab.toy.step import named

NAN = math.nan
# Phase 0's matmul rate for a step's dtype (environment.quantity, TFLOP/s).
MATMUL_QUANTITY = {"float32": "matmul_fp32", "bfloat16": "matmul_bf16"}
OTHER = "other"  # norms, rotary, copies, embedding gathers, and any kernel not matched


def kernel_class(name: str) -> str:
    """"attention", "matmul" or :data:`OTHER`, from a profiled kernel's name."""
    role = role_of(name)
    return next((cls for cls in ("attention", "matmul") if role.startswith(cls)), OTHER)


def us_at(nbytes: float, gb_s: float) -> float:
    """µs to move ``nbytes`` at ``gb_s`` GB/s."""
    return nbytes / (gb_s * 1e3)


@dataclass(frozen=True, slots=True)
class Floor:
    """max(bytes / bandwidth, FLOPs / matmul rate) of one step, the bandwidth the read ceiling
    (or the copy bandwidth standing in, ``ceiling`` says which); ``tflop_s`` NaN where no
    matmul rate was measured (the bytes bound alone then)."""

    nbytes: float
    ceiling: Ceiling
    flops: float
    tflop_s: float
    rate_source: str  # the row of the matmul rate, or why there is none
    bytes_how: str  # the formula of the bytes
    flops_how: str

    @property
    def gb_s(self) -> float:
        return self.ceiling.gb_s

    @property
    def copy_source(self) -> str:  # the row of the bandwidth
        return self.ceiling.source

    @property
    def source(self) -> str:
        rate = [self.rate_source] if math.isfinite(self.tflop_s) else []
        return "; ".join([self.copy_source, *rate])

    @property
    def bytes_us(self) -> float:
        return us_at(self.nbytes, self.gb_s)

    @property
    def flops_us(self) -> float:
        return self.flops / (self.tflop_s * 1e6)

    @property
    def us(self) -> float:
        return self.bytes_us if math.isnan(self.flops_us) else max(self.bytes_us, self.flops_us)

    @property
    def how(self) -> str:
        flop_part = (f"{fmt_si(self.flops, 'FLOP')} / {self.tflop_s:,.4g} TFLOP/s = "
                     f"{fmt_us(self.flops_us)} µs" if math.isfinite(self.flops_us)
                     else f"no FLOPs bound ({self.rate_source})")
        bound = "bytes" if self.us == self.bytes_us else "FLOPs"
        caveat = f" ({self.ceiling.caveat})" if self.ceiling.caveat else ""
        return (f"max(bytes / {self.ceiling.name}, FLOPs / matmul rate), {bound}-bound: "
                f"{fmt_si(self.nbytes, 'B')} / {self.gb_s:,.4g} GB/s = {fmt_us(self.bytes_us)} "
                f"µs{caveat}; {flop_part}. Bytes = {self.bytes_how}; FLOPs = {self.flops_how}")


def ceiling_of(tables: Tables, origin: str | None = None, copy_gb_s: float = NAN,
               copy_source: str = "", backend: str = "cuda") -> Ceiling:
    """The read ceiling of ``origin`` (default: the tables' own) from its environment table, or
    the copy bandwidth standing in (``copy_gb_s`` where a run measured its own), with the
    caveat; MissingData where neither is known."""
    try:
        environment = tables.frame("environment")
    except MissingData:
        environment = None
    where = origin or tables.origin or ""
    found = read_ceiling(environment, where, backend, copy_gb_s, copy_source,
                         fastest_kernel_read(tables.frames, where))
    if not found.gb_s > 0:
        raise MissingData(f"no read ceiling or copy bandwidth for {origin or tables.origin} "
                          "(no data yet for table `environment` or the run's own copy)")
    return found


def ceiling_note(tables: Tables) -> str:
    """Which bandwidth the floors of this origin use, in a sentence for the report; where the
    copy bandwidth stands in for a read ceiling, the caveat and the command that measures it."""
    try:
        c = ceiling_of(tables)
    except MissingData:  # no floor at all: the split's own notes say what is missing
        return ""
    if not c.caveat:
        return (f"The floors use the read ceiling, {c.gb_s:,.0f} GB/s (`{c.source}`): the decode "
                "step's bytes are reads, and no kernel reads faster than that.")
    return (f"**Every floor here is at the copy bandwidth** ({c.gb_s:,.0f} GB/s, `{c.source}`; "
            "the transformer's at its own run's copy): "
            f"{c.caveat}. A kernel that only reads (a gemv over its weights, attention over the "
            "K/V) can therefore run under its floor, as chapter 04a shows where one does.")


def copy_stands_in(tables: Tables) -> bool:
    """Whether this origin's floors use the copy bandwidth for want of a read ceiling."""
    try:
        return not ceiling_of(tables).read_measured
    except MissingData:
        return False


def environment_rate(tables: Tables, quantity: str) -> tuple[float, str]:
    """A phase-0 ceiling of the GPU (``environment`` row ``quantity``, CUDA backend)."""
    row, src = tables.one("environment", {"quantity": quantity, "backend": "cuda"}, ["value"])
    value = float(row["value"])
    if not value > 0:
        raise MissingData(f"{src} has no positive value")
    return value, src


def matmul_rate(tables: Tables, dtype: str) -> tuple[float, str]:
    """The measured matmul rate for ``dtype`` (TFLOP/s), or NaN and why not."""
    quantity = MATMUL_QUANTITY.get(dtype)
    if quantity is None:
        return NAN, f"no matmul rate is measured for {dtype}"
    try:
        return environment_rate(tables, quantity)
    except MissingData as exc:
        return NAN, str(exc)


def toy_floor(tables: Tables, config: str) -> Floor:
    """The floor of one toy step: its weights read once, the embedding rows it gathers and its
    state read and written, at phase 0's read ceiling (or its copy bandwidth standing in); its
    FLOPs at phase 0's matmul rate."""
    cfg = named(config)
    h, n_layers, b, v = cfg.hidden, cfg.layers, cfg.batch, cfg.vocab
    elem = cfg.torch_dtype.itemsize
    nbytes = elem * (n_layers * (h * h + h) + h * v + 3 * b * h)
    ceiling = ceiling_of(tables)
    tflop_s, rate_src = matmul_rate(tables, cfg.dtype)
    return Floor(nbytes, ceiling, cfg.flops_per_step, tflop_s, rate_src,
                 f"{elem} B x (L(H² + H) weights and biases + HV output projection + BH "
                 f"embedding rows + 2BH state in and out), L={n_layers}, H={h}, V={v}, B={b}",
                 f"2BH(HL + V) (the layers and the output projection), {config}")


@dataclass(frozen=True, slots=True)
class KernelCost:
    """The fixed device time of one kernel of the toy graph, excluding the boundary to the
    next one (which the regime table counts as node)."""

    us: float
    source: str
    how: str


def toy_kernel_cost(tables: Tables, h: Headline) -> KernelCost:
    """c = T_node - node / kernels: T_node (phase 2's fit of graphs of n one-element kernels:
    the cost a kernel with no work adds inside a graph, its own time and the boundary to the
    next) minus the boundary part, read off the graph regime of the same toy config (its node
    term: fitted T_step(K->inf) - GPU-busy, over the step's kernels). Assumes the toy's
    boundaries cost what those of the one-element kernels cost."""
    nodes = tables.frame("replay_nodes", ["kind", "n_kernels", "wall_us"])
    nodes = nodes[nodes["kind"] == "graph"]
    try:
        t_node = float(fit_nodes(nodes, ("wall",))["slope"].iloc[0])
    except (ConfigError, IndexError, KeyError) as exc:
        raise MissingData(f"no per-kernel cost: the fit of replay_nodes failed ({exc})") from exc
    regime = graph(tables, h)
    node = next((t for t in regime.terms if t.layer == "node"), None)
    if node is None:
        raise MissingData("no per-kernel cost: the graph regime has no node term")
    row, src = tables.one("dispatch", {"mode": "cuda_graph", "config": h.toy_config,
                                       "backend": "cuda"}, ["kernels_per_step"])
    kernels = float(row["kernels_per_step"])
    cost = t_node - node.us / kernels
    if not cost > 0:
        raise MissingData(f"no per-kernel cost: the graph's node per kernel "
                          f"({fmt_us(node.us / kernels)} µs) is not below T_node "
                          f"({fmt_us(t_node)} µs)")
    nodes_src = selector_of("replay_nodes", tables.origin, {"kind": "graph"})
    return KernelCost(cost, f"fit of {nodes_src}; {node.source}; {src}",
                      f"c = T_node - node / kernels = {fmt_us(t_node)} - {fmt_us(node.us)} / "
                      f"{kernels:g} = {fmt_us(cost)} µs (T_node: a one-element kernel inside a "
                      "graph, its time and the boundary to the next; node: the graph regime's "
                      "kernel boundaries, which the regime table counts apart)")
