"""The engine's protocols: what it needs from a model and from forward graphs. The real model,
the tensor-parallel model and the CPU stand-ins all satisfy them; the stand-in graphs drive the
engine's graph paths on a CPU with the eager engine's tokens."""

from __future__ import annotations

import random

import torch
from fake_runtime_model import EagerGraphs, FakeModel

from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.protocols import ForwardGraphs, ModelShape, RuntimeCache, RuntimeModel
from decodelab.engine.requests import Request, SamplingParams
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def _tiny() -> PagedLlama:
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, 0), PagedKVCache(cfg, 64, 8))


def _satisfies(model) -> bool:
    return (isinstance(model, RuntimeModel) and isinstance(model.cache, RuntimeCache)
            and isinstance(model.config, ModelShape))


def test_models_satisfy_runtime_model():
    from decodelab.parallel.check import build_model
    from decodelab.parallel.group import TPGroup

    tiny = _tiny()
    tp = build_model(tiny.config, tiny.weights, TPGroup(0, 1, torch.device("cpu")), num_blocks=8)
    for model in (FakeModel(), tiny, tp):
        assert _satisfies(model), type(model).__name__


def test_something_without_decode_is_not_a_runtime_model():
    class NoDecode:
        def __init__(self) -> None:
            fake = FakeModel()
            self.config, self.cache, self.device = fake.config, fake.cache, fake.device
            self.prefill = fake.prefill

    assert not isinstance(NoDecode(), RuntimeModel)
    assert isinstance(FakeModel(), RuntimeModel)


def test_stand_in_graphs_satisfy_forward_graphs():
    assert isinstance(EagerGraphs(FakeModel()), ForwardGraphs)
    assert not isinstance(FakeModel(), ForwardGraphs)


def _requests(n: int, vocab: int) -> list[Request]:
    rng = random.Random(3)
    return [Request(f"r{i}", tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 9))),
                    SamplingParams(temperature=rng.choice([0.0, 0.9]), top_k=rng.choice([0, 5]),
                                   seed=i, max_new_tokens=rng.randint(1, 12)))
            for i in range(n)]


def test_graphs_run_path_gives_the_eager_tokens():
    """With graphs but fresh inputs each step the engine calls ``graphs.run`` (padding to the
    bucket); its tokens equal the engine's without graphs."""
    model = _tiny()
    cfg = EngineConfig(max_num_seqs=8, max_model_len=128, static_inputs=False)
    tokens = []
    for graphs in (None, EagerGraphs(model, max_blocks_per_seq=16)):
        eng = Engine(model, cfg, graphs)
        assert (eng.runner.graphs is None) == (graphs is None) and eng.runner.step_graphs is None
        handles = [eng.submit(r) for r in _requests(12, model.config.vocab_size)]
        eng.run()
        tokens.append([h.tokens for h in handles])
        assert eng.pool.num_free == eng.pool.num_total
    assert tokens[0] == tokens[1]
