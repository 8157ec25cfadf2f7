"""The batch-invariant switch on the CPU: where it is refused and why (it needs Triton on a
CUDA device; the CPU's torch path keeps the guarantee the README states for it). The kernels'
order of work is checked in Triton's interpreter (test_triton_interpreter), their compilation
for every target ahead of time (test_triton_aot), their bits on a GPU in
test_batch_invariant_gpu."""

from __future__ import annotations

import pytest

from decodelab.core.validate import ConfigError
from decodelab.engine import Engine, EngineConfig
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def _tiny(**kw) -> PagedLlama:
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, 0), PagedKVCache(cfg, 32, 8), **kw)


def test_the_torch_path_is_refused_by_name():
    for kw in ({}, {"backend": "torch"}):
        with pytest.raises(ConfigError, match=r"batch_invariant=True: needs the Triton backend "
                                              r"on a CUDA device \(backend 'torch', cache on cpu\)"):
            _tiny(batch_invariant=True, **kw)
    with pytest.raises(ConfigError, match="batch_invariant"):
        _tiny(batch_invariant="yes")
    assert _tiny().batch_invariant is False


def test_the_engine_refuses_a_model_whose_logits_depend_on_the_batch():
    with pytest.raises(ConfigError, match=r"EngineConfig.batch_invariant=True: the model's "
                                          r"logits depend on the batch"):
        Engine(_tiny(), EngineConfig(max_num_seqs=4, max_model_len=64, batch_invariant=True))
    with pytest.raises(ConfigError, match="batch_invariant"):
        EngineConfig(batch_invariant=1)
    Engine(_tiny(), EngineConfig(max_num_seqs=4, max_model_len=64))  # off by default
