"""The shared toy step: configs validate, the step chains, seeds are reproducible."""

import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.toy import step as toy


@pytest.mark.parametrize(("field", "value"), [
    ("hidden", 0), ("hidden", 1.5), ("layers", 0), ("layers", 65), ("batch", 0),
    ("batch", True), ("vocab", 1), ("dtype", "float16"), ("seed", -1),
])
def test_bad_config_values_name_the_field(field, value):
    good = dict(hidden=8, layers=2, batch=2, vocab=16)
    with pytest.raises(ConfigError, match=f"ToyConfig.{field}="):
        toy.ToyConfig(**{**good, field: value})


def test_named_configs_match_the_study():
    assert set(toy.NAMED_CONFIGS) == {"ultra-light", "h256", "medium", "heavy"}
    assert toy.named("medium") == toy.ToyConfig(hidden=1024, layers=8, batch=8, vocab=1024)
    with pytest.raises(ConfigError, match="unknown toy config"):
        toy.named("tiny")


def test_step_shapes_and_dtype():
    cfg = toy.ToyConfig(hidden=16, layers=3, batch=5, vocab=32)
    w = toy.make_weights(cfg)
    x, token = toy.step(w, toy.initial_state(cfg))
    assert x.shape == (5, 16) and x.dtype == torch.float32
    assert token.shape == (5,) and token.dtype == torch.int64
    assert int(token.min()) >= 0 and int(token.max()) < 32


def test_state_update_is_the_documented_function():
    cfg = toy.ToyConfig(hidden=8, layers=2, batch=3, vocab=16)
    w = toy.make_weights(cfg)
    x0 = toy.initial_state(cfg)
    h = x0
    for layer in range(2):
        h = torch.tanh(h @ w.w[layer] + w.b[layer])
    token = torch.argmax(h @ w.w_out, dim=-1)
    x, got = toy.step(w, x0)
    assert torch.equal(got, token)
    torch.testing.assert_close(x, 0.5 * (h + w.embed[token]))
    torch.testing.assert_close(toy.logits_of(w, x0), h @ w.w_out)


def test_weights_and_states_are_seeded():
    cfg = toy.named("ultra-light")
    a, b = toy.make_weights(cfg), toy.make_weights(cfg)
    assert torch.equal(a.w, b.w) and torch.equal(a.embed, b.embed)
    assert not torch.equal(a.w, toy.make_weights(cfg.with_(seed=1)).w)
    assert not torch.equal(toy.initial_state(cfg), toy.initial_state(cfg, seed=7))


def test_steps_chain_and_depend_on_the_state():
    cfg = toy.named("ultra-light")
    w = toy.make_weights(cfg)
    traj = toy.run_eager(w, toy.initial_state(cfg), 20)
    assert traj.tokens.shape == (20, 1) and traj.states.shape == (20, 1, 64)
    assert len(set(traj.tokens.flatten().tolist())) > 1  # tokens change from step to step
    other = toy.run_eager(w, toy.initial_state(cfg, seed=9), 20)
    assert not torch.equal(traj.tokens, other.tokens)


def test_bf16_weights_and_tolerance():
    cfg = toy.named("ultra-light").with_(dtype="bfloat16")
    w = toy.make_weights(cfg)
    assert w.w.dtype == torch.bfloat16
    x, _ = toy.step(w, toy.initial_state(cfg))
    assert x.dtype == torch.bfloat16
    assert toy.state_tolerance(x, torch.bfloat16) > toy.state_tolerance(x, torch.float32)


def test_run_eager_rejects_zero_steps():
    cfg = toy.named("ultra-light")
    with pytest.raises(ConfigError, match="n_steps"):
        toy.run_eager(toy.make_weights(cfg), toy.initial_state(cfg), 0)
