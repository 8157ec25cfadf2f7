"""Validate a dispatch mode against the eager reference before it is timed.

A mode passes when, over ``n_steps`` chained steps from x0 and again after re-seeding the state
with a different x1 (which proves no value was frozen at capture or compile time), its tokens
equal the eager tokens exactly and its states stay within :func:`decodelab.toy.step.state_tolerance`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.core.validate import check_int
from decodelab.dispatch.modes import Stepper
from decodelab.toy import step as toy


class ModeMismatchError(AssertionError):
    """A fast path computed something other than the eager reference."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    mode: str
    n_steps: int  # chained steps per run (two runs: from x0, then from x1)
    max_state_err: float  # max |state - eager state| over both runs
    tolerance: float


def _run(stepper: Stepper, n_steps: int) -> toy.Trajectory:
    tokens, states = [], []
    for _ in range(n_steps):
        stepper()
        # Clones only here, for the comparison; the timed loop never copies outputs.
        tokens.append(stepper.token().clone())
        states.append(stepper.state().clone())
    return toy.Trajectory(torch.stack(tokens), torch.stack(states))


def _compare(mode: str, got: toy.Trajectory, ref: toy.Trajectory, what: str) -> tuple[float, float]:
    if not torch.equal(got.tokens, ref.tokens):
        bad = (got.tokens != ref.tokens).any(dim=1).nonzero()
        raise ModeMismatchError(f"mode {mode!r} ({what}): tokens differ from eager first at "
                                f"step {int(bad[0])} of {ref.tokens.shape[0]}")
    err = float((got.states.float() - ref.states.float()).abs().max())
    tol = toy.state_tolerance(ref.states, ref.states.dtype)
    if not err <= tol:
        raise ModeMismatchError(f"mode {mode!r} ({what}): states differ from eager by {err:.3g} "
                                f"> tolerance {tol:.3g}")
    return err, tol


def check_against_eager(stepper: Stepper, weights: toy.ToyWeights, x0: torch.Tensor,
                        x1: torch.Tensor, n_steps: int = 100) -> CheckResult:
    """Run ``stepper`` from x0, then re-seed it with x1; compare both runs to eager.

    Leaves the stepper re-seeded at x0, ready to be timed. Raises ModeMismatchError.
    """
    check_int("check_against_eager", "n_steps", n_steps, 1)
    errors, tols = [], []
    for what, start in (("from x0", x0), ("re-seeded with x1", x1)):
        stepper.reset(start)
        ref = toy.run_eager(weights, start, n_steps)
        err, tol = _compare(stepper.mode, _run(stepper, n_steps), ref, what)
        errors.append(err)
        tols.append(tol)
    stepper.reset(x0)
    return CheckResult(stepper.mode, n_steps, max(errors), min(tols))
