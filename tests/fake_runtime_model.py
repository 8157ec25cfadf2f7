"""CPU stand-ins for engine tests: a tiny, exactly batch-invariant model in place of PagedLlama
(``FakeModel``) and forward "graphs" in place of DecodeGraphs (``EagerGraphs``).

``FakeModel`` satisfies ``engine.protocols.RuntimeModel`` (``prefill``, ``decode``, ``cache``
with a BlockPool, ``config``, ``device``) and has a real paged "cache" that stores token ids
by slot. A row's logits are a
function of every token in its context, read back through its block table, computed in
integer arithmetic, so any block-table, slot or recompute bug changes the output, and a row's
logits never depend on which other rows share the batch.

Fault injection: a sequence whose first token is ``poison`` gets NaN logits once its context
is longer than ``poison_after`` tokens.

``EagerGraphs`` satisfies ``engine.protocols.ForwardGraphs``: static input and output buffers
per bucket, and a "graph" per bucket that runs ``model.decode`` on the static inputs into the
static output when replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.model.block_pool import BlockPool
from decodelab.model.kv_cache import slots_for
from decodelab.model.prefill_pack import check_chunks

_HASH_MOD = 1_000_003  # a prime: the context hash reduced mod it spreads over the table rows


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
        h = torch.where(valid, (ctx + 7) * self.weights[:n], 0).sum(-1) % _HASH_MOD
        out = self.table[h % self.table.shape[0]].clone()
        if self.poison is not None:
            bad = (ctx[:, 0] == self.poison) & (lens > self.poison_after)
            out[bad] = float("nan")
        return out

    def prefill(self, token_ids, block_tables, starts=None) -> torch.Tensor:
        """Chunk i's tokens go to positions starts[i] ..; its logits are those of its whole
        context read back through its block table (earlier chunks and decode steps included),
        so a chunked prefill gives a whole prompt's logits. The real model's input checks."""
        bs = self.cache.block_size
        starts = check_chunks(token_ids, block_tables, starts, block_size=bs,
                              num_blocks=self.cache.num_blocks,
                              vocab_size=self.config.vocab_size,
                              max_positions=self.config.max_position_embeddings)
        rows = []
        for toks, bt, start in zip(token_ids, block_tables, starts, strict=True):
            end = start + len(toks)
            self.cache.write(torch.tensor(slots_for(bt, start, end, bs)), torch.tensor(toks))
            ctx = self.cache.tokens[torch.tensor(slots_for(bt, 0, end, bs))]
            rows.append(self._logits(ctx[None], torch.tensor([end])))
        return torch.cat(rows)

    def decode(self, input_ids, positions, slot_mapping, block_tables, context_lens):
        self.decode_calls += 1
        self.cache.write(slot_mapping, input_ids)
        bs = self.cache.block_size
        bt = block_tables.long()
        slots = (bt[:, :, None] * bs + torch.arange(bs)).reshape(bt.shape[0], -1)  # (B, M*bs)
        return self._logits(self.cache.tokens[slots], context_lens.long())


class Replay:
    """A stand-in for a captured CUDA graph: replay runs the captured body again."""

    def __init__(self, body) -> None:
        self.body = body

    def replay(self) -> None:
        self.body()


class EagerGraphs:
    """``DecodeGraphs``' interface on a CPU (static buffers, padding, replay by bucket)."""

    def __init__(self, model, buckets=(1, 2, 4, 8), max_blocks_per_seq=16, narrow_blocks=0
                 ) -> None:
        n, self.buckets, self.max_blocks_per_seq = max(buckets), tuple(buckets), max_blocks_per_seq
        self.scratch_block, self.block_size = model.cache.scratch_block, model.cache.block_size
        self.narrow_blocks = narrow_blocks
        self.input_ids = torch.zeros(n, dtype=torch.int64)
        self.positions = torch.zeros(n, dtype=torch.int64)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64)
        self.block_tables = torch.full((n, max_blocks_per_seq), self.scratch_block,
                                       dtype=torch.int32)
        self.context_lens = torch.ones(n, dtype=torch.int32)
        self.outputs = {b: torch.zeros(b, model.config.vocab_size) for b in buckets}
        self.graphs = {b: self._replay(model, self.outputs[b], b, None) for b in buckets}
        # with ``narrow_blocks``: every bucket has a graph over that many table columns too
        self.narrow = {b: (self._replay(model, out, b, narrow_blocks), out) for b in buckets
                       for out in [torch.zeros(b, model.config.vocab_size)] if narrow_blocks}

    def _replay(self, model, out, b, blocks):
        return Replay(lambda: out.copy_(model.decode(
            self.input_ids[:b], self.positions[:b], self.slot_mapping[:b],
            self.block_tables[:b, :blocks], self.context_lens[:b])))

    def fits_narrow(self, bucket, longest):
        return bucket in self.narrow and longest <= self.narrow_blocks * self.block_size

    def bucket_for(self, n):
        return next(b for b in self.buckets if b >= n)

    def run(self, input_ids, positions, slot_mapping, block_tables, context_lens):
        """As ``DecodeGraphs.run``: inputs into the first rows, padding rows write nothing and
        attend to the scratch block, the bucket's graph replayed; a view of its output."""
        b, m = input_ids.shape[0], block_tables.shape[1]
        bucket = self.bucket_for(b)
        for buf, src in ((self.input_ids, input_ids), (self.positions, positions),
                         (self.slot_mapping, slot_mapping), (self.context_lens, context_lens)):
            buf[:b].copy_(src)
        self.block_tables[:b, :m].copy_(block_tables)
        self.input_ids[b:bucket] = 0
        self.positions[b:bucket] = 0
        self.slot_mapping[b:bucket] = -1
        self.block_tables[b:bucket] = self.scratch_block
        self.context_lens[b:bucket] = 1
        self.graphs[bucket].replay()
        return self.outputs[bucket][:b]
