"""The paged Llama against transformers' LlamaForCausalLM on the same weights (CPU, fp32)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.model.config import ModelConfig, named_config, rope_inv_freq
from decodelab.model.kv_cache import PagedKVCache, decode_inputs, slots_at, slots_for
from decodelab.model.llama import PagedLlama, greedy_generate
from decodelab.model.weights import from_state_dict, load_checkpoint, random_state_dict

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 17, 99, 3, 250, 8], [42], [7, 7, 300, 12, 1, 9, 88, 2, 31, 400, 64, 5, 6],
           [11, 500, 23]]
NEW_TOKENS = 32
# fp32 on both sides; differences are summation order only.
LOGIT_RTOL = 1e-4


def hf_model(config: ModelConfig, sd: dict[str, torch.Tensor]):
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_dict()))
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if config.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf.eval()


def ours(config, sd, num_blocks=96, block_size=4):
    cache = PagedKVCache(config, num_blocks, block_size)
    return PagedLlama(config, from_state_dict(config, sd), cache, backend="torch")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def setup(request):
    config = named_config("tiny", tie_word_embeddings=request.param)
    sd = random_state_dict(config, seed=1)
    return config, sd, hf_model(config, sd)


def test_greedy_decode_matches_transformers_generate(setup):
    config, sd, hf = setup
    model = ours(config, sd)
    tokens, logits = greedy_generate(model, PROMPTS, NEW_TOKENS)
    assert model.cache.pool.num_free == model.cache.pool.num_total
    assert len({t for row in tokens for t in row}) > 8  # not a degenerate repeat of one token
    for i, prompt in enumerate(PROMPTS):  # one prompt at a time: no padding on the HF side
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                          min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
        hf_tokens = out.sequences[0, len(prompt):].tolist()
        assert tokens[i] == hf_tokens, f"prompt {i}: tokens differ"
        hf_logits = torch.stack([step[0] for step in out.logits])  # (NEW_TOKENS, vocab)
        assert rel_err(logits[i], hf_logits.float()) < LOGIT_RTOL


def test_prefill_matches_full_forward(setup):
    config, sd, hf = setup
    logits = ours(config, sd).prefill(PROMPTS, [[4 * i + j for j in range(4)] for i in range(4)])
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0, -1]
        assert rel_err(logits[i], ref) < LOGIT_RTOL


@pytest.mark.parametrize("shard", [None, "40KB"], ids=["single", "sharded"])
def test_save_pretrained_checkpoint_loads(setup, tmp_path, shard):
    config, sd, hf = setup
    kwargs = {"max_shard_size": shard} if shard else {}
    hf.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").exists() == (shard is not None)
    loaded_config, weights = load_checkpoint(tmp_path)
    assert dataclasses.replace(loaded_config, name=config.name) == config
    a = PagedLlama(loaded_config, weights, PagedKVCache(loaded_config, 32, 4))
    b = ours(config, sd, num_blocks=32)
    tables = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert torch.equal(a.prefill(PROMPTS[2:], tables), b.prefill(PROMPTS[2:], tables))


def test_llama3_rope_scaling_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for name in ("llama-3.2-1b", "tiny"):
        config = named_config(name)
        hf_config = transformers.LlamaConfig(**config.to_hf_dict())
        hf_inv, scaling = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
        assert scaling == 1.0
        assert torch.equal(rope_inv_freq(config), hf_inv.float())


def test_config_json_of_llama_3_2_1b_parses(tmp_path):
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
          "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
          "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
          "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"},
          "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    parsed = ModelConfig.from_hf_config_json(tmp_path)
    assert dataclasses.replace(parsed, name="llama-3.2-1b") == named_config("llama-3.2-1b")
    assert named_config("llama-3.2-1b").num_parameters() == 1_235_814_400
    with pytest.raises(ConfigError, match="rope_type"):
        ModelConfig.from_hf_dict({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ConfigError, match="num_kv_heads"):
        named_config("tiny", num_kv_heads=3)


def test_padding_rows_write_nothing_and_change_no_other_row(setup):
    config, sd, _ = setup
    model = ours(config, sd, num_blocks=16)
    tables = [[0, 1], [2, 3]]
    model.prefill([[1, 2, 3], [4, 5]], tables)
    before_k, before_v = model.cache.k.clone(), model.cache.v.clone()
    bt = model.cache.block_table_tensor(tables + [[]], 2)
    ids, pos = torch.tensor([9, 0, 0]), torch.tensor([3, 0, 0])
    slots = torch.tensor([slots_for(tables[0], 3, 4, 4)[0], -1, -1])
    lens = torch.tensor([4, 1, 1], dtype=torch.int32)
    padded = model.decode(ids, pos, slots, bt, lens)
    scratch = model.cache.scratch_block
    changed = (model.cache.k != before_k).any(dim=(0, 2, 3, 4)).nonzero().flatten().tolist()
    assert set(changed) <= {0, scratch}  # row 0's block and the scratch block only
    assert torch.equal(model.cache.v[:, 1:scratch], before_v[:, 1:scratch])
    model.cache.k.copy_(before_k)
    model.cache.v.copy_(before_v)
    alone = model.decode(ids[:1], pos[:1], slots[:1], bt[:1], lens[:1])
    assert rel_err(padded[:1], alone) < 1e-6


def test_qwen2_style_checkpoint_with_qkv_bias(tmp_path):
    """Qwen2 = the Llama layout plus biases on q, k and v: loads from its folder and matches."""
    config = named_config("tiny", attention_bias=True, rope_scaling=None, rope_theta=10000.0,
                          tie_word_embeddings=False)
    sd = random_state_dict(config, seed=2)
    hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config.to_hf_dict(),
                                                                 use_sliding_window=False))
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not missing and not unexpected
    hf.eval().save_pretrained(tmp_path)
    loaded_config, weights = load_checkpoint(tmp_path)
    assert loaded_config.attention_bias
    model = PagedLlama(loaded_config, weights, PagedKVCache(loaded_config, 96, 4))
    tokens, logits = greedy_generate(model, PROMPTS[:1], 8)
    out = hf.generate(torch.tensor(PROMPTS[:1]), max_new_tokens=8, min_new_tokens=8,
                      do_sample=False, output_logits=True, return_dict_in_generate=True,
                      pad_token_id=0)
    assert tokens[0] == out.sequences[0, len(PROMPTS[0]):].tolist()
    assert rel_err(logits[0], torch.stack([s[0] for s in out.logits])) < LOGIT_RTOL


def test_slots_at_is_slots_for_on_tensors_and_on_host_arrays():
    tables = [[3, 0, 7], [5, 2, 1]]
    pos = [37, 16]
    want = [slots_for(t, p, p + 1, 16)[0] for t, p in zip(tables, pos, strict=True)]
    on_device = slots_at(torch.tensor(tables, dtype=torch.int32), torch.tensor(pos), 16)
    on_host = slots_at(np.array(tables, dtype=np.int32), np.array(pos), 16)
    assert on_device.dtype == torch.int64 and on_device.tolist() == want
    assert on_host.dtype == np.int64 and on_host.tolist() == want


def test_decode_inputs_pads_tables_to_the_width_asked():
    cache = PagedKVCache(named_config("tiny"), 16, block_size=8)
    tables, (ids, pos, slots, bt, lens) = decode_inputs(cache, 2, 20, width=5)
    assert bt.shape == (2, 5) and (bt[:, 3:] == cache.scratch_block).all()
    assert pos.tolist() == [19, 19] and lens.tolist() == [20, 20] and ids.shape == (2,)
    assert slots.tolist() == [slots_for(t, 19, 20, 8)[0] for t in tables]
