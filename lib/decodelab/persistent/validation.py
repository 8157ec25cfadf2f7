"""Validation of a persistent launch against the eager torch reference, before any timing:
identical tokens, exact steps (stop handling), states within a tolerance scaled to the
reference's magnitude."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.persistent import kernel
from decodelab.toy import step as toy


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


def _margin(weights: toy.ToyWeights, x0: torch.Tensor, ref: toy.Trajectory,
            expected: torch.Tensor, got: torch.Tensor, step: int, row: int) -> float:
    x_before = ref.states[step - 1, row:row + 1] if step > 0 else x0[row:row + 1]
    token = int(got[step, row])
    if not 0 <= token < weights.w_out.shape[1]:
        return float("nan")
    logits = toy.logits_of(weights, x_before)[0]
    return float(logits[expected[step, row]] - logits[token])


def compare(weights: toy.ToyWeights, x0: torch.Tensor, ref: toy.Trajectory,
            got: kernel.RunResult, stop: int = -1) -> Check:
    """Tokens must be identical, steps exact, states within toy.state_tolerance."""
    exp_tokens, exp_steps = reference_with_stop(ref, stop)
    tokens, steps = got.tokens.cpu(), got.steps.cpu()
    diff = (tokens != exp_tokens.cpu()).nonzero()
    first, margin = None, None
    if len(diff):
        first = (int(diff[0][0]), int(diff[0][1]))
        margin = _margin(weights, x0, ref, exp_tokens, tokens, *first)
    n_valid = int(exp_steps.max())
    tol = toy.state_tolerance(ref.states[:n_valid], torch.float32)
    err = 0.0
    if got.states is not None:
        mask = (exp_tokens[:n_valid] >= 0).to(ref.states.device)[..., None]
        err = float(((got.states[:n_valid] - ref.states[:n_valid]).abs() * mask).max())
    rows = torch.arange(ref.states.shape[1], device=ref.states.device)
    final_ref = ref.states[(exp_steps - 1).long().to(ref.states.device), rows]
    err = max(err, float((got.x_final - final_ref).abs().max()))
    return Check(first is None, bool(torch.equal(steps, exp_steps)), first, margin, err, tol)


def validate(weights: toy.ToyWeights, x0: torch.Tensor, ref: toy.Trajectory,
             kcfg: kernel.KernelConfig, stop: int = -1) -> Check:
    """Run ``len(ref.tokens)`` steps with states recorded and compare with the reference."""
    got = kernel.run(weights, x0, ref.tokens.shape[0], stop=stop, kcfg=kcfg, record_states=True)
    torch.cuda.synchronize()
    return compare(weights, x0, ref, got, stop)


def stop_token_for(ref: toy.Trajectory) -> int:
    """A stop token that row 0 emits part-way (so stopping is exercised), from the reference."""
    n_steps = ref.tokens.shape[0]
    return int(ref.tokens[n_steps // 3, 0])
