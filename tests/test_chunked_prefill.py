"""Chunked prefill mixed with decode under a token budget (vLLM's default policy), on CPU.

Small budgets (7 and 16 tokens) split prompts of 1 to 60 tokens across steps while other rows
decode. Greedy tokens equal the unchunked engine's and transformers' ``generate`` (the tiny
Llama, fp32, torch backend); seeded sampling is unchanged by chunking (exact with the fake
model, whose logits do not depend on how a prompt was cut); a chunk that ends mid-prompt
samples nothing; every request ends once and every block comes back when requests are
aborted, fail or are preempted in the middle of their prefill; bad budgets are refused."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
import torch
from fake_runtime_model import EagerGraphs, FakeModel, Replay
from test_engine import random_params, run_all
from test_engine_guarantees import assert_one_end

from decodelab.core.validate import ConfigError
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import Request, SamplingParams, Status
from decodelab.engine.scheduler import SchedulerConfig
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import from_state_dict, random_state_dict

POISON = 47  # FakeModel's NaN trigger (a valid id of its 48-token vocabulary)
# Around the budgets' edges: 1 token, one chunk exactly, one token more, several chunks.
PROMPT_LENS = (1, 6, 7, 8, 15, 16, 17, 33, 60)
BUDGETS = (7, 16)


def prompts(vocab: int, seed: int, lens=PROMPT_LENS) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(1, vocab) for _ in range(n)) for n in lens]


def chunked(budget: int, **kw) -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_model_len=128, max_num_batched_tokens=budget, **kw)


UNCHUNKED = EngineConfig(max_num_seqs=4, max_model_len=128, chunked_prefill=False)


def spy_prefill(model) -> list[list[tuple[int, int]]]:
    """Record each prefill call's chunks as (start, tokens)."""
    calls: list[list[tuple[int, int]]] = []
    real = model.prefill

    def prefill(token_ids, block_tables, starts=None):
        calls.append([(0 if starts is None else s, len(t))
                      for s, t in zip(starts or [0] * len(token_ids), token_ids, strict=True)])
        return real(token_ids, block_tables, starts)

    model.prefill = prefill
    return calls


def assert_budget_kept(eng: Engine, calls, budget: int) -> None:
    """Every step kept to the budget; prompts were split and steps mixed decode and prefill."""
    steps = list(eng.metrics.steps)
    assert all(r.batch + r.prefill_tokens <= budget for r in steps)
    assert any(s > 0 for call in calls for s, _ in call), "no prompt was split"
    assert any(r.batch and r.prefill_rows for r in steps), "no step mixed decode and prefill"


# ------------------------------------------------------------------ the tiny Llama
@pytest.fixture(scope="module")
def tiny():
    config = named_config("tiny")
    return config, random_state_dict(config, seed=1)


def tiny_model(tiny, num_blocks=96, block_size=4) -> PagedLlama:
    config, sd = tiny
    return PagedLlama(config, from_state_dict(config, sd), PagedKVCache(config, num_blocks,
                                                                        block_size),
                      backend="torch")


def greedy(ps, n: int = 10) -> list[Request]:
    return [Request(f"g{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n,
                                               ignore_eos=True)) for i, p in enumerate(ps)]


@pytest.mark.parametrize("budget", BUDGETS)
def test_tiny_llama_greedy_chunked_equals_unchunked_and_transformers(tiny, budget):
    transformers = pytest.importorskip("transformers")
    config, sd = tiny
    reqs = greedy(prompts(config.vocab_size, seed=budget))
    want = run_all(Engine(tiny_model(tiny), UNCHUNKED), reqs)
    model = tiny_model(tiny)
    calls = spy_prefill(model)
    eng = Engine(model, chunked(budget))
    assert run_all(eng, reqs) == want
    assert_budget_kept(eng, calls, budget)
    assert eng.pool.num_free == eng.pool.num_total
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_dict()))
    hf.load_state_dict(sd, strict=False)
    hf.eval()
    for r in reqs:
        out = hf.generate(torch.tensor([r.prompt]), max_new_tokens=10, min_new_tokens=10,
                          do_sample=False, pad_token_id=0)
        assert want[r.request_id] == out[0, len(r.prompt):].tolist(), r.request_id


def test_tiny_llama_sampled_and_preempted_mid_chunk_equals_unchunked(tiny):
    """Seeded sampling (every filter kind) and recompute after preemption under chunking: in
    fp32 on CPU the tiny model's rows give the unchunked engine's tokens."""
    rng = random.Random(4)
    reqs = [Request(f"s{i}", p, random_params(rng, max_new_tokens=12))
            for i, p in enumerate(prompts(512, seed=5))]
    want = run_all(Engine(tiny_model(tiny), UNCHUNKED), reqs)
    eng = Engine(tiny_model(tiny, num_blocks=24), replace(chunked(16), max_model_len=96))
    preempted_mid = spy_preemptions(eng)
    handles = [eng.submit(r) for r in reqs]
    eng.run()
    assert {h.request_id: h.tokens for h in handles} == want
    assert preempted_mid, "no sequence was preempted in the middle of its prefill"
    assert eng.pool.num_free == eng.pool.num_total


def test_mixed_steps_decode_through_the_graphs(tiny, monkeypatch):
    """With graphs (replay standing in for capture), a step's decode rows replay the forward
    and sampler graphs while its chunks prefill eagerly: the eager unchunked tokens."""
    from decodelab.engine.step_graphs import StepGraphs

    monkeypatch.setattr(StepGraphs, "_capture", lambda self, body, warm: Replay(body))
    reqs = greedy(prompts(512, seed=6), n=8)
    want = run_all(Engine(tiny_model(tiny), replace(UNCHUNKED, use_graphs=False)), reqs)
    model = tiny_model(tiny)
    graphs = EagerGraphs(model, buckets=(1, 2, 4), max_blocks_per_seq=32)
    replays: list[int] = []
    for b, g in graphs.graphs.items():
        body = g.body
        g.body = lambda body=body, b=b: (replays.append(b), body())
    eng = Engine(model, chunked(7), graphs)
    calls = spy_prefill(model)
    handles = [eng.submit(r) for r in reqs]
    mixed = 0
    while eng.has_work:
        before = len(replays)
        eng.step()
        rec = eng.metrics.steps[-1]
        if rec.batch and rec.prefill_rows:
            mixed += 1
            assert replays[before:] == [rec.bucket]  # the decode rows: one forward replay
    assert {h.request_id: h.tokens for h in handles} == want
    assert mixed and eng.runner.step_graphs.last is not None
    assert_budget_kept(eng, calls, 7)


# ------------------------------------------------------------------ the fake model (exact)
def fake_engine(num_blocks=64, **kw) -> Engine:
    model = FakeModel(num_blocks=num_blocks, poison=POISON)
    return Engine(model, EngineConfig(max_num_seqs=4, max_model_len=96, **kw))


def spy_preemptions(eng: Engine) -> list[str]:
    """Ids of sequences preempted while being prefilled."""
    found: list[str] = []
    real = eng.scheduler.schedule

    def schedule(running, waiting, free):
        plan = real(running, waiting, free)
        found.extend(s.request_id for s in plan.preempt if s.prefilling)
        return plan

    eng.scheduler.schedule = schedule
    return found


def sampled_workload(seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i}", p, random_params(rng))
            for i, p in enumerate(prompts(POISON, seed, lens=[*PROMPT_LENS, *PROMPT_LENS[::-1]]))]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("async_output", [True, False])
def test_seeded_sampling_is_unchanged_by_chunking(budget, async_output):
    reqs = sampled_workload(seed=budget)
    want = run_all(fake_engine(chunked_prefill=False), reqs)
    eng = fake_engine(max_num_batched_tokens=budget, async_output=async_output)
    calls = spy_prefill(eng.model)
    assert run_all(eng, reqs) == want
    assert_budget_kept(eng, calls, budget)
    assert eng.pool.num_free == eng.pool.num_total


def test_preemption_mid_chunk_gives_the_same_tokens_and_every_block_back():
    reqs = sampled_workload(seed=3)
    want = run_all(fake_engine(chunked_prefill=False), reqs)
    eng = fake_engine(num_blocks=30, max_num_batched_tokens=16)  # 120 tokens of cache
    preempted_mid = spy_preemptions(eng)
    handles = [eng.submit(r) for r in reqs]
    eng.run()
    assert {h.request_id: h.tokens for h in handles} == want
    assert preempted_mid and sum(h.num_preemptions for h in handles) >= len(preempted_mid)
    assert eng.pool.num_free == eng.pool.num_total and sorted(eng.free_slots) == [0, 1, 2, 3]


def test_first_token_and_its_ttft_only_after_the_last_chunk():
    """A 40-token prompt under a budget of 8: five chunks, the first four sample nothing; the
    first token (and its TTFT stamp) comes from the fifth."""
    eng = fake_engine(max_num_batched_tokens=8, async_output=False)
    calls = spy_prefill(eng.model)
    starts: list[float] = []
    seen: list[int] = []
    h = eng.submit(Request("p", tuple(range(1, 41)), SamplingParams(max_new_tokens=3),
                           on_token=lambda ev: seen.append(len(starts) - 1)))
    while eng.has_work:
        starts.append(time.perf_counter())
        eng.step()
    assert calls == [[(0, 8)], [(8, 8)], [(16, 8)], [(24, 8)], [(32, 8)]]
    assert seen == [4, 5, 6] and h.status is Status.FINISHED  # steps counted from 0
    ttft = eng.metrics.requests[0].ttft_s
    assert h._seq.t_first_token > starts[4] and ttft >= h._seq.t_first_token - starts[4]


def test_logits_of_chunks_ending_mid_prompt_are_discarded():
    """NaN logits on every chunk that ends mid-prompt change nothing; on the last chunk they
    fail the request before its first token."""
    prompt = tuple(range(1, 31))  # chunks of 8, 8, 8, 6
    want = run_all(fake_engine(chunked_prefill=False), [Request("p", prompt)])["p"]
    eng = fake_engine(max_num_batched_tokens=8)
    real = eng.model.prefill
    mid: list[int] = []

    def nan_mid_prompt(token_ids, block_tables, starts=None):
        out = real(token_ids, block_tables, starts)
        for i, (s, t) in enumerate(zip(starts, token_ids, strict=True)):
            if s + len(t) < len(prompt):
                out[i] = float("nan")
                mid.append(s)
        return out

    eng.model.prefill = nan_mid_prompt
    assert run_all(eng, [Request("p", prompt)])["p"] == want and mid == [0, 8, 16]
    bad = fake_engine(max_num_batched_tokens=8)
    bad.model.poison_after = 0  # every chunk's logits are NaN: the last one's are sampled
    h = bad.submit(Request("p", (POISON, *prompt[1:])))
    bad.run()
    assert h.status is Status.FAILED and h.finish_reason == "non_finite_logits"
    assert h.tokens == [] and [r.prefill_tokens for r in bad.metrics.steps][:4] == [8, 8, 8, 6]
    assert bad.pool.num_free == bad.pool.num_total


def test_abort_mid_prefill_ends_once_and_frees_its_blocks():
    eng = fake_engine(max_num_batched_tokens=8)
    events: list = []
    h = eng.submit(Request("long", tuple(range(1, 41)), SamplingParams(max_new_tokens=4),
                           on_token=events.append))
    others = [eng.submit(r) for r in sampled_workload(seed=9)[:3]]
    eng.step()
    eng.step()
    seq = h._seq
    assert seq.prefilling and seq.num_computed > 0 and seq.blocks
    assert h.abort() and not h.abort()
    assert h.status is Status.ABORTED and h.tokens == [] and not seq.blocks
    eng.run()
    assert_one_end(h, list(h), events)
    assert all(o.status is Status.FINISHED for o in others)
    assert eng.pool.num_free == eng.pool.num_total and not eng.active


def test_a_failed_chunk_step_fails_its_rows_only():
    eng = fake_engine(max_num_batched_tokens=8)
    real = eng.model.prefill
    calls = []

    def flaky(token_ids, block_tables, starts=None):
        calls.append(starts)
        if len(calls) == 3:
            raise RuntimeError("device fault")
        return real(token_ids, block_tables, starts)

    eng.model.prefill = flaky
    handles = [eng.submit(r) for r in sampled_workload(seed=11)]
    eng.run()
    failed = [h for h in handles if h.status is Status.FAILED]
    assert failed and all(h.finish_reason == "step_error" for h in failed)
    assert all(h.status is Status.FINISHED for h in handles if h not in failed)
    assert eng.pool.num_free == eng.pool.num_total and not eng.active


# ------------------------------------------------------------------ the knobs
@pytest.mark.parametrize("bad", [0, -1, 3, 1.5, True, "8", None])
def test_a_budget_below_max_num_seqs_or_no_integer_is_refused(bad):
    with pytest.raises(ConfigError, match=r"EngineConfig\.max_num_batched_tokens=.*must be an "
                                          r"integer >= 4 \(max_num_seqs"):
        EngineConfig(max_num_seqs=4, max_num_batched_tokens=bad)
    with pytest.raises(ConfigError, match=r"SchedulerConfig\.max_num_batched_tokens="):
        SchedulerConfig(4, 4, 64, max_num_batched_tokens=bad)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_chunked_prefill_takes_a_bool_only(bad):
    with pytest.raises(ConfigError, match=r"EngineConfig\.chunked_prefill=.*must be a bool"):
        EngineConfig(chunked_prefill=bad)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "8"])
def test_a_pace_below_one_token_or_no_integer_is_refused(bad):
    with pytest.raises(ConfigError, match=r"EngineConfig\.steady_prefill_tokens=.*must be an "
                                          r"integer >= 1"):
        EngineConfig(steady_prefill_tokens=bad)


@pytest.mark.parametrize("steady", [1, 3])
def test_paced_prefill_gives_the_same_tokens_in_more_smaller_chunks(steady):
    """A pace below the budget: prompts that fit in one step's budget are prefilled a few
    tokens a step (while a backlog takes the whole budget); the seeded tokens are unchanged."""
    reqs = sampled_workload(seed=5)
    want = run_all(fake_engine(chunked_prefill=False), reqs)
    eng = fake_engine(max_num_batched_tokens=16, steady_prefill_tokens=steady)
    calls = spy_prefill(eng.model)
    assert run_all(eng, reqs) == want
    assert_budget_kept(eng, calls, 16)
    sizes = [sum(n for _, n in call) for call in calls]
    assert min(sizes) <= steady < max(sizes)  # paced steps and whole-budget steps both ran
    assert eng.pool.num_free == eng.pool.num_total


def test_the_smallest_budget_makes_progress():
    """A budget of max_num_seqs tokens: every row decodes each step, a free row gets one
    prefill token; everything finishes with the unchunked tokens."""
    reqs = sampled_workload(seed=13)
    want = run_all(fake_engine(chunked_prefill=False), reqs)
    assert run_all(fake_engine(max_num_batched_tokens=4), reqs) == want


@pytest.mark.gpu
def test_cuda_chunked_prefill_with_decode_graphs_equals_unchunked():
    """On the GPU (tiny Llama, fp32): mixed steps replay the captured decode graphs and the
    step graphs while the chunks prefill eagerly; greedy tokens equal the unchunked engine's,
    and every block comes back."""
    from decodelab.model.graphs import DecodeGraphs
    from decodelab.model.weights import random_weights

    config = named_config("tiny")
    dev = torch.device("cuda")
    model = PagedLlama(config, random_weights(config, 0, device=dev),
                       PagedKVCache(config, 128, 8, device=dev))
    graphs = DecodeGraphs(model, buckets=(1, 2, 4), max_blocks_per_seq=16)
    reqs = greedy(prompts(config.vocab_size, seed=7))
    want = run_all(Engine(model, UNCHUNKED, graphs), reqs)
    calls = spy_prefill(model)
    eng = Engine(model, chunked(16), graphs)
    assert run_all(eng, reqs) == want
    assert_budget_kept(eng, calls, 16)
    sg = eng.runner.step_graphs
    assert sg is not None and sg.captures and not sg.failed
    assert eng.pool.num_free == eng.pool.num_total
