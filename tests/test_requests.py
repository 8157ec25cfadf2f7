"""Admission checks: each bad value is named with its allowed range."""

from __future__ import annotations

import pytest

from decodelab.core.validate import ConfigError
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
    (dict(repetition_penalty=0.0), "repetition_penalty", r"\(0.0, 100.0\]"),
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
    (Request("a", (True,)), r"prompt\[0\]=True"),
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
