"""The engine loop on CPU: streaming, stops, abort, isolation of failures, determinism,
preemption, and the real tiny Llama against its own greedy loop."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from fake_runtime_model import EagerGraphs, FakeModel, Replay

from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import InvalidRequestError, Request, SamplingParams, Status
from decodelab.engine.stream import CallbackError, NonFiniteLogitsError, RequestError
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache, slots_for
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def random_params(rng: random.Random, **kw) -> SamplingParams:
    kind = rng.choice(["greedy", "temp", "topk", "topp", "minp", "pen"])
    base = dict(seed=rng.randrange(1 << 30), max_new_tokens=rng.randint(1, 12))
    base |= {"greedy": dict(temperature=0.0),
             "temp": dict(temperature=rng.choice([0.5, 1.0, 1.5])),
             "topk": dict(temperature=1.0, top_k=rng.choice([1, 3, 10])),
             "topp": dict(temperature=0.9, top_p=rng.choice([0.5, 0.9])),
             "minp": dict(temperature=1.2, min_p=0.1, top_k=8),
             "pen": dict(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.5,
                         presence_penalty=0.3)}[kind]
    return SamplingParams(**(base | kw))


def workload(n: int, seed: int = 0, vocab: int = 48, **kw) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i}", tuple(rng.randrange(1, vocab) for _ in range(rng.randint(1, 6))),
                    random_params(rng, **kw)) for i in range(n)]


def run_all(engine: Engine, requests: list[Request]) -> dict[str, list[int]]:
    handles = [engine.submit(r) for r in requests]
    engine.run()
    assert all(h.done for h in handles)
    return {h.request_id: h.tokens for h in handles}


def fake_engine(num_blocks=64, max_num_seqs=8, **kw) -> Engine:
    model = FakeModel(num_blocks=num_blocks, poison=kw.pop("poison", None))
    return Engine(model, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, **kw))


def test_all_requests_finish_and_blocks_return():
    eng = fake_engine()
    out = run_all(eng, workload(40))
    assert len(out) == 40
    assert eng.pool.num_free == eng.pool.num_total
    assert not eng.running and not eng.waiting and not eng.pending and not eng.active
    assert eng.metrics.outcomes["finished"] == 40


@pytest.mark.parametrize("mode", [dict(async_output=False), dict(static_inputs=False),
                                  dict(max_partial_k=0)])
def test_runtime_switches_do_not_change_outputs(mode):
    reqs = workload(30, seed=1)
    assert run_all(fake_engine(), reqs) == run_all(fake_engine(**mode), reqs)


def test_seeded_request_same_alone_and_in_any_batch_mix():
    probe = Request("probe", (3, 1, 4, 1, 5), SamplingParams(temperature=1.0, top_p=0.9,
                                                             seed=1234, max_new_tokens=12))
    alone = run_all(fake_engine(), [probe])["probe"]
    for mix_seed in range(4):
        others = workload(random.Random(mix_seed).randint(1, 20), seed=100 + mix_seed)
        mixed = others[: len(others) // 2] + [probe] + others[len(others) // 2:]
        assert run_all(fake_engine(max_num_seqs=4 + mix_seed), mixed)["probe"] == alone


def test_preemption_forced_equals_no_preemption():
    reqs = workload(24, seed=2, max_new_tokens=30)
    roomy = fake_engine(num_blocks=400)
    ref = run_all(roomy, reqs)
    tight = fake_engine(num_blocks=24)  # 96 tokens of cache for 8 rows of up to 36 tokens
    handles = [tight.submit(r) for r in reqs]
    tight.run()
    assert sum(h.num_preemptions for h in handles) > 0
    assert {h.request_id: h.tokens for h in handles} == ref
    assert tight.pool.num_free == tight.pool.num_total


def test_streaming_iterator_and_callback_agree():
    seen: list[int] = []
    eng = fake_engine()
    req = Request("s", (5, 6, 7), SamplingParams(temperature=0.7, seed=9, max_new_tokens=9),
                  on_token=lambda ev: seen.append(ev.token))
    handle = eng.submit(req)
    for other in workload(5, seed=3):
        eng.submit(other)
    events = list(handle)
    assert [e.token for e in events] == handle.tokens == seen
    assert events[-1].finished and events[-1].reason == "length"
    eng.run()
    assert eng.pool.num_free == eng.pool.num_total


def test_stop_token_eos_and_stop_sequence():
    eng = fake_engine()
    free = run_all(eng, [Request("a", (1, 2), SamplingParams(temperature=0.0,
                                                             max_new_tokens=20))])["a"]
    stop_tok = free[4]
    first = free.index(stop_tok)
    got = run_all(fake_engine(), [Request("a", (1, 2), SamplingParams(
        temperature=0.0, max_new_tokens=20, stop_token_ids=(stop_tok,)))])["a"]
    assert got == free[:first + 1]
    seq = tuple(free[2:4])
    eng2 = fake_engine()
    h = eng2.submit(Request("b", (1, 2), SamplingParams(temperature=0.0, max_new_tokens=20,
                                                         stop_sequences=(seq,))))
    eng2.run()
    assert tuple(h.tokens[-2:]) == seq and h.finish_reason == "stop"
    eng3 = fake_engine(eos_token_id=stop_tok)
    h3 = eng3.submit(Request("c", (1, 2), SamplingParams(temperature=0.0, max_new_tokens=20)))
    eng3.run()
    assert h3.finish_reason == "eos" and h3.tokens == free[:first + 1]


def test_invalid_request_enters_nothing():
    eng = fake_engine()
    for bad in [Request("x", (), SamplingParams()), Request("x", (1, 99), SamplingParams()),
                Request("x", tuple(range(1, 40)) * 2, SamplingParams()),
                Request("x", (1,), SamplingParams(stop_token_ids=(48,)))]:
        with pytest.raises(InvalidRequestError, match=r"Request\['x'\]\.\w+"):
            eng.submit(bad)
    assert not eng.waiting and not eng.active and eng.metrics.errors["invalid_request"] == 4


def test_faults_isolated_healthy_outputs_unchanged():
    """~10% aborts, ~10% raising callbacks, ~10% non-finite logits, among healthy requests."""
    rng = random.Random(5)
    poison = 47
    base = workload(60, seed=6, vocab=47, max_new_tokens=14)
    kinds = {r.request_id: rng.choice(["ok"] * 7 + ["abort", "raise", "nan"]) for r in base}
    ref = run_all(fake_engine(poison=poison), base)

    eng = fake_engine(poison=poison)

    def make_cb(rid: str, kind: str):
        def cb(ev):
            if kind == "raise" and ev.index == 3:
                raise ValueError("client went away")
            if kind == "abort" and ev.index == 2:
                eng.abort(rid)
        return cb

    faulty = []
    for r in base:
        kind = kinds[r.request_id]
        prompt = (poison, *r.prompt) if kind == "nan" else r.prompt
        faulty.append(Request(r.request_id, prompt, r.params, on_token=make_cb(r.request_id,
                                                                              kind)))
    out = {}
    handles = [eng.submit(r) for r in faulty]
    eng.run()
    for h in handles:
        out[h.request_id] = h
    for rid, kind in kinds.items():
        h = out[rid]
        if kind == "ok":
            assert h.status is Status.FINISHED and h.tokens == ref[rid]
            assert h.exception is None and h.error is None
        elif kind == "abort" and len(ref[rid]) > 3:
            assert h.status is Status.ABORTED and h.tokens == ref[rid][:3]
            assert h.exception is None
        elif kind == "raise" and len(ref[rid]) > 4:
            assert h.status is Status.FAILED and h.finish_reason == "callback_error"
            assert "client went away" in h.error
            assert isinstance(h.exception, CallbackError) and h.error.startswith("CallbackError")
            assert isinstance(h.exception.__cause__, ValueError)
        elif kind == "nan":
            req = next(r for r in faulty if r.request_id == rid)
            if len(req.prompt) + req.params.max_new_tokens - 1 > 8:  # reaches a NaN step
                assert h.status is Status.FAILED and h.finish_reason == "non_finite_logits"
                assert isinstance(h.exception, NonFiniteLogitsError)
                assert h.error.startswith("NonFiniteLogitsError: logits of token")
            else:
                assert h.status is Status.FINISHED
    n_nan = sum(out[r].finish_reason == "non_finite_logits" for r in kinds)
    assert n_nan > 0 and eng.metrics.errors["non_finite_logits"] == n_nan
    assert eng.pool.num_free == eng.pool.num_total
    assert not eng.active and not eng.running and not eng.waiting


def test_step_error_fails_only_that_steps_rows():
    eng = fake_engine()
    real_decode = eng.model.decode

    def flaky(*args):
        if eng.model.decode_calls == 3:
            eng.model.decode_calls += 1
            raise RuntimeError("device fault")
        return real_decode(*args)

    eng.model.decode = flaky
    handles = [eng.submit(r) for r in workload(6, seed=7, max_new_tokens=10)]
    eng.run()
    failed = [h for h in handles if h.status is Status.FAILED]
    assert failed and all("device fault" in h.error for h in failed)
    assert all(h.finish_reason == "step_error" and isinstance(h.exception, RuntimeError)
               and not isinstance(h.exception, RequestError) for h in failed)
    assert eng.pool.num_free == eng.pool.num_total


def tiny_llama(num_blocks=64, block_size=8):
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, 0), PagedKVCache(cfg, num_blocks, block_size))


def greedy_loop(model: PagedLlama, prompt: list[int], n: int) -> list[int]:
    bs = model.cache.block_size
    bt = model.cache.pool.allocate(model.cache.pool.blocks_needed(len(prompt) + n))
    out = [int(model.prefill([prompt], [bt]).argmax())]
    for i in range(n - 1):
        pos = len(prompt) + i
        logits = model.decode(torch.tensor([out[-1]]), torch.tensor([pos]),
                              torch.tensor(slots_for(bt, pos, pos + 1, bs)),
                              model.cache.block_table_tensor([bt]), torch.tensor([pos + 1]))
        out.append(int(logits.argmax()))
    model.cache.pool.free(bt)
    return out


def test_real_tiny_llama_greedy_matches_its_own_loop_in_a_mixed_batch():
    model = tiny_llama()
    rng = random.Random(8)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(2, 9))] for _ in range(5)]
    refs = [greedy_loop(model, p, 12) for p in prompts]
    eng = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=128))
    greedy = [eng.submit(Request(f"g{i}", tuple(p), SamplingParams(temperature=0.0,
                                                                   max_new_tokens=12)))
              for i, p in enumerate(prompts)]
    for r in workload(6, seed=9, vocab=512):
        eng.submit(r)
    eng.run()
    assert [h.tokens for h in greedy] == refs
    assert eng.pool.num_free == eng.pool.num_total


def test_real_tiny_llama_sampled_request_same_alone_and_in_a_mix():
    """On CPU in fp32 the tiny model's rows do not depend on the batch, so seeded sampling
    gives the same tokens alone and in a mix (the guarantee stated in sampling.py)."""
    probe = Request("p", (7, 8, 9, 10), SamplingParams(temperature=1.0, top_k=50, seed=77,
                                                       max_new_tokens=16))
    alone = run_all(Engine(tiny_llama(), EngineConfig(max_num_seqs=8, max_model_len=128)),
                    [probe])["p"]
    mix = workload(7, seed=10, vocab=512)
    eng = Engine(tiny_llama(), EngineConfig(max_num_seqs=8, max_model_len=128))
    assert run_all(eng, [*mix[:3], probe, *mix[3:]])["p"] == alone


@pytest.mark.gpu
def test_cuda_engine_graphs_equal_eager_and_isolate_faults():
    from decodelab.model.graphs import DecodeGraphs

    cfg = named_config("tiny")
    dev = torch.device("cuda")
    model = PagedLlama(cfg, random_weights(cfg, 0, device=dev),
                       PagedKVCache(cfg, 128, 8, device=dev))
    graphs = DecodeGraphs(model, buckets=(1, 2, 4, 8), max_blocks_per_seq=16)
    reqs = workload(8, seed=11, vocab=512, max_new_tokens=10)
    ecfg = EngineConfig(max_num_seqs=8, max_model_len=128)
    outs = []
    for use_graphs in (True, False):
        eng = Engine(model, replace_cfg(ecfg, use_graphs=use_graphs), graphs)
        eng.logits_hook = lambda rows, logits: [
            logits[i].fill_(float("nan")) for i, s in enumerate(rows)
            if s.request_id == "r3" and s.launched >= 2]
        outs.append(run_all(eng, reqs))
        assert eng.pool.num_free == eng.pool.num_total
    assert outs[0] == outs[1]


def replace_cfg(cfg: EngineConfig, **kw) -> EngineConfig:
    from dataclasses import replace

    return replace(cfg, **kw)


def test_real_tiny_llama_preemption_recompute_gives_the_same_tokens():
    """Recompute after preemption runs prefill instead of decode; in fp32 on CPU the tiny
    model's tokens (greedy and seeded sampling) come out the same."""
    reqs = workload(12, seed=21, vocab=512, max_new_tokens=40)
    ecfg = EngineConfig(max_num_seqs=8, max_model_len=64)
    ref = run_all(Engine(tiny_llama(num_blocks=200, block_size=4), ecfg), reqs)
    eng = Engine(tiny_llama(num_blocks=30, block_size=4), ecfg)
    handles = [eng.submit(r) for r in reqs]
    eng.run()
    assert sum(h.num_preemptions for h in handles) > 0
    assert {h.request_id: h.tokens for h in handles} == ref
    assert eng.pool.num_free == eng.pool.num_total


def test_real_tiny_llama_faults_leave_healthy_requests_unchanged():
    reqs = workload(30, seed=22, vocab=512, max_new_tokens=12)
    ecfg = EngineConfig(max_num_seqs=8, max_model_len=64)
    ref = run_all(Engine(tiny_llama(), ecfg), reqs)
    eng = Engine(tiny_llama(), ecfg)
    cycle = ("ok",) * 7 + ("raise", "abort", "nan")
    kinds = {r.request_id: cycle[i % 10] for i, r in enumerate(reqs)}

    def cb(ev):
        kind = kinds[ev.request_id]
        if kind == "raise" and ev.index == 2:
            raise KeyError("boom")
        if kind == "abort" and ev.index == 1:
            eng.abort(ev.request_id)

    eng.logits_hook = lambda rows, logits: [
        logits[i].fill_(float("inf")) for i, s in enumerate(rows)
        if kinds[s.request_id] == "nan" and s.launched >= 3]
    handles = [eng.submit(Request(r.request_id, r.prompt, r.params, on_token=cb)) for r in reqs]
    eng.run()
    for h in handles:
        if kinds[h.request_id] == "ok":
            assert h.status is Status.FINISHED and h.tokens == ref[h.request_id]
        else:
            assert h.status in (Status.FAILED, Status.ABORTED, Status.FINISHED)
    assert eng.metrics.errors["non_finite_logits"] + eng.metrics.errors["callback_error"] > 0
    assert eng.pool.num_free == eng.pool.num_total and not eng.active


def test_step_graph_bodies_read_only_static_buffers(monkeypatch):
    """The engine's graph path (stage -> forward -> sampler over static buffers, with replay
    standing in for capture) gives exactly the eager engine's tokens: every per-step value
    reaches the bodies through the static buffers the step's single copy fills, with the
    forward over the narrow table while every row fits it and over the full one after."""
    from decodelab.engine.step_graphs import StepGraphs

    monkeypatch.setattr(StepGraphs, "_capture", lambda self, body, warm: Replay(body))
    reqs = workload(16, seed=31, vocab=512, max_new_tokens=14)
    ecfg = EngineConfig(max_num_seqs=8, max_model_len=128)
    model = tiny_llama()
    want = run_all(Engine(model, replace_cfg(ecfg, use_graphs=False)), reqs)
    graphs = EagerGraphs(model, narrow_blocks=2)  # rows of up to 2 blocks: the narrow graphs
    narrow, fits = [], graphs.fits_narrow  # each step's choice, recorded
    graphs.fits_narrow = lambda bucket, longest: narrow.append(fits(bucket, longest)) or narrow[-1]
    eng = Engine(model, ecfg, graphs)
    assert eng.runner.step_graphs is not None
    eng.logits_hook = lambda rows, logits: [logits[i].fill_(float("nan"))
                                            for i, s in enumerate(rows)
                                            if s.request_id == "r5" and s.launched >= 4]
    got = run_all(eng, reqs)
    assert {k: v for k, v in got.items() if k != "r5"} == {k: v for k, v in want.items()
                                                            if k != "r5"}
    assert got["r5"] == want["r5"][:len(got["r5"])] and len(got["r5"]) < len(want["r5"])
    assert eng.runner.step_graphs.last is not None and eng.pool.num_free == eng.pool.num_total
    assert True in narrow and False in narrow  # both tables' graphs served steps


@pytest.mark.gpu
def test_cuda_step_graphs_sampler_equals_eager_every_step():
    """On the GPU: after every decode step, the captured sampler of that step's bucket and
    mode, replayed, equals its eager body on the same logits and parameters."""
    from decodelab.model.graphs import DecodeGraphs

    cfg = named_config("tiny")
    dev = torch.device("cuda")
    model = PagedLlama(cfg, random_weights(cfg, 0, device=dev),
                       PagedKVCache(cfg, 128, 8, device=dev))
    graphs = DecodeGraphs(model, buckets=(1, 2, 4, 8), max_blocks_per_seq=16)
    eng = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=128), graphs)
    for r in workload(12, seed=12, vocab=512, max_new_tokens=10):
        eng.submit(r)
    checked = set()
    while eng.has_work:
        eng.step()
        sg = eng.runner.step_graphs
        if sg.last is not None and eng.metrics.steps[-1].batch:
            assert sg.check(*sg.last), sg.last
            checked.add(sg.last)
    # The workload reaches at least two (bucket, sampler mode) graphs; every one was checked.
    assert len(checked) >= 2 and sg.captures >= len(checked) and sg.failed == 0
    assert eng.pool.num_free == eng.pool.num_total


def test_step_mode_equals_choose_mode_of_the_rows():
    from decodelab.engine.sampler import choose_mode

    eng = fake_engine(max_num_seqs=16)
    handles = [eng.submit(r) for r in workload(16, seed=41, max_new_tokens=20)]
    eng.step()
    seqs = [eng.active[h.request_id] for h in handles if not h.done]
    for rows in (seqs, seqs[:3], [s for s in seqs if not s.params.greedy]):
        slots = np.array([s.slot for s in rows])
        want = choose_mode([s.params.greedy for s in rows], [s.params.top_k for s in rows],
                           [s.params.uses_penalties for s in rows], eng.vocab,
                           eng.cfg.max_partial_k)
        assert eng.runner.batch.mode(slots, eng.vocab, eng.cfg.max_partial_k) == want


def test_step_uniforms_equal_the_hash_across_windows_and_reassignment():
    from decodelab.engine.batch import U_WINDOW, StaticBatch
    from decodelab.engine.requests import Sequence
    from decodelab.engine.sampler import row_uniforms

    batch = StaticBatch(4, 8, 4, 4, 99, torch.device("cpu"))
    slots = np.array([0, 1, 2, 4])  # slot 4: the spare slot of padding rows
    for seed0 in (5, 6):  # the second round reassigns every slot to another seed
        seqs = [Sequence(Request(f"q{i}", (1, 2)), arrival=i, seed=seed0 * 100 + i, slot=i)
                for i in range(3)]
        for s in seqs:
            batch.assign(s)
        for launched in (0, 1, U_WINDOW - 1, U_WINDOW, 3 * U_WINDOW + 5, 2):
            counters = np.array([launched, launched + 7, 2 * launched, 0])
            want = row_uniforms(np.array([s.seed for s in seqs] + [0]), counters)
            want[3] = batch._uniforms(slots[3:], counters[3:])[0]  # padding: any fixed value
            assert np.array_equal(batch._uniforms(slots, counters), want)


class _ForwardStub:
    """``DecodeGraphs``' static buffers for one bucket, with a narrow table's graph for rows of
    up to 5 positions; a "replay" leaves the output alone (the test writes the logits)."""

    def __init__(self, rows, vocab, max_blocks, dev):
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(rows, max_blocks, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.max_blocks_per_seq = max_blocks
        self.outputs = {rows: torch.zeros(rows, vocab, device=dev)}
        self.graphs = {rows: Replay(lambda: None)}
        self.narrow = {rows: (Replay(lambda: None), torch.zeros(rows, vocab, device=dev))}

    def fits_narrow(self, bucket, longest):
        return longest <= 5


def _step_graphs_at_large_vocab(dev):
    """Stage and sample through ``StepGraphs`` with a vocabulary where two-stage selection
    applies: inputs staged from the static buffers, tokens equal to the full sort's."""
    from dataclasses import replace

    from decodelab.engine.batch import StaticBatch
    from decodelab.engine.requests import Sequence
    from decodelab.engine.sampler import PenaltyState, sample
    from decodelab.engine.step_graphs import StepGraphs

    rows, vocab, bs = 8, 32768, 16
    batch = StaticBatch(rows, 4, rows, bs, 0, dev)
    pen = PenaltyState.empty(rows + 1, vocab, dev)
    fwd = _ForwardStub(rows, vocab, 4, dev)
    sg = StepGraphs(fwd, batch, pen)
    seqs = [Sequence(Request(f"q{i}", (1, 2, 3), SamplingParams(
        temperature=0.8, top_k=40 + i, top_p=0.9, seed=i)), arrival=i, seed=i, slot=i)
        for i in range(rows)]
    for s in seqs:
        s.blocks = [s.slot + 1]
        batch.assign(s)
    g = torch.Generator().manual_seed(4)
    for step in range(3):
        for s in seqs:
            s.launched = step + 1
        inp, slots = batch.prepare(seqs, rows)
        mode = batch.mode(slots, vocab, 1024)
        assert mode.chunk == 64 and mode.k_cand == 64
        before = batch.last_token[:rows].clone()
        sg.stage(rows)
        pos = 3 + step
        assert torch.equal(fwd.input_ids, before)
        assert (fwd.positions == pos).all() and (fwd.context_lens == pos + 1).all()
        assert fwd.slot_mapping.tolist() == [(i + 1) * bs + pos for i in range(rows)]
        logits = sg.forward(rows, pos + 1)
        assert sg.narrow == (pos + 1 <= 5)  # steps 0 and 1 over the narrow table, 2 not
        assert logits is fwd.narrow[rows][1] if sg.narrow else logits is fwd.outputs[rows]
        logits.copy_((torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16).float())
        got = sg.sample(rows, mode).clone()
        want, _ = sample(logits, inp.params, replace(mode, k_cand=0, chunk=0), pen)
        assert torch.equal(got, want) and torch.equal(batch.last_token[:rows], want)
        assert sg.check(rows, mode)
    assert len(sg.selections) == 1 and sg.failed == 0
    return sg


@pytest.mark.parametrize("two_stage_faster", [True, False])
def test_step_graphs_stage_and_timed_selection_on_cpu(monkeypatch, two_stage_faster):
    from decodelab.engine.step_graphs import StepGraphs

    monkeypatch.setattr(StepGraphs, "_capture", lambda self, body, warm: Replay(body))
    fast = 64 if two_stage_faster else 0
    monkeypatch.setattr(StepGraphs, "_replay_ms",
                        lambda self, bucket, mode, narrow: 1.0 if mode.chunk == fast else 2.0)
    sg = _step_graphs_at_large_vocab(torch.device("cpu"))
    assert [s["chunk"] for s in sg.selections.values()] == [fast]


@pytest.mark.gpu
def test_cuda_step_graphs_stage_and_timed_selection():
    sg = _step_graphs_at_large_vocab(torch.device("cuda"))
    assert sg.captures >= 4  # stage, two timing graphs, the sampler
