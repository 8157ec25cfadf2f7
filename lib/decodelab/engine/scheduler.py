"""Continuous batching with chunked prefill under a token budget, first come first served: a
pure decision, applied by the engine.

Each step, :meth:`Scheduler.schedule` looks at the running and waiting sequences and the
number of free cache blocks and returns a :class:`~decodelab.engine.plan.SchedulePlan`.
A step computes at most ``max_num_batched_tokens`` tokens: one per decode row, the rest for
prefill chunks (vLLM's default policy). In FCFS order:

- ``decode``: running sequences that take one decode step, with the blocks each must gain
  so that the slot its step writes exists (their tokens are reserved first: every running
  row may decode, since the budget holds ``max_num_seqs`` tokens);
- ``prefill``: a chunk of each running sequence still being prefilled (what is left of its
  prompt and output, cut to the budget left), then of each admitted one;
- ``preempt``: running sequences (newest first) whose blocks are freed so that older ones
  can continue; they go back to waiting and are recomputed (prefilled again with their
  prompt and output so far) when blocks allow. The newest sequence left gives its own
  blocks back when it cannot decode; a chunk instead shrinks to the blocks that are free;
- ``admit``: waiting sequences (oldest first) that start running with their first chunk:
  the head of the queue may take a partial chunk, so a long prompt is split across steps.
  Without ``chunked_prefill`` a chunk is a whole prompt (plus output), admitted while it
  fits in the budget left, and always for the first admission of a step.

Paced prefill (``steady_prefill_tokens``, with ``chunked_prefill`` only): while rows decode
and the prompt tokens still to prefill (of the sequences being prefilled and the waiting
ones) fit in the budget those rows leave, a step prefills at most that many of them. A prompt
that arrives while rows decode is then spread over a few steps, each near a decode step,
instead of holding one step (and every decoding row's next token) for its whole prefill. A
larger backlog takes the whole budget, as without pacing: an offline burst or a server falling
behind is served for throughput. So does a step without decode rows: its prefill holds no row
back (an idle server's prompt is not delayed). A fixed small budget bounds the same step but
also slows admission under a backlog (lower throughput, a longer time to first token); pacing
bounds it only while the server keeps up.

A sequence being prefilled holds its row (slot) and the blocks of the tokens computed so far
plus this step's chunk; it samples its first token from its last chunk. The scheduler
mutates nothing and imports no torch, so it is property-tested on CPU. The engine (and the
tests) apply a plan with :func:`decodelab.engine.plan.apply_plan` and, once its step is
issued, :func:`decodelab.engine.plan.advance`.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from decodelab.core.validate import ConfigError, check_bool, check_int
from decodelab.engine.plan import Chunk, SchedulePlan
from decodelab.engine.requests import Sequence
from decodelab.model.block_pool import blocks_needed

# Tokens one step computes by default (EngineConfig's default too; vLLM serves with 2048-16384).
DEFAULT_TOKEN_BUDGET = 4096
# EngineConfig's default pace of prefill while the server keeps up. On the H200 (bench serve,
# Llama-3.2-1B) pacing to 512 tokens kept the offline throughput of the 4096-token budget
# (43.0k against 43.3k output tokens/s) and held inter-token latency p99 within 2.55-3.03x the
# median decode step at every online rate (the unpaced budget: 2.73-3.88x).
DEFAULT_STEADY_PREFILL = 512


def check_token_budget(owner: str, budget: object, max_num_seqs: int) -> None:
    """``max_num_batched_tokens`` must hold a decode token for each of ``max_num_seqs`` rows
    (vLLM's rule): then all running rows decode every step, and whenever a row is free at
    least one prefill token fits, so admission always makes progress."""
    try:
        check_int(owner, "max_num_batched_tokens", budget, max_num_seqs)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (max_num_seqs: every running row decodes one token per "
                          "step, and a prompt must still get one)") from None


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int
    max_num_seqs: int  # rows of one step (largest graph bucket); a prefilling row holds one
    max_model_len: int  # longest context of one sequence, in tokens
    max_num_batched_tokens: int = DEFAULT_TOKEN_BUDGET  # per step: decode rows + prefill tokens
    chunked_prefill: bool = True  # off: whole prompts, the first of a step past the budget
    steady_prefill_tokens: int | None = None  # paced prefill (module doc); None: off

    def __post_init__(self) -> None:
        own = "SchedulerConfig"
        check_int(own, "block_size", self.block_size, 1)
        check_int(own, "max_num_seqs", self.max_num_seqs, 1)
        check_int(own, "max_model_len", self.max_model_len, 2)
        check_token_budget(own, self.max_num_batched_tokens, self.max_num_seqs)
        check_bool(own, "chunked_prefill", self.chunked_prefill)
        if self.steady_prefill_tokens is not None:
            check_int(own, "steady_prefill_tokens", self.steady_prefill_tokens, 1)

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_needed(num_tokens, self.block_size)


@dataclass(slots=True)
class _Draft:
    """A plan being built: the blocks and prefill tokens left, and the choices so far."""

    free: int
    budget: int  # prefill tokens left (the decode rows' tokens are reserved already)
    victims: list[Sequence]  # running candidates not considered yet, oldest first
    decode: list[tuple[Sequence, int]] = field(default_factory=list)
    prefill: list[Chunk] = field(default_factory=list)
    admit: list[Sequence] = field(default_factory=list)
    preempt: list[Sequence] = field(default_factory=list)

    def drop(self, seq: Sequence) -> None:
        """Preempt ``seq``: its blocks, and its decode token if it decodes, are free again."""
        self.preempt.append(seq)
        self.free += len(seq.blocks)
        self.budget += int(not seq.prefilling)

    def make_room(self, need: int) -> None:
        """Preempt the newest candidates not considered yet until ``need`` blocks are free."""
        while need > self.free and self.victims:
            self.drop(self.victims.pop())

    def add_chunk(self, chunk: Chunk) -> None:
        self.prefill.append(chunk)
        self.free -= chunk.blocks
        self.budget -= chunk.tokens

    def plan(self) -> SchedulePlan:
        return SchedulePlan(tuple(self.decode), tuple(self.prefill), tuple(self.admit),
                            tuple(self.preempt))


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def can_decode(self, seq: Sequence) -> bool:
        """False once the device has been asked for every token this sequence may produce."""
        return (seq.launched < seq.params.max_new_tokens
                and seq.context_launched < self.config.max_model_len)

    def decode_need(self, seq: Sequence) -> int:
        """Blocks ``seq`` must gain before its next decode step (it writes position
        ``context_launched - 1``)."""
        return max(0, self.config.blocks_needed(seq.context_launched) - len(seq.blocks))

    def chunk_need(self, seq: Sequence, tokens: int) -> int:
        """Blocks ``seq`` must gain to prefill ``tokens`` more after its ``num_computed``."""
        return max(0, self.config.blocks_needed(seq.num_computed + tokens) - len(seq.blocks))

    def schedule(self, running: Seq[Sequence], waiting: Seq[Sequence], free_blocks: int
                 ) -> SchedulePlan:
        cands = sorted((s for s in running if s.prefilling or self.can_decode(s)),
                       key=lambda s: s.arrival)
        decoding = sum(not s.prefilling for s in cands)
        draft = _Draft(free_blocks, self.prefill_budget(running, waiting, decoding), cands)
        while draft.victims:
            seq = draft.victims.pop(0)
            if seq.prefilling:
                self._continue_prefill(seq, draft)
            else:
                self._decode(seq, draft)
        if not draft.preempt:
            # Recompute relieves pressure only if nothing new competes for the freed blocks.
            # Rows hold a slot until their last token is processed, decoding or not.
            self._admit(waiting, draft, len(running))
        return draft.plan()

    def prefill_budget(self, running: Seq[Sequence], waiting: Seq[Sequence], decoding: int
                       ) -> int:
        """Prefill tokens this step may compute: the budget the ``decoding`` rows leave, paced
        to ``steady_prefill_tokens`` while there are such rows and every prompt token still to
        prefill fits in it."""
        budget = self.config.max_num_batched_tokens - decoding
        steady = self.config.steady_prefill_tokens
        if (steady is None or steady >= budget or decoding == 0
                or not self.config.chunked_prefill):
            return budget
        pending = (sum(s.prefill_len - s.num_computed for s in running if s.prefilling)
                   + sum(s.num_tokens for s in waiting))
        return steady if pending <= budget else budget

    def _decode(self, seq: Sequence, draft: _Draft) -> None:
        need = self.decode_need(seq)
        draft.make_room(need)
        if need > draft.free:  # seq is the newest left: it gives its own blocks back and waits
            draft.drop(seq)
        else:
            draft.decode.append((seq, need))
            draft.free -= need

    def _continue_prefill(self, seq: Sequence, draft: _Draft) -> None:
        n = min(seq.prefill_len - seq.num_computed, draft.budget)
        if n <= 0:
            return  # the budget is spent: it keeps its row and blocks for the next step
        draft.make_room(self.chunk_need(seq, n))
        # The newest left takes what its blocks and the free ones hold (maybe nothing).
        n = min(n, (len(seq.blocks) + draft.free) * self.config.block_size - seq.num_computed)
        if n > 0:
            draft.add_chunk(Chunk(seq, seq.num_computed, n, self.chunk_need(seq, n)))

    def _admit(self, waiting: Seq[Sequence], draft: _Draft, rows: int) -> None:
        cfg = self.config
        for seq in sorted(waiting, key=lambda s: s.arrival):
            n = min(seq.num_tokens, draft.budget) if cfg.chunked_prefill else seq.num_tokens
            need = self.chunk_need(seq, n)
            if (rows + len(draft.admit) >= cfg.max_num_seqs or need > draft.free
                    or len(seq.output) != seq.launched  # outputs still in flight
                    or n <= 0 or (draft.admit and n > draft.budget)):
                break  # first come, first served: nobody overtakes the head of the queue
            draft.admit.append(seq)
            draft.add_chunk(Chunk(seq, 0, n, need))
