"""Property tests of the FCFS scheduler, driven through a simulated engine on a real BlockPool
(torch-free): every plan respects the pool, FCFS and newest-first preemption, and every
workload drains with every block back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from decodelab.engine.plan import SchedulePlan, apply_plan
from decodelab.engine.requests import Request, SamplingParams, Sequence, Status
from decodelab.engine.scheduler import Scheduler, SchedulerConfig
from decodelab.model.block_pool import BlockPool


def make_seq(i: int, prompt_len: int, max_new: int) -> Sequence:
    req = Request(f"r{i}", tuple([1] * prompt_len), SamplingParams(max_new_tokens=max_new))
    return Sequence(req, arrival=i, seed=i)


def check_plan(plan: SchedulePlan, sched: Scheduler, running, waiting, free: int) -> None:
    cfg = sched.config
    dec = [s for s, _ in plan.decode]
    adm = [s for s, _ in plan.admit]
    ids = [id(s) for s in [*dec, *adm, *plan.preempt]]
    assert len(ids) == len(set(ids)), "a sequence appears twice in one plan"
    assert plan.blocks_allocated <= free + plan.blocks_freed
    assert all(s in running for s in [*dec, *plan.preempt]) and all(s in waiting for s in adm)
    for s, n in plan.decode:
        assert len(s.blocks) + n >= cfg.blocks_needed(s.context_launched)
    if plan.preempt:
        assert not adm, "no admission while preempting"
        assert min(s.arrival for s in plan.preempt) > max((s.arrival for s in dec), default=-1)
    # FCFS: admitted sequences are the oldest waiting ones
    order = sorted(waiting, key=lambda s: s.arrival)
    assert adm == order[:len(adm)]
    assert len(running) - len(plan.preempt) + len(adm) <= cfg.max_num_seqs


def simulate(seqs: list[Sequence], sched: Scheduler, pool: BlockPool, arrivals: list[int],
             lag: bool) -> int:
    """Run to completion; tokens reach the 'host' one step late when ``lag``. Returns steps."""
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
        launched = [s for s, _ in (*plan.decode, *plan.admit)]
        for s in launched:
            s.launched += 1
        pending.append(launched)
        while len(pending) > (1 if lag and launched else 0):
            for s in pending.pop(0):
                s.output.append(0)
                done = (len(s.output) >= s.params.max_new_tokens
                        or s.num_prompt + len(s.output) >= sched.config.max_model_len)
                if done and s.status is not Status.FINISHED:
                    if s in running:
                        running.remove(s)
                    else:
                        waiting.remove(s)
                    pool.free(s.blocks)
                    s.blocks = []
                    s.status = Status.FINISHED
        step += 1
        assert step < 10_000, "scheduler did not drain the workload"
    return step


workloads = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 25), st.integers(0, 30)),
                     min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(jobs=workloads, num_blocks=st.integers(12, 60), block_size=st.sampled_from([1, 2, 4, 8]),
       max_num_seqs=st.integers(1, 8), lag=st.booleans())
def test_any_workload_drains_with_every_block_back(jobs, num_blocks, block_size, max_num_seqs,
                                                   lag):
    max_len = min(48, num_blocks * block_size)
    sched = Scheduler(SchedulerConfig(block_size, max_num_seqs, max_len, max_prefill_tokens=32))
    pool = BlockPool(num_blocks, block_size)
    seqs = [make_seq(i, min(p, max_len - 1), n) for i, (p, n, _) in enumerate(jobs)]
    simulate(seqs, sched, pool, [a for _, _, a in jobs], lag)
    assert pool.num_free == pool.num_total
    for s in seqs:
        assert s.status is Status.FINISHED and not s.blocks
        assert len(s.output) == min(s.params.max_new_tokens, max_len - s.num_prompt)


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
    assert [s for s, _ in sched.schedule([], [seq], 10).admit] == [seq]


def test_scheduler_and_plan_import_no_torch():
    import subprocess
    import sys

    code = ("import sys; import decodelab.engine.scheduler, decodelab.engine.plan; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_apply_plan_preempts_then_admits_with_every_block_accounted():
    sched = Scheduler(SchedulerConfig(block_size=2, max_num_seqs=2, max_model_len=16))
    pool = BlockPool(4, 2)
    old, new = make_seq(0, 3, 8), make_seq(1, 3, 8)
    running, waiting = [], [old, new]
    apply_plan(sched.schedule(running, waiting, pool.num_free), pool, running, waiting)
    assert running == [old, new] and not waiting and pool.num_free == 0
    for s in running:
        s.launched, s.output = 2, [0]  # writes position 4 next: a third block each
    plan = sched.schedule(running, waiting, pool.num_free)
    assert plan.preempt == (new,) and [s for s, _ in plan.decode] == [old]
    apply_plan(plan, pool, running, waiting)
    assert running == [old] and waiting == [new] and new.status is Status.WAITING
    assert new.blocks == [] and new.num_preemptions == 1 and len(old.blocks) == 3
    assert pool.num_free + len(old.blocks) == pool.num_total
