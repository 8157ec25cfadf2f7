"""Phase 3: the toy decode loop in one persistent CUDA kernel (``kernels/persistent.cu``).

``run()`` executes N chained toy steps on the device in one launch (variants ``block``, ``grid``,
``cluster``, and their second versions ``*_v2`` with one reduction round per output column),
stopping on the device when a row emits the stop token. ``auto`` picks among the proven first
versions, and takes a ``*_v2`` kernel only for a launch it validated in this process. ``validate()`` checks a
variant against the eager torch reference on the same weights and device before anything is
timed; ``bench()`` measures steps/s per variant next to the phase-2 graph replay on the same
configurations, the barrier costs, and a latency model (stages x barrier + arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.core.validate import ConfigError, check_choice, check_int
from decodelab.toy import step as toy

PROVEN = ("block", "grid", "cluster")  # version 1 (kernels/persistent.cu)
VARIANTS = (*PROVEN, *(f"{v}_v2" for v in PROVEN))  # version 2: kernels/persistent_v2.cuh
VARIANT_CODES = {name: code for code, name in enumerate(VARIANTS)}  # as toyk::Variant
THREADS = (256, 512)
MAX_HIDDEN = 1024


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """How the persistent kernel is launched: variant, threads per block, blocks per row (0 = auto)."""

    variant: str = "auto"
    threads: int = 512
    group: int = 0

    def __post_init__(self) -> None:
        check_choice("KernelConfig", "variant", self.variant, ("auto", *VARIANTS))
        check_choice("KernelConfig", "threads", self.threads, THREADS)
        check_int("KernelConfig", "group", self.group, 0, 128)
        if kind_of(self.variant) == "block" and self.group > 1:
            raise ConfigError(f"KernelConfig.group={self.group}: the block variant uses one "
                              "block per row (group 0 or 1)")
        if kind_of(self.variant) == "cluster" and self.group > 16:
            raise ConfigError(f"KernelConfig.group={self.group}: a cluster holds at most 16 blocks")


def kind_of(variant: str) -> str:
    """The state exchange of a variant: 'block', 'grid' or 'cluster' (``*_v2`` share it)."""
    return variant.removesuffix("_v2")


def check_shape(cfg: toy.ToyConfig) -> None:
    """The kernels' shape limits (fp32; hidden a multiple of 4 up to 1024)."""
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
    info: dict  # launch plan: variant, group, blocks, threads, placements, smem bytes


def _ext():
    from decodelab.core.kernel_build import load_persistent

    return load_persistent().module


def cluster_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# Launches of a second-version kernel that passed validate() in this process (see _launch_key),
# and those that failed it or raised here (never eligible again in this process).
_VALIDATED: set[tuple] = set()
_FAILED: set[tuple] = set()


def _launch_key(cfg: toy.ToyConfig, kcfg: KernelConfig) -> tuple:
    return (kcfg.variant, cfg.hidden, cfg.layers, cfg.batch, cfg.vocab, kcfg.threads, kcfg.group)


def resolve_variant(cfg: toy.ToyConfig, kcfg: KernelConfig) -> str:
    """``auto``: ``block`` when one block keeps every weight on chip, else ``cluster`` on sm_90+
    (selected automatically when present), else ``grid`` — then the ``_v2`` kernel of that
    variant only if validate() passed for this very launch in this process."""
    if kcfg.variant != "auto":
        return kcfg.variant
    info = plan(cfg, KernelConfig("block", kcfg.threads))
    if info["ok"] and "global" not in (info["w_place"], info["wout_place"], info["e_place"]):
        base = "block"
    else:
        base = "cluster" if cluster_available() else "grid"
    v2 = f"{base}_v2"
    proven = _launch_key(cfg, KernelConfig(v2, kcfg.threads, kcfg.group)) in _VALIDATED
    return v2 if proven else base


def plan(cfg: toy.ToyConfig, kcfg: KernelConfig) -> dict:
    """The launch plan for a shape (needs the GPU: limits come from the device)."""
    check_shape(cfg)
    variant = kcfg.variant if kcfg.variant != "auto" else resolve_variant(cfg, kcfg)
    return dict(_ext().plan(cfg.hidden, cfg.layers, cfg.vocab, cfg.batch, VARIANT_CODES[variant],
                            kcfg.threads, kcfg.group), variant=variant)


def run(weights: toy.ToyWeights, x0: torch.Tensor, n_steps: int, *, stop: int = -1,
        kcfg: KernelConfig = KernelConfig(), record_states: bool = False) -> RunResult:
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
    tokens, steps, x_final, states, clock, info = _ext().run(
        weights.w, weights.b, weights.w_out, weights.embed, x0.contiguous(), n_steps, stop,
        VARIANT_CODES[variant], kcfg.threads, kcfg.group, record_states)
    return RunResult(tokens, steps, x_final, states if record_states else None, clock,
                     dict(info, variant=variant))


def reference_with_stop(ref: toy.Trajectory, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (N, B) with -1 after each row's first ``stop`` token, and steps (B,) per row."""
    tokens = ref.tokens.clone()
    n_steps, batch = tokens.shape
    steps = torch.full((batch,), n_steps, dtype=torch.int32)
    if stop >= 0:
        for row in range(batch):
            hits = (tokens[:, row] == stop).nonzero()
            if len(hits):
                steps[row] = int(hits[0]) + 1
                tokens[int(hits[0]) + 1:, row] = -1
    return tokens, steps


@dataclass(frozen=True, slots=True)
class Check:
    """Outcome of one validation run against the eager reference."""

    tokens_equal: bool
    steps_equal: bool
    first_mismatch: tuple[int, int] | None  # (step, row)
    margin: float | None  # reference logit(ref token) - logit(kernel token) at the mismatch
    max_state_err: float
    state_tol: float

    @property
    def ok(self) -> bool:
        return self.tokens_equal and self.steps_equal and self.max_state_err <= self.state_tol

    def describe(self) -> str:
        if self.ok:
            return f"ok (max state error {self.max_state_err:.2e} <= {self.state_tol:.2e})"
        parts = []
        if self.first_mismatch is not None:
            step, row = self.first_mismatch
            parts.append(f"token differs at step {step}, row {row} (reference logit margin of the "
                         f"two candidates {self.margin:.3g})")
        if not self.steps_equal:
            parts.append("steps taken differ")
        if self.max_state_err > self.state_tol:
            parts.append(f"state error {self.max_state_err:.2e} > tolerance {self.state_tol:.2e}")
        return "; ".join(parts)


def compare(weights: toy.ToyWeights, x0: torch.Tensor, ref: toy.Trajectory, got: RunResult,
            stop: int = -1) -> Check:
    """Tokens must be identical, steps exact, states within toy.state_tolerance."""
    exp_tokens, exp_steps = reference_with_stop(ref, stop)
    tokens, steps = got.tokens.cpu(), got.steps.cpu()
    diff = (tokens != exp_tokens.cpu()).nonzero()
    first, margin = None, None
    if len(diff):
        step, row = (int(v) for v in diff[0])
        first = (step, row)
        x_before = ref.states[step - 1, row:row + 1] if step > 0 else x0[row:row + 1]
        if 0 <= int(tokens[step, row]) < ref_vocab(weights):
            logits = toy.logits_of(weights, x_before)[0]
            margin = float(logits[exp_tokens[step, row]] - logits[tokens[step, row]])
        else:
            margin = float("nan")
    n_valid = int(exp_steps.max())
    tol = toy.state_tolerance(ref.states[:n_valid], torch.float32)
    err = 0.0
    if got.states is not None:
        mask = (exp_tokens[:n_valid] >= 0).to(ref.states.device)[..., None]
        err = float(((got.states[:n_valid] - ref.states[:n_valid]).abs() * mask).max())
    rows = torch.arange(ref.states.shape[1])
    final_ref = ref.states[(exp_steps - 1).long().to(ref.states.device), rows.to(ref.states.device)]
    err = max(err, float((got.x_final - final_ref).abs().max()))
    return Check(first is None, bool(torch.equal(steps, exp_steps)), first, margin, err, tol)


def ref_vocab(weights: toy.ToyWeights) -> int:
    return weights.w_out.shape[1]


def validate(weights: toy.ToyWeights, x0: torch.Tensor, ref: toy.Trajectory, kcfg: KernelConfig,
             stop: int = -1) -> Check:
    """Run ``len(ref.tokens)`` steps with states recorded and compare with the reference.

    A named second-version launch that passes becomes eligible for ``auto`` in this process;
    one that fails (or raises) is withdrawn."""
    cfg = toy.ToyConfig(hidden=x0.shape[1], layers=weights.w.shape[0], batch=x0.shape[0],
                        vocab=weights.w_out.shape[1])
    key = _launch_key(cfg, kcfg)
    _VALIDATED.discard(key)
    try:
        got = run(weights, x0, ref.tokens.shape[0], stop=stop, kcfg=kcfg, record_states=True)
        torch.cuda.synchronize()
    except Exception:
        _FAILED.add(key)
        raise
    check = compare(weights, x0, ref, got, stop)
    if not check.ok:
        _FAILED.add(key)
    elif kcfg.variant.endswith("_v2") and key not in _FAILED:
        _VALIDATED.add(key)
    return check


def stop_token_for(ref: toy.Trajectory) -> int:
    """A stop token that row 0 emits part-way (so stopping is exercised), from the reference."""
    n_steps = ref.tokens.shape[0]
    return int(ref.tokens[n_steps // 3, 0])
