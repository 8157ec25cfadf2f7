"""A scheduler's decision (:class:`SchedulePlan`) and its one application to the block pool and the
queues (:func:`apply_plan`), shared by the engine and the scheduler's tests. Imports no torch.

Applying a plan, in order: preempted sequences give their blocks back and wait again (they
keep their output and are recomputed when readmitted); decoding sequences gain the blocks
their next token needs; admitted sequences get their blocks and start running. What the
engine keeps per row (slots, the static batch's tables) it updates after this, from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodelab.engine.requests import Sequence, Status

if TYPE_CHECKING:
    from decodelab.model.block_pool import BlockPool


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    decode: tuple[tuple[Sequence, int], ...] = ()  # (sequence, blocks to add) in FCFS order
    admit: tuple[tuple[Sequence, int], ...] = ()  # (sequence, blocks to allocate)
    preempt: tuple[Sequence, ...] = ()  # newest first

    @property
    def empty(self) -> bool:
        return not (self.decode or self.admit or self.preempt)

    @property
    def blocks_allocated(self) -> int:
        return sum(n for _, n in self.decode) + sum(n for _, n in self.admit)

    @property
    def blocks_freed(self) -> int:
        return sum(len(s.blocks) for s in self.preempt)


def apply_plan(plan: SchedulePlan, pool: BlockPool, running: list[Sequence],
               waiting: list[Sequence]) -> None:
    """Carry out ``plan`` on the pool and on the running and waiting lists (in place)."""
    for seq in plan.preempt:
        pool.free(seq.blocks)
        seq.blocks = []
        running.remove(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        waiting.append(seq)
    for seq, n in plan.decode:
        if n:
            seq.blocks += pool.allocate(n)
    for seq, n in plan.admit:
        seq.blocks = pool.allocate(n)
        seq.status = Status.RUNNING
        waiting.remove(seq)
        running.append(seq)
