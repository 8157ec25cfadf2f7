"""Property tests of the FCFS scheduler, driven through a simulated engine on a real BlockPool
(torch-free): every plan respects the pool, FCFS and newest-first preemption, and every
workload drains with every block back."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodelab.core.validate import ConfigError
from decodelab.engine.plan import SchedulePlan, advance, apply_plan
from decodelab.engine.requests import Request, SamplingParams, Sequence, Status
from decodelab.engine.scheduler import Scheduler, SchedulerConfig
from decodelab.model.block_pool import BlockPool


def make_seq(i: int, prompt_len: int, max_new: int) -> Sequence:
    req = Request(f"r{i}", tuple([1] * prompt_len), SamplingParams(max_new_tokens=max_new))
    return Sequence(req, arrival=i, seed=i)


def check_plan(plan: SchedulePlan, sched: Scheduler, running, waiting, free: int) -> None:
    cfg = sched.config
    dec = [s for s, _ in plan.decode]
    adm = list(plan.admit)
    chunked = [c.seq for c in plan.prefill]
    ids = [id(s) for s in [*dec, *chunked, *plan.preempt]]
    assert len(ids) == len(set(ids)), "a sequence appears twice in one plan"
    assert plan.blocks_allocated <= free + plan.blocks_freed
    assert all(s in running for s in [*dec, *plan.preempt]) and all(s in waiting for s in adm)
    assert all(s in running or s in adm for s in chunked) and all(s in chunked for s in adm)
    for s, n in plan.decode:
        assert not s.prefilling and sched.can_decode(s)
        assert len(s.blocks) + n >= cfg.blocks_needed(s.context_launched)
    for c in plan.prefill:
        end = c.seq.num_tokens if c.seq in adm else c.seq.prefill_len
        assert c.start == c.seq.num_computed and 1 <= c.tokens <= end - c.start
        assert c.final == (c.start + c.tokens == end)
        assert len(c.seq.blocks) + c.blocks == max(len(c.seq.blocks),
                                                   cfg.blocks_needed(c.start + c.tokens))
        if not cfg.chunked_prefill:
            assert c.start == 0 and c.final, "a whole prompt per chunk without chunking"
    # The budget: every decode row fits; whole prompts may pass it with their first admission.
    assert plan.tokens <= cfg.max_num_batched_tokens or (
        not cfg.chunked_prefill and len(adm) == 1)
    # Paced: while rows decode and every prompt token still to prefill fits in the budget they
    # leave, a step prefills at most steady_prefill_tokens of them.
    decoding = sum(not s.prefilling and sched.can_decode(s) for s in running)
    pending = (sum(s.prefill_len - s.num_computed for s in running if s.prefilling)
               + sum(s.num_tokens for s in waiting))
    if (cfg.steady_prefill_tokens is not None and cfg.chunked_prefill and decoding
            and pending <= cfg.max_num_batched_tokens - decoding):
        assert sum(c.tokens for c in plan.prefill) <= cfg.steady_prefill_tokens
    if cfg.chunked_prefill:
        assert all(c.final for c in plan.prefill if c.seq in adm[:-1]), "only the last admitted"
    # Running rows that may decode all do, unless preempted (the budget never starves them).
    assert {id(s) for s in running if not s.prefilling and sched.can_decode(s)} <= {
        id(s) for s in [*dec, *plan.preempt]}
    if plan.preempt:
        assert not adm, "no admission while preempting"
        scheduled = [*dec, *(s for s in chunked if s in running)]
        assert min(s.arrival for s in plan.preempt) > max((s.arrival for s in scheduled),
                                                           default=-1)
    # FCFS: admitted sequences are the oldest waiting ones
    order = sorted(waiting, key=lambda s: s.arrival)
    assert adm == order[:len(adm)]
    assert len(running) - len(plan.preempt) + len(adm) <= cfg.max_num_seqs


def check_accounting(pool: BlockPool, seqs: list[Sequence], running, waiting) -> None:
    """Every block is owned once, by a running sequence, holding exactly its computed tokens."""
    owned = [b for s in seqs for b in s.blocks]
    assert len(owned) == len(set(owned)) and len(owned) == pool.num_used
    assert pool.num_free + pool.num_used == pool.num_total
    for s in running:
        assert s.status is Status.RUNNING
        assert len(s.blocks) == pool.blocks_needed(s.num_computed)
        assert s.num_computed <= s.prefill_len or s.num_computed == s.context_launched - 1
    for s in waiting:
        assert s.status is Status.WAITING and s.num_computed == 0 and not s.prefilling
    assert all(not s.blocks for s in seqs if s not in running)


def retire(s: Sequence, status: Status, pool: BlockPool, running, waiting) -> None:
    (running if s in running else waiting).remove(s)
    pool.free(s.blocks)  # raises on a double free
    s.blocks, s.status = [], status


def simulate(seqs: list[Sequence], sched: Scheduler, pool: BlockPool, arrivals: list[int],
             lag: bool, abort_rate: float = 0.0, rng: random.Random | None = None) -> int:
    """Run to completion; tokens reach the 'host' one step late when ``lag``; a running or
    waiting sequence is aborted with probability ``abort_rate`` per step. Returns steps."""
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    pending: list[list[Sequence]] = []
    step = 0
    todo = sorted(zip(arrivals, seqs, strict=True), key=lambda x: x[1].arrival)
    while todo or waiting or running or pending:
        while todo and todo[0][0] <= step:
            waiting.append(todo.pop(0)[1])
        plan = sched.schedule(running, waiting, pool.num_free)
        check_plan(plan, sched, running, waiting, pool.num_free)
        apply_plan(plan, pool, running, waiting)  # the engine's own application
        advance(plan)
        check_accounting(pool, seqs, running, waiting)
        sampled = plan.sampled
        pending.append(sampled)
        while len(pending) > (1 if lag and sampled else 0):
            for s in pending.pop(0):
                if s.status.done:
                    continue  # aborted after its step was launched
                s.output.append(0)
                if (len(s.output) >= s.params.max_new_tokens
                        or s.num_prompt + len(s.output) >= sched.config.max_model_len):
                    retire(s, Status.FINISHED, pool, running, waiting)
        live = [*running, *waiting]
        if rng is not None and live and rng.random() < abort_rate:
            retire(rng.choice(live), Status.ABORTED, pool, running, waiting)
        check_accounting(pool, seqs, running, waiting)
        step += 1
        assert step < 10_000, "scheduler did not drain the workload"
    return step


workloads = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 25), st.integers(0, 30)),
                     min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(jobs=workloads, num_blocks=st.integers(12, 60), block_size=st.sampled_from([1, 2, 4, 8]),
       max_num_seqs=st.integers(1, 8), lag=st.booleans(), chunked=st.booleans(),
       extra_budget=st.sampled_from([0, 1, 5, 24]), steady=st.sampled_from([None, 1, 3, 8]))
def test_any_workload_drains_with_every_block_back(jobs, num_blocks, block_size, max_num_seqs,
                                                   lag, chunked, extra_budget, steady):
    max_len = min(48, num_blocks * block_size)
    sched = Scheduler(SchedulerConfig(block_size, max_num_seqs, max_len,
                                      max_num_batched_tokens=max_num_seqs + extra_budget,
                                      chunked_prefill=chunked, steady_prefill_tokens=steady))
    pool = BlockPool(num_blocks, block_size)
    seqs = [make_seq(i, min(p, max_len - 1), n) for i, (p, n, _) in enumerate(jobs)]
    simulate(seqs, sched, pool, [a for _, _, a in jobs], lag)
    assert pool.num_free == pool.num_total
    for s in seqs:
        assert s.status is Status.FINISHED and not s.blocks
        assert len(s.output) == min(s.params.max_new_tokens, max_len - s.num_prompt)


@settings(max_examples=150, deadline=None)
@given(jobs=workloads, num_blocks=st.integers(12, 40), block_size=st.sampled_from([1, 2, 4]),
       max_num_seqs=st.integers(1, 6), lag=st.booleans(), budget=st.integers(0, 12),
       abort_rate=st.sampled_from([0.05, 0.2, 0.5]), seed=st.integers(0, 2**16),
       steady=st.sampled_from([None, 2]))
def test_aborts_and_preemption_mid_chunk_free_every_block_once(jobs, num_blocks, block_size,
                                                               max_num_seqs, lag, budget,
                                                               abort_rate, seed, steady):
    """Small budgets split prompts, small pools preempt mid-chunk, random aborts hit sequences
    waiting, prefilling and decoding: the accounting invariant holds after every step."""
    max_len = min(48, num_blocks * block_size)
    sched = Scheduler(SchedulerConfig(block_size, max_num_seqs, max_len,
                                      max_num_batched_tokens=max_num_seqs + budget,
                                      steady_prefill_tokens=steady))
    pool = BlockPool(num_blocks, block_size)
    seqs = [make_seq(i, min(p, max_len - 1), n) for i, (p, n, _) in enumerate(jobs)]
    simulate(seqs, sched, pool, [a for _, _, a in jobs], lag, abort_rate, random.Random(seed))
    assert pool.num_free == pool.num_total
    assert all(s.status in (Status.FINISHED, Status.ABORTED) and not s.blocks for s in seqs)


def test_pressure_preempts_newest_and_recomputes():
    sched = Scheduler(SchedulerConfig(block_size=2, max_num_seqs=4, max_model_len=16))
    pool = BlockPool(8, 2)
    seqs = [make_seq(i, 3, 10) for i in range(4)]
    simulate(seqs, sched, pool, [0] * 4, lag=True)
    assert seqs[0].num_preemptions == 0 and sum(s.num_preemptions for s in seqs) > 0
    assert pool.num_free == 8


def test_waits_for_outputs_in_flight_before_readmitting():
    sched = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=4, max_model_len=32))
    seq = make_seq(0, 3, 5)
    seq.launched = 2
    seq.output = [0]  # one token still in flight
    assert sched.schedule([], [seq], 10).admit == ()
    seq.output.append(0)
    assert sched.schedule([], [seq], 10).admit == (seq,)


def test_scheduler_and_plan_import_no_torch():
    import subprocess
    import sys

    code = ("import sys; import decodelab.engine.scheduler, decodelab.engine.plan; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def step(sched: Scheduler, pool: BlockPool, running, waiting) -> SchedulePlan:
    """Schedule, apply and issue one step (the engine's bookkeeping, no model)."""
    plan = sched.schedule(running, waiting, pool.num_free)
    check_plan(plan, sched, running, waiting, pool.num_free)
    apply_plan(plan, pool, running, waiting)
    advance(plan)
    return plan


def test_apply_plan_preempts_then_admits_with_every_block_accounted():
    sched = Scheduler(SchedulerConfig(block_size=2, max_num_seqs=2, max_model_len=16))
    pool = BlockPool(4, 2)
    old, new = make_seq(0, 3, 8), make_seq(1, 3, 8)
    running, waiting = [], [old, new]
    step(sched, pool, running, waiting)  # both prompts prefilled, token 0 launched
    assert running == [old, new] and not waiting and pool.num_free == 0
    step(sched, pool, running, waiting)  # token 1 launched: position 3, no new block
    for s in running:
        s.output = [0]  # writes position 4 next: a third block each
    plan = sched.schedule(running, waiting, pool.num_free)
    assert plan.preempt == (new,) and [s for s, _ in plan.decode] == [old]
    apply_plan(plan, pool, running, waiting)
    assert running == [old] and waiting == [new] and new.status is Status.WAITING
    assert new.blocks == [] and new.num_preemptions == 1 and len(old.blocks) == 3
    assert new.num_computed == 0 and not new.prefilling
    assert pool.num_free + len(old.blocks) == pool.num_total


def test_a_long_prompt_is_split_across_steps_while_a_running_row_decodes():
    sched = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=2, max_model_len=64,
                                      max_num_batched_tokens=8))
    pool = BlockPool(16, 4)
    short, long = make_seq(0, 3, 20), make_seq(1, 20, 4)
    running, waiting = [], [short]
    step(sched, pool, running, waiting)
    waiting.append(long)
    spans = []
    while long.prefilling or long in waiting:
        plan = step(sched, pool, running, waiting)
        assert [s for s, _ in plan.decode] == [short]  # one token of the budget each step
        (chunk,) = plan.prefill
        spans.append((chunk.start, chunk.tokens, chunk.final))
        assert plan.sampled == ([long, short] if chunk.final else [short])
        short.output = [0] * short.launched  # the host keeps up (no lag)
    assert spans == [(0, 7, False), (7, 7, False), (14, 6, True)]
    assert long.num_computed == 20 and long.launched == 1 and len(long.blocks) == 5
    plan = step(sched, pool, running, waiting)
    assert [s for s, _ in plan.decode] == [short, long] and not plan.prefill


def test_paced_prefill_spreads_a_prompt_while_it_fits_and_takes_the_budget_under_a_backlog():
    """Budget 16, pace 4: on an idle server a 10-token prompt is prefilled at once; one
    arriving while a row decodes, 4 tokens a step; three prompts at once (30 tokens, more
    than the 14 the two decode rows leave) take the whole budget until what is left fits, then
    the pace again."""
    sched = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=6, max_model_len=64,
                                      max_num_batched_tokens=16, steady_prefill_tokens=4))
    pool = BlockPool(64, 4)
    (chunk,) = sched.schedule([], [make_seq(9, 10, 4)], pool.num_free).prefill
    assert chunk.tokens == 10  # no decode row to hold back: the whole budget
    short = make_seq(0, 3, 40)
    running, waiting = [], [short]
    step(sched, pool, running, waiting)

    def serve(*arrivals: Sequence) -> list[int]:
        waiting.extend(arrivals)
        sizes = []
        while waiting or any(s.prefilling for s in running):
            plan = step(sched, pool, running, waiting)
            sizes.append(sum(c.tokens for c in plan.prefill))
            for s in running:
                s.output = [0] * s.launched  # the host keeps up (no lag)
        return sizes

    assert serve(make_seq(1, 10, 40)) == [4, 4, 2]
    # 30 pending > 16 - 2 rows decoding: 14 tokens; 16 left > 16 - 3: 13; 3 left: paced
    assert serve(*(make_seq(i, 10, 40) for i in (2, 3, 4))) == [14, 13, 3]


def test_a_pace_below_one_token_is_refused_and_whole_prompts_are_not_paced():
    with pytest.raises(ConfigError, match=r"steady_prefill_tokens=0"):
        SchedulerConfig(block_size=4, max_num_seqs=2, max_model_len=16, steady_prefill_tokens=0)
    sched = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=2, max_model_len=64,
                                      max_num_batched_tokens=16, chunked_prefill=False,
                                      steady_prefill_tokens=4))
    (chunk,) = sched.schedule([], [make_seq(0, 12, 4)], 16).prefill
    assert chunk.tokens == 12 and chunk.final


def test_a_recompute_prefills_prompt_and_output_in_chunks():
    sched = Scheduler(SchedulerConfig(block_size=2, max_num_seqs=2, max_model_len=32,
                                      max_num_batched_tokens=4))
    pool = BlockPool(16, 2)
    seq = make_seq(0, 5, 10)
    seq.output, seq.launched, seq.num_preemptions = [7, 8, 9], 3, 1  # preempted earlier
    running, waiting = [], [seq]
    chunks = [step(sched, pool, running, waiting).prefill for _ in range(2)]
    assert [(c.start, c.tokens, c.final) for (c,) in chunks] == [(0, 4, False), (4, 4, True)]
    assert seq.prefill_len == 8 and seq.num_computed == 8 and seq.launched == 4


def test_unchunked_prefill_admits_whole_prompts_the_first_past_the_budget():
    sched = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=4, max_model_len=64,
                                      max_num_batched_tokens=8, chunked_prefill=False))
    pool = BlockPool(32, 4)
    seqs = [make_seq(i, n, 4) for i, n in enumerate((12, 3, 3, 3))]
    plan = sched.schedule([], seqs, pool.num_free)
    assert plan.admit == (seqs[0],) and [(c.tokens, c.final) for c in plan.prefill] == [(12, True)]
    plan = sched.schedule([], seqs[1:], pool.num_free)
    assert plan.admit == tuple(seqs[1:3])  # 3 + 3 fit in 8; the third would not


def test_a_chunk_shrinks_to_the_free_blocks_then_its_sequence_is_preempted_mid_prefill():
    sched = Scheduler(SchedulerConfig(block_size=2, max_num_seqs=2, max_model_len=32,
                                      max_num_batched_tokens=8))
    pool = BlockPool(6, 2)
    old, new = make_seq(0, 4, 6), make_seq(1, 12, 2)
    # old decodes (its next step writes position 5, in its third block); new is prefilling
    old.blocks, old.launched, old.output = pool.allocate(3), 2, [0, 0]
    old.num_computed, old.prefill_len = 5, 4
    new.blocks, new.num_computed, new.prefill_len = pool.allocate(2), 4, 12
    running, waiting = [old, new], []
    for s in running:
        s.status = Status.RUNNING
    plan = step(sched, pool, running, waiting)
    # 7 tokens would need 4 more blocks; the newest takes what the one free block holds
    assert [s for s, _ in plan.decode] == [old]
    assert [(c.start, c.tokens, c.blocks, c.final) for c in plan.prefill] == [(4, 2, 1, False)]
    old.output = [0] * 3  # old writes position 6 next: a fourth block, none free
    plan = step(sched, pool, running, waiting)
    assert plan.preempt == (new,) and [s for s, _ in plan.decode] == [old] and not plan.prefill
    assert waiting == [new] and not new.blocks and new.num_computed == 0
    assert pool.num_used == len(old.blocks) == 4
