"""How the model's outputs are compared, shared by the benches of phases 4a and 5 and the tests.

Stated bounds:
- ``HF_BF16_RTOL``: our bf16 logits vs transformers' bf16 logits on the same weights and the
  same (teacher-forced) tokens: max |diff| / max |reference| per step.
- ``TRITON_RTOL``: Triton paged attention vs the gather reference, both on bf16 inputs.
"""

from __future__ import annotations

import torch

from decodelab.model.config import ModelConfig

HF_BF16_RTOL = 0.05
TRITON_RTOL = 1e-2
PROMPT_LENS = (37, 5, 120, 64, 1, 17, 250, 9)  # 8 prompts: one full graph bucket


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: the error relative to the reference's magnitude."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def prompts(config: ModelConfig, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` seeded random prompts with the lengths of ``PROMPT_LENS`` in turn."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, config.vocab_size, (PROMPT_LENS[i % len(PROMPT_LENS)],),
                          generator=gen).tolist() for i in range(n)]
