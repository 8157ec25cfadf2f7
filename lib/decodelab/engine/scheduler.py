"""Continuous batching, first come first served: a pure decision, applied by the engine.

Each step, :meth:`Scheduler.schedule` looks at the running and waiting sequences and the
number of free cache blocks and returns a :class:`~decodelab.engine.plan.SchedulePlan`:

- ``decode``: running sequences that take one decode step, with the blocks each must gain
  so that the slot its step writes exists;
- ``preempt``: running sequences (newest first) whose blocks are freed so that older ones
  can continue; they go back to waiting and are recomputed (prefilled again with their
  prompt and output so far) when blocks allow;
- ``admit``: waiting sequences (oldest first) whose prompt is prefilled this step.

It mutates nothing and imports no torch, so it is property-tested on CPU. The engine (and
the tests) apply a plan with :func:`decodelab.engine.plan.apply_plan`.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from decodelab.core.validate import check_int
from decodelab.engine.plan import SchedulePlan
from decodelab.engine.requests import Sequence
from decodelab.model.block_pool import blocks_needed


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int
    max_num_seqs: int  # rows of one decode batch (largest graph bucket)
    max_model_len: int  # longest context of one sequence, in tokens
    max_prefill_tokens: int = 8192  # prompt tokens admitted per step (the first always fits)

    def __post_init__(self) -> None:
        check_int("SchedulerConfig", "block_size", self.block_size, 1)
        check_int("SchedulerConfig", "max_num_seqs", self.max_num_seqs, 1)
        check_int("SchedulerConfig", "max_model_len", self.max_model_len, 2)
        check_int("SchedulerConfig", "max_prefill_tokens", self.max_prefill_tokens, 1)

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_needed(num_tokens, self.block_size)


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

    def admit_need(self, seq: Sequence) -> int:
        """Blocks to prefill the whole known context (prompt + output: recompute)."""
        return self.config.blocks_needed(seq.num_prompt + len(seq.output))

    def schedule(self, running: Seq[Sequence], waiting: Seq[Sequence], free_blocks: int
                 ) -> SchedulePlan:
        cfg = self.config
        # Newest last; preemption takes from the end.
        candidates = sorted((s for s in running if self.can_decode(s)), key=lambda s: s.arrival)
        victims = list(candidates)  # newest last: preemption pops from the end
        decode: list[tuple[Sequence, int]] = []
        preempt: list[Sequence] = []
        free = free_blocks
        for seq in candidates:
            if not victims or victims[0] is not seq:
                continue  # seq itself was preempted for an older sequence
            victims.pop(0)
            need = self.decode_need(seq)
            while need > free and victims:
                victim = victims.pop()  # newer than seq, not scheduled yet
                preempt.append(victim)
                free += len(victim.blocks)
            if need > free:
                # seq is the newest left: it gives its own blocks back and waits.
                preempt.append(seq)
                free += len(seq.blocks)
            elif len(decode) < cfg.max_num_seqs:
                decode.append((seq, need))
                free -= need
        if preempt:
            # Recompute relieves pressure only if nothing new competes for the freed blocks.
            return SchedulePlan(tuple(decode), (), tuple(preempt))
        # Rows hold a slot until their last token is processed, decoding or not.
        return SchedulePlan(tuple(decode), tuple(self._admit(waiting, free, len(running))), ())

    def _admit(self, waiting: Seq[Sequence], free: int, rows: int) -> list[tuple[Sequence, int]]:
        cfg = self.config
        admit: list[tuple[Sequence, int]] = []
        budget = cfg.max_prefill_tokens
        for seq in sorted(waiting, key=lambda s: s.arrival):
            n_tokens = seq.num_prompt + len(seq.output)
            need = self.admit_need(seq)
            if (rows + len(admit) >= cfg.max_num_seqs or need > free
                    or len(seq.output) != seq.launched  # outputs still in flight
                    or (admit and n_tokens > budget)):
                break  # first come, first served: nobody overtakes the head of the queue
            admit.append((seq, need))
            free -= need
            budget -= n_tokens
        return admit
