"""A tiny, exactly batch-invariant stand-in for PagedLlama, for engine tests.

It has the model's interface (``prefill``, ``decode``, ``cache`` with a BlockPool, ``config``,
``device``) and a real paged "cache" that stores token ids by slot. A row's logits are a
function of every token in its context, read back through its block table, computed in
integer arithmetic, so any block-table, slot or recompute bug changes the output, and a row's
logits never depend on which other rows share the batch.

Fault injection: a sequence whose first token is ``poison`` gets NaN logits once its context
is longer than ``poison_after`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.model.block_pool import BlockPool

_P = 1_000_003


@dataclass(frozen=True)
class FakeConfig:
    vocab_size: int = 48
    max_position_embeddings: int = 512


class FakeCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.pool = BlockPool(num_blocks, block_size)
        self.tokens = torch.full(((num_blocks + 1) * block_size,), -1, dtype=torch.int64)

    @property
    def scratch_block(self) -> int:
        return self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def write(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        keep = slots >= 0
        self.tokens[slots[keep]] = tokens[keep]


class FakeModel:
    def __init__(self, num_blocks: int = 64, block_size: int = 4, *, vocab: int = 48,
                 scale: float = 2.5, poison: int | None = None, poison_after: int = 8,
                 seed: int = 0) -> None:
        self.config = FakeConfig(vocab)
        self.device = torch.device("cpu")
        self.cache = FakeCache(num_blocks, block_size)
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(4093, vocab, generator=g) * scale  # (M, V) logits by hash
        self.weights = torch.randint(1, 1 << 20, (self.config.max_position_embeddings,),
                                     generator=g)
        self.poison, self.poison_after = poison, poison_after
        self.decode_calls = 0

    def _logits(self, ctx: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """ctx (B, L) token ids (-1 past the end), lens (B,) -> (B, V)."""
        n = ctx.shape[1]
        valid = torch.arange(n)[None, :] < lens[:, None]
        h = torch.where(valid, (ctx + 7) * self.weights[:n], 0).sum(-1) % _P
        out = self.table[h % self.table.shape[0]].clone()
        if self.poison is not None:
            bad = (ctx[:, 0] == self.poison) & (lens > self.poison_after)
            out[bad] = float("nan")
        return out

    def prefill(self, token_ids, block_tables) -> torch.Tensor:
        bs = self.cache.block_size
        rows = []
        for toks, bt in zip(token_ids, block_tables, strict=True):
            slots = torch.tensor([bt[p // bs] * bs + p % bs for p in range(len(toks))])
            self.cache.write(slots, torch.tensor(toks))
            rows.append(self._logits(torch.tensor([toks]), torch.tensor([len(toks)])))
        return torch.cat(rows)

    def decode(self, input_ids, positions, slot_mapping, block_tables, context_lens):
        self.decode_calls += 1
        self.cache.write(slot_mapping, input_ids)
        bs = self.cache.block_size
        bt = block_tables.long()
        slots = (bt[:, :, None] * bs + torch.arange(bs)).reshape(bt.shape[0], -1)  # (B, M*bs)
        return self._logits(self.cache.tokens[slots], context_lens.long())
