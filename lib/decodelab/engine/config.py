"""The engine's switches and sizes, validated before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.core.validate import check_int


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Sizes and the runtime techniques, each switchable on its own.

    - ``use_graphs``: decode through the CUDA graph of the batch's bucket (needs ``graphs``).
    - ``async_output``: process a step's tokens one step later, after the next step has been
      launched (deferred synchronisation); off = wait for each step's tokens at once.
    - ``static_inputs``: fill preallocated device buffers from pinned mirrors; off = build
      fresh device tensors from host lists every step (allocation in the loop).
    - ``sync_phases``: synchronise after every phase so the per-step breakdown includes device
      time (a diagnostic; it defeats the overlap).
    """

    max_num_seqs: int = 32
    max_model_len: int = 2048
    max_prefill_tokens: int = 4096
    eos_token_id: int | None = None
    seed: int = 0
    max_partial_k: int = 1024  # largest top-k served by partial selection instead of a sort
    use_graphs: bool = True
    async_output: bool = True
    static_inputs: bool = True
    sync_phases: bool = False
    keep_steps: int = 100_000

    def __post_init__(self) -> None:
        own = "EngineConfig"
        check_int(own, "max_num_seqs", self.max_num_seqs, 1, 4096)
        check_int(own, "max_model_len", self.max_model_len, 2)
        check_int(own, "max_prefill_tokens", self.max_prefill_tokens, 1)
        if self.eos_token_id is not None:
            check_int(own, "eos_token_id", self.eos_token_id, 0)
        check_int(own, "seed", self.seed, 0, 2**40)
        check_int(own, "max_partial_k", self.max_partial_k, 0)
        check_int(own, "keep_steps", self.keep_steps, 1)
