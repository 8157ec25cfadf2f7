"""The engine's switches and sizes, validated before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.core.validate import ConfigError, check_bool, check_choice, check_int
from decodelab.engine.scheduler import (
    DEFAULT_STEADY_PREFILL,
    DEFAULT_TOKEN_BUDGET,
    check_token_budget,
)

SAMPLERS = ("auto", "fused", "torch")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Sizes and the runtime techniques, each switchable on its own.

    - ``max_model_len``: the longest context (prompt + output) of one sequence; None = what the
      KV pool and the model's positions allow. A larger value is refused when the engine
      starts (:meth:`context_limit`), never silently shrunk.
    - ``max_num_batched_tokens``: the tokens one step computes, one per decode row plus the
      prefill chunks' (vLLM's budget); at least ``max_num_seqs``, so every running row
      decodes each step and a free row always gets a prefill token.
    - ``chunked_prefill``: split prompts into chunks that fill the budget left by the decode
      rows, across steps (vLLM's default); off = whole prompts (plus output, on recompute),
      admitted while they fit in the budget, the first of a step even past it.
    - ``steady_prefill_tokens``: paced prefill (with ``chunked_prefill``; None = off, every
      step may take the whole budget, vLLM's policy). While rows decode and the prompt tokens
      still to prefill fit in one step's budget, a step prefills at most this many, so a
      prompt arriving while rows decode is spread over a few short steps and their inter-token
      latency stays near a decode step's; a larger backlog (an offline burst, a server falling
      behind) or a step without decode rows takes the whole budget. See ``scheduler``'s
      module doc.
    - ``use_graphs``: decode through the CUDA graph of the batch's bucket (needs ``graphs``).
    - ``async_output``: process a step's tokens one step later, after the next step has been
      launched (deferred synchronisation); off = wait for each step's tokens at once.
    - ``static_inputs``: fill preallocated device buffers from pinned mirrors; off = build
      fresh device tensors from host lists every step (allocation in the loop).
    - ``sync_phases``: synchronise after every phase so the per-step breakdown includes device
      time (a diagnostic; it defeats the overlap).
    - ``sampler``: 'fused' (the Triton kernels, CUDA only), 'torch' (the plain-torch
      reference), 'auto' (fused where it can run).
    - ``batch_invariant``: a request's tokens do not depend on what else is batched with it
      (its seed and parameters decide them alone); the engine then refuses a model whose
      logits depend on the batch (``PagedLlama(..., batch_invariant=True)`` serves it).
    """

    max_num_seqs: int = 32
    max_model_len: int | None = None
    max_num_batched_tokens: int = DEFAULT_TOKEN_BUDGET
    chunked_prefill: bool = True
    steady_prefill_tokens: int | None = DEFAULT_STEADY_PREFILL
    eos_token_id: int | None = None
    seed: int = 0
    max_partial_k: int = 1024  # largest top-k served by partial selection instead of a sort
    use_graphs: bool = True
    async_output: bool = True
    static_inputs: bool = True
    sync_phases: bool = False
    keep_steps: int = 100_000
    sampler: str = "auto"
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        own = "EngineConfig"
        check_int(own, "max_num_seqs", self.max_num_seqs, 1, 4096)
        if self.max_model_len is not None:
            check_int(own, "max_model_len", self.max_model_len, 2)
        check_token_budget(own, self.max_num_batched_tokens, self.max_num_seqs)
        if self.eos_token_id is not None:
            check_int(own, "eos_token_id", self.eos_token_id, 0)
        check_int(own, "seed", self.seed, 0, 2**40)
        check_int(own, "max_partial_k", self.max_partial_k, 0)
        check_int(own, "keep_steps", self.keep_steps, 1)
        check_choice(own, "sampler", self.sampler, SAMPLERS)
        for switch in ("chunked_prefill", "use_graphs", "async_output", "static_inputs",
                       "sync_phases", "batch_invariant"):
            check_bool(own, switch, getattr(self, switch))
        if self.steady_prefill_tokens is not None:
            check_int(own, "steady_prefill_tokens", self.steady_prefill_tokens, 1)

    def context_limit(self, vocab_size: int, pool_tokens: int, max_positions: int) -> int:
        """The longest context the engine serves, checked against the model and its KV pool
        (``pool_tokens``: what the pool can hold); raises ConfigError naming both numbers."""
        own = "EngineConfig"
        if self.eos_token_id is not None and self.eos_token_id >= vocab_size:
            raise ConfigError(f"{own}.eos_token_id={self.eos_token_id}: must be a token id in "
                              f"[0, {vocab_size - 1}] (the model's vocabulary has {vocab_size})")
        limit = min(pool_tokens, max_positions)
        if self.max_model_len is None:
            return limit
        for what, n in (("the KV pool holds", pool_tokens), ("the model has positions for",
                                                             max_positions)):
            if self.max_model_len > n:
                raise ConfigError(f"{own}.max_model_len={self.max_model_len}: {what} only {n} "
                                  f"tokens; must be in [2, {limit}] (or None for {limit})")
        return self.max_model_len
