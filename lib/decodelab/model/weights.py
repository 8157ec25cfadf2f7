"""Model weights: random from a seed, or loaded from a local Hugging Face checkpoint folder.

Both go through one Hugging Face-named state dict (``model.layers.{i}.self_attn.q_proj.weight``
…), so the name mapping is written once and the random weights can be loaded into
``transformers`` unchanged. Nothing is fetched from a hub: ``load_checkpoint(folder)`` reads
``config.json`` and ``model.safetensors`` or the shards listed in
``model.safetensors.index.json``.

In our layout q, k and v are one fused matrix and gate and up another, so a decode step reads
each layer's weights in 4 matmuls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_norm: torch.Tensor  # (d,)
    qkv: torch.Tensor  # (q_size + 2 kv_size, d): rows q, then k, then v
    qkv_bias: torch.Tensor | None  # (q_size + 2 kv_size,) Qwen2-style, else None
    o: torch.Tensor  # (d, q_size)
    mlp_norm: torch.Tensor  # (d,)
    gate_up: torch.Tensor  # (2 f, d): rows gate, then up
    down: torch.Tensor  # (d, f)


@dataclass(frozen=True, slots=True)
class Weights:
    embed: torch.Tensor  # (vocab, d)
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # (d,)
    lm_head: torch.Tensor  # (vocab, d); the embedding itself when tied

    def nbytes_per_step(self, batch: int) -> int:
        """Bytes of weights one decode step must read: every layer, the head, ``batch`` rows
        of the embedding."""
        n = sum(t.numel() * t.element_size() for lw in self.layers for t in
                (lw.attn_norm, lw.qkv, lw.o, lw.mlp_norm, lw.gate_up, lw.down)
                if t is not None)
        n += self.final_norm.numel() * self.final_norm.element_size()
        n += self.lm_head.numel() * self.lm_head.element_size()
        return n + batch * self.embed.shape[1] * self.embed.element_size()


def hf_names(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a Hugging Face Llama-layout checkpoint, with its shape."""
    d, f = config.hidden_size, config.intermediate_size
    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d),
                                         "model.norm.weight": (d,)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (config.q_size, d),
            p + "self_attn.k_proj.weight": (config.kv_size, d),
            p + "self_attn.v_proj.weight": (config.kv_size, d),
            p + "self_attn.o_proj.weight": (d, config.q_size),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f)})
        if config.attention_bias:
            for proj, n in (("q", config.q_size), ("k", config.kv_size), ("v", config.kv_size)):
                names[p + f"self_attn.{proj}_proj.bias"] = (n,)
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (config.vocab_size, d)
    return names


def random_state_dict(config: ModelConfig, seed: int = 0, *, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Random weights, Hugging Face names. Every matrix (the embedding too) is scaled by
    1/sqrt(its row length) so activations stay O(1); norm weights are near 1. A larger tied
    embedding would make each token predict itself, a dull greedy test."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in hf_names(config).items():
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * t
        elif name.endswith(".bias"):
            t = 0.1 * t
        else:
            t = t / shape[1] ** 0.5
        out[name] = t.to(dtype)
    return out


def from_state_dict(config: ModelConfig, sd: dict[str, torch.Tensor], *,
                    dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> Weights:
    """Our fused layout from a Hugging Face-named state dict; checks every name and shape."""
    expected = hf_names(config)
    missing = [n for n in expected if n not in sd]
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    for name, shape in expected.items():
        if tuple(sd[name].shape) != shape:
            raise ValueError(f"checkpoint tensor {name}: shape {tuple(sd[name].shape)}, "
                             f"config says {shape}")

    def get(name: str) -> torch.Tensor:
        return sd[name].to(device=device, dtype=dtype)

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        bias = None
        if config.attention_bias:
            bias = torch.cat([get(a + f"{x}_proj.bias") for x in "qkv"])
        layers.append(LayerWeights(
            attn_norm=get(p + "input_layernorm.weight"),
            qkv=torch.cat([get(a + f"{x}_proj.weight") for x in "qkv"]).contiguous(),
            qkv_bias=bias, o=get(a + "o_proj.weight").contiguous(),
            mlp_norm=get(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([get(p + "mlp.gate_proj.weight"),
                               get(p + "mlp.up_proj.weight")]).contiguous(),
            down=get(p + "mlp.down_proj.weight").contiguous()))
    embed = get("model.embed_tokens.weight").contiguous()
    head = embed if config.tie_word_embeddings else get("lm_head.weight").contiguous()
    return Weights(embed=embed, layers=tuple(layers), final_norm=get("model.norm.weight"),
                   lm_head=head)


def random_weights(config: ModelConfig, seed: int = 0, *, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> Weights:
    return from_state_dict(config, random_state_dict(config, seed, dtype=dtype, device=device),
                           dtype=dtype, device=device)


def read_safetensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: one ``model.safetensors`` or the indexed shards."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors nor model.safetensors.index.json")
    sd: dict[str, torch.Tensor] = {}
    for shard in shards:
        sd.update(load_file(str(folder / shard)))
    return sd


def load_checkpoint(folder: str | Path, *, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> tuple[ModelConfig, Weights]:
    """Config and weights of a local Hugging Face checkpoint folder (never downloads)."""
    config = ModelConfig.from_hf_config_json(folder)
    sd = read_safetensors(folder)
    if not config.tie_word_embeddings and "lm_head.weight" not in sd:
        raise KeyError(f"{folder}: config says untied embeddings but lm_head.weight is missing")
    return config, from_state_dict(config, sd, dtype=dtype, device=device)
