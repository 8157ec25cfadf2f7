"""Admission checks: each bad value is named with its allowed range."""

from __future__ import annotations

import re
from dataclasses import fields

import numpy as np
import pytest

from decodelab.core.validate import ConfigError, check_bool
from decodelab.engine.config import EngineConfig
from decodelab.engine.requests import (
    InvalidRequestError,
    Limits,
    Request,
    SamplingParams,
    validate_request,
)

LIMITS = Limits(vocab_size=100, max_model_len=32)


@pytest.mark.parametrize(("kwargs", "field", "allowed"), [
    (dict(temperature=-0.1), "temperature", r"\[0.0, 100.0\]"),
    (dict(temperature=float("nan")), "temperature", r"\[0.0, 100.0\]"),
    (dict(top_p=0.0), "top_p", r"\(0.0, 1.0\]"),
    (dict(top_p=1.5), "top_p", r"\(0.0, 1.0\]"),
    (dict(top_k=-1), "top_k", ">= 0"),
    (dict(min_p=2.0), "min_p", r"\[0.0, 1.0\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty", r"\[0.01, 100.0\]"),
    (dict(repetition_penalty=1e-50), "repetition_penalty", r"\[0.01, 100.0\]"),
    (dict(presence_penalty=3.0), "presence_penalty", r"\[-2.0, 2.0\]"),
    (dict(frequency_penalty=-3.0), "frequency_penalty", r"\[-2.0, 2.0\]"),
    (dict(seed=-1), "seed", "integer in"),
    (dict(max_new_tokens=0), "max_new_tokens", ">= 1"),
    (dict(stop_sequences=((),)), "stop_sequences", "non-empty"),
])
def test_sampling_params_name_field_and_range(kwargs, field, allowed):
    with pytest.raises(InvalidRequestError, match=rf"SamplingParams\.{field}(\[\])?=.*{allowed}"):
        SamplingParams(**kwargs)


def test_invalid_request_is_a_config_error():
    assert issubclass(InvalidRequestError, ConfigError)


@pytest.mark.parametrize(("request_", "match"), [
    (Request("a", ()), r"Request\['a'\]\.prompt: must be a non-empty"),
    (Request("a", (1, 100)), r"prompt\[1\]=100: must be a token id in \[0, 99\]"),
    (Request("a", (1, -1)), r"prompt\[1\]=-1"),
    (Request("a", (True,)), r"prompt\[0\]=True \(bool\): must be an integer token id in \[0, 99\]"),
    (Request("a", (1.0,)), r"prompt\[0\]=1.0 \(float\): must be an integer token id"),
    (Request("a", (np.int64(100),)), r"prompt\[0\]=np.int64\(100\): must be a token id in"),
    (Request(7, (1,)), r"Request.request_id=7 \(int\): must be a non-empty str"),
    (Request(None, (1,)), r"Request.request_id=None \(NoneType\): must be a non-empty str"),
    (Request("a", tuple(range(32))), r"prompt: length 32 can never fit; must be in \[1, 31\]"),
    (Request("a", (1,), SamplingParams(stop_token_ids=(100,))), r"stop_token_ids\[0\]=100"),
    (Request("a", (1,), SamplingParams(stop_sequences=((1, 200),))), r"stop_sequences\[0\]\[1\]"),
    (Request("a", (1,), SamplingParams(top_k=101)), r"top_k=101: must be in \[0, 100\]"),
])
def test_validate_request_names_field(request_, match):
    with pytest.raises(InvalidRequestError, match=match):
        validate_request(request_, LIMITS)


def test_valid_request_passes():
    validate_request(Request("ok", tuple(range(31)), SamplingParams(top_k=100)), LIMITS)


def test_numpy_token_ids_are_token_ids():
    ids = np.arange(5, dtype=np.int64)
    validate_request(Request("np", tuple(ids), SamplingParams(stop_token_ids=(np.int32(3),))),
                     LIMITS)


@pytest.mark.parametrize("temperature", [0.0, 1e-50, 9e-6])
def test_a_temperature_below_the_greedy_bound_is_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy
    assert not SamplingParams(temperature=1e-5).greedy


def test_engine_config_refuses_what_the_model_and_pool_cannot_serve():
    with pytest.raises(ConfigError, match=r"eos_token_id=100: must be a token id in \[0, 99\]"):
        EngineConfig(eos_token_id=100).context_limit(100, 4096, 8192)
    with pytest.raises(ConfigError, match=r"max_model_len=4096: the KV pool holds only 1024 tokens"
                                          r"; must be in \[2, 1024\]"):
        EngineConfig(max_model_len=4096).context_limit(100, 1024, 8192)
    with pytest.raises(ConfigError, match=r"max_model_len=4096: the model has positions for only "
                                          r"2048 tokens"):
        EngineConfig(max_model_len=4096).context_limit(100, 8192, 2048)
    assert EngineConfig().context_limit(100, 1024, 2048) == 1024  # None: what both allow
    assert EngineConfig(max_model_len=512).context_limit(100, 1024, 2048) == 512
    with pytest.raises(ConfigError, match=r"EngineConfig.sampler='cuda': must be one of"):
        EngineConfig(sampler="cuda")


def test_the_engine_refuses_to_start_beyond_its_pool():
    from fake_runtime_model import FakeModel

    from decodelab.engine.engine import Engine

    model = FakeModel(num_blocks=8, block_size=4)  # 32 tokens
    with pytest.raises(ConfigError, match=r"max_model_len=64: the KV pool holds only 32 tokens"):
        Engine(model, EngineConfig(max_model_len=64))
    with pytest.raises(ConfigError, match=r"eos_token_id=48: must be a token id in \[0, 47\]"):
        Engine(model, EngineConfig(eos_token_id=48))
    with pytest.raises(ConfigError, match=r"sampler='fused': needs a CUDA device"):
        Engine(model, EngineConfig(sampler="fused"))


@pytest.mark.parametrize("cls", [SamplingParams, EngineConfig])
@pytest.mark.parametrize("value", ["no", "False", "yes", None, 0, 1, 1.0])
def test_every_bool_field_takes_a_bool_only(cls, value):
    names = [f.name for f in fields(cls) if f.type == "bool"]
    assert names
    for name in names:
        with pytest.raises(ConfigError, match=re.escape(f"{cls.__name__}.{name}={value!r}")
                           + r" \(\w+\): must be a bool"):
            cls(**{name: value})


def test_numpy_bools_are_bools():
    assert SamplingParams(ignore_eos=np.bool_(True)).ignore_eos
    EngineConfig(use_graphs=np.False_, async_output=np.True_, static_inputs=True,
                 sync_phases=False)
    check_bool("X", "flag", np.bool_(False))
    with pytest.raises(ConfigError, match=r"X.flag=array\(\[ True\]\) \(ndarray\)"):
        check_bool("X", "flag", np.array([True]))
