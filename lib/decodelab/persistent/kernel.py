"""Phase 3: the toy decode loop in one persistent CUDA kernel (``kernels/persistent.cu``).

``run()`` executes N chained toy steps on the device in one launch, stopping on the device when a
row emits the stop token. A variant is ``<exchange>_<design>``: the state exchange between stages
(``block``, ``grid``, ``cluster``) times the design of a stage (``fixed``, ``wide``, ``narrow``
work splits, and ``wide_fold``/``narrow_fold`` with the embedding folded into the first layer);
all are one kernel body with these as policies. ``validate()`` checks a launch against the eager
torch reference on the same weights and device before anything is timed; ``run(clocked=True)``
runs the diagnostic build, which also returns cycles of work and barrier wait per stage.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from decodelab.core.validate import ConfigError, check_choice, check_int
from decodelab.persistent import library
from decodelab.persistent.library import DESIGNS, EXCHANGES, LaunchPlan
from decodelab.toy import step as toy

VARIANTS = tuple(f"{x}_{d}" for d in DESIGNS for x in EXCHANGES)  # code = design * 3 + exchange
VARIANT_CODES = {name: code for code, name in enumerate(VARIANTS)}
THREADS = (256, 512)
MAX_HIDDEN = 1024


def exchange_of(variant: str) -> str:
    """The state exchange of a variant: 'block', 'grid' or 'cluster'."""
    return variant.split("_", 1)[0]


def design_of(variant: str) -> str:
    return variant.split("_", 1)[1]


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """How the persistent kernel is launched: variant, threads per block, blocks per row (0 = auto)."""

    variant: str = "auto"
    threads: int = 256
    group: int = 0

    def __post_init__(self) -> None:
        check_choice("KernelConfig", "variant", self.variant, ("auto", *VARIANTS))
        check_choice("KernelConfig", "threads", self.threads, THREADS)
        check_int("KernelConfig", "group", self.group, 0, 128)
        if exchange_of(self.variant) == "block" and self.group > 1:
            raise ConfigError(f"KernelConfig.group={self.group}: the block exchange uses one "
                              "block per row (group 0 or 1)")
        if exchange_of(self.variant) == "cluster" and self.group > 16:
            raise ConfigError(f"KernelConfig.group={self.group}: a cluster holds at most 16 blocks")


def check_shape(cfg: toy.ToyConfig) -> None:
    """The kernels' shape limits (fp32; hidden a multiple of 4 up to 1024: float4 state loads)."""
    if cfg.dtype != "float32":
        raise ConfigError(f"ToyConfig.dtype={cfg.dtype!r}: the persistent kernels run 'float32'")
    if cfg.hidden % 4 or cfg.hidden > MAX_HIDDEN:
        raise ConfigError(f"ToyConfig.hidden={cfg.hidden}: the persistent kernels need a multiple "
                          f"of 4 in [4, {MAX_HIDDEN}]")


def check_stop(stop: int, vocab: int) -> None:
    check_int("persistent", "stop", stop, -1, vocab - 1)


@dataclass(frozen=True, slots=True)
class RunResult:
    tokens: torch.Tensor  # (N, B) int64, -1 after a row stopped
    steps: torch.Tensor  # (B,) int32 steps each row ran
    x_final: torch.Tensor  # (B, H) state after each row's last step
    states: torch.Tensor | None  # (N, B, H) when recorded
    clock: torch.Tensor  # (2,) int64: SM cycles (clock64) and ns (%globaltimer) of the step loop
    stages: torch.Tensor | None  # clocked: (L + 2, 2) int64 work, wait cycles summed over steps
    plan: LaunchPlan
    variant: str
    buffers: tuple[torch.Tensor, ...]  # device scratch the launch uses (kept alive with it)


_LIB: list[ctypes.CDLL] = []


def lib() -> ctypes.CDLL:
    """The kernels library for this GPU, built on first use (see core.kernel_build)."""
    if not _LIB:
        from decodelab.core.kernel_build import load_persistent

        _LIB.append(library.bind(str(load_persistent().path)))
    return _LIB[0]


def cluster_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _shape_args(cfg: toy.ToyConfig, n_steps: int = 1, stop: int = -1) -> library.ToyArgs:
    return library.ToyArgs(H=cfg.hidden, L=cfg.layers, V=cfg.vocab, B=cfg.batch, N=n_steps,
                           stop=stop)


def plan(cfg: toy.ToyConfig, kcfg: KernelConfig) -> LaunchPlan:
    """The launch plan for a shape (needs the GPU: limits come from the device)."""
    check_shape(cfg)
    variant = resolve_variant(cfg, kcfg)
    info = library.LaunchInfo()
    lib().toyk_plan(ctypes.byref(_shape_args(cfg)), VARIANT_CODES[variant], kcfg.threads,
                    kcfg.group, torch.cuda.current_device(), ctypes.byref(info))
    return library.plan_of(info)


def _on_chip(p: LaunchPlan, variant: str) -> bool:
    places = (p.w_place, p.wout_place) + ((p.e_place,) if exchange_of(variant) != "grid" else ())
    return p.ok and "global" not in places


def resolve_variant(cfg: toy.ToyConfig, kcfg: KernelConfig) -> str:
    """``auto``: the block exchange when one block keeps every weight on chip, else the cluster
    (sm_90), else the grid; with the fold where it plans (the fastest design of the H200
    reference on both named shapes), else ``wide``."""
    if kcfg.variant != "auto":
        return kcfg.variant
    exchanges = ["block"] + (["cluster"] if cluster_available() else ["grid"])
    for exchange in exchanges:
        group = 0 if exchange == "block" else kcfg.group
        for design in ("wide_fold", "wide"):
            variant = f"{exchange}_{design}"
            if _on_chip(plan(cfg, KernelConfig(variant, kcfg.threads, group)), variant):
                return variant
    return f"{exchanges[-1]}_wide"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned (the kernels read the state and E rows as float4)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def run(weights: toy.ToyWeights, x0: torch.Tensor, n_steps: int, *, stop: int = -1,
        kcfg: KernelConfig = KernelConfig(), record_states: bool = False,
        clocked: bool = False) -> RunResult:
    """``n_steps`` chained toy steps in one kernel launch (asynchronous: no sync here)."""
    from decodelab.core.device import require_cuda

    require_cuda("running the persistent kernels")
    check_int("persistent.run", "n_steps", n_steps, 1, 10_000_000)
    cfg = toy.ToyConfig(hidden=x0.shape[1], layers=weights.w.shape[0], batch=x0.shape[0],
                        vocab=weights.w_out.shape[1])
    check_shape(cfg)
    check_stop(stop, cfg.vocab)
    if weights.device.type != "cuda" or x0.device != weights.device:
        raise ConfigError(f"persistent.run: weights ({weights.device}) and x0 ({x0.device}) must "
                          "be on the same CUDA device")
    variant = resolve_variant(cfg, kcfg)
    p = plan(cfg, kcfg if kcfg.variant != "auto" else KernelConfig(variant, kcfg.threads))
    if not p.ok:
        raise RuntimeError(f"persistent kernel {variant}: {p.why}")
    opts = {"device": x0.device}
    batch, hidden, layers = cfg.batch, cfg.hidden, cfg.layers
    tokens = torch.full((n_steps, batch), -1, dtype=torch.int64, **opts)
    steps = torch.zeros(batch, dtype=torch.int32, **opts)
    x_final = torch.empty(batch, hidden, **opts)
    states = torch.empty(n_steps, batch, hidden, **opts) if record_states else None
    clock = torch.zeros(2, dtype=torch.int64, **opts)
    stages = torch.zeros(layers + 2, 2, dtype=torch.int64, **opts) if clocked else None
    scratch = torch.empty(batch * lib().toyk_scratch_floats(hidden, p.group, kcfg.threads), **opts)
    done = torch.zeros(1, dtype=torch.int32, **opts)
    w, b, w_out = (t.contiguous() for t in (weights.w, weights.b, weights.w_out))
    embed, x = _aligned(weights.embed), _aligned(x0)
    args = library.ToyArgs(_ptr(w), _ptr(b), _ptr(w_out), _ptr(embed), _ptr(x), _ptr(x_final),
                           _ptr(states), _ptr(tokens), _ptr(steps), _ptr(scratch), _ptr(done),
                           _ptr(clock), _ptr(stages), hidden, layers, cfg.vocab, batch, n_steps,
                           stop)
    info = library.LaunchInfo()
    lib().toyk_launch(ctypes.byref(args), VARIANT_CODES[variant], kcfg.threads, p.group,
                      int(clocked), torch.cuda.current_stream(x0.device).cuda_stream,
                      x0.device.index or 0, ctypes.byref(info))
    launched = library.plan_of(info)
    if not launched.ok:
        raise RuntimeError(f"persistent kernel {variant}: {launched.why}")
    return RunResult(tokens, steps, x_final, states, clock, stages, launched, variant,
                     (scratch, done, w, b, w_out, embed, x))


def barrier(kind: int, threads: int, blocks: int, iters: int, sink: torch.Tensor,
            clock: torch.Tensor) -> None:
    """Barrier microbenchmark: ``iters`` barriers of one kind (0 __syncthreads, 1 grid.sync,
    2 cluster.sync) in one kernel; ``clock`` (2,) int64 gets block 0's cycles and ns."""
    err = lib().toyk_barrier(kind, threads, blocks, iters, sink.data_ptr(), clock.data_ptr(),
                             torch.cuda.current_stream().cuda_stream, torch.cuda.current_device())
    if err:
        raise RuntimeError(f"barrier benchmark: {lib().toyk_error_string(err).decode()}")


def device_attrs() -> dict:
    return library.device_attrs(lib(), torch.cuda.current_device())
