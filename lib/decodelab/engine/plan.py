"""A scheduler's decision (:class:`SchedulePlan`), its one application to the block pool and the
queues (:func:`apply_plan`) and what issuing its step advances (:func:`advance`), shared by the
engine and the scheduler's tests. Imports no torch.

Applying a plan, in order: preempted sequences give their blocks back and wait again (they
keep their output and are recomputed when readmitted); decoding sequences gain the blocks
their next token needs; admitted sequences start running; every prefill :class:`Chunk` gains
the blocks of its tokens. What the engine keeps per row (slots, the static batch's tables) it
updates after this, from the plan. Once the step is issued, :func:`advance` counts its chunks'
tokens as computed and one more token launched for each row that samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodelab.engine.requests import Sequence, Status

if TYPE_CHECKING:
    from decodelab.model.block_pool import BlockPool


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prefill of tokens ``start .. start + tokens - 1`` of ``seq.all_tokens()`` (its prompt and
    output so far), whose K/V go to the cache; positions before ``start`` are there already."""

    seq: Sequence
    start: int
    tokens: int
    blocks: int  # blocks the sequence gains first

    @property
    def final(self) -> bool:
        """The last chunk of its prefill: its last position's logits give the next token (a
        prefilling sequence samples nothing before, so its output does not change)."""
        return self.start + self.tokens == self.seq.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    decode: tuple[tuple[Sequence, int], ...] = ()  # (sequence, blocks to add) in FCFS order
    prefill: tuple[Chunk, ...] = ()  # FCFS; an admitted sequence's first chunk among them
    admit: tuple[Sequence, ...] = ()  # waiting sequences that start running (FCFS)
    preempt: tuple[Sequence, ...] = ()  # newest first

    @property
    def tokens(self) -> int:
        """Tokens the step computes: one per decode row, plus the chunks'."""
        return len(self.decode) + sum(c.tokens for c in self.prefill)

    @property
    def sampled(self) -> list[Sequence]:
        """Rows that sample a token, in the order the engine streams them: the sequences of
        final chunks, then the decode rows."""
        return [c.seq for c in self.prefill if c.final] + [s for s, _ in self.decode]

    @property
    def blocks_allocated(self) -> int:
        return sum(n for _, n in self.decode) + sum(c.blocks for c in self.prefill)

    @property
    def blocks_freed(self) -> int:
        return sum(len(s.blocks) for s in self.preempt)


def apply_plan(plan: SchedulePlan, pool: BlockPool, running: list[Sequence],
               waiting: list[Sequence]) -> None:
    """Carry out ``plan`` on the pool and on the running and waiting lists (in place)."""
    for seq in plan.preempt:
        pool.free(seq.blocks)
        seq.blocks, seq.num_computed, seq.prefill_len = [], 0, 0
        running.remove(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        waiting.append(seq)
    for seq, n in plan.decode:
        if n:
            seq.blocks += pool.allocate(n)
    for seq in plan.admit:
        seq.status, seq.prefill_len = Status.RUNNING, seq.num_tokens
        waiting.remove(seq)
        running.append(seq)
    for chunk in plan.prefill:
        if chunk.blocks:
            chunk.seq.blocks += pool.allocate(chunk.blocks)


def advance(plan: SchedulePlan) -> None:
    """Once ``plan``'s step has been issued: its chunks' tokens and each decode row's input
    token are computed, and each row that samples has one more token launched."""
    for seq, _ in plan.decode:
        seq.num_computed += 1
        seq.launched += 1
    for chunk in plan.prefill:
        chunk.seq.num_computed += chunk.tokens
        chunk.seq.launched += int(chunk.final)
