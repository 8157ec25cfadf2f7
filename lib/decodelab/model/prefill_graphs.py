"""Prefill captured as CUDA graphs, one per token bucket, over static pack buffers.

Eager, one prefill call of Llama-3.2-1B is about 150 kernel launches (9 per layer), each
costing the host tens of microseconds: a warm call of 256 or 512 tokens took 6.7-8.8 ms on an
H200 (table ``paged_prefill``) for 1-2 ms of device work, so every step of a server that
prefills is as long as its host's launches. With the Triton backend nothing a prefill
launches depends on the chunk lengths on the host: the varlen attention kernel's grid
depends on the rows and the chunk count alone (``triton.prefill_attention``), every other
kernel on the rows. So one graph of a padded pack replays every pack of up to its rows and
chunks:

    graphs = PrefillGraphs(model, buckets=(16, 32, ..., 2048), max_chunks=16,
                           max_blocks_per_seq=M)
    logits = graphs.prefill(token_ids, block_tables, starts)  # PagedLlama.prefill's contract
        -> (n, vocab) float32, a view of the bucket's static output: valid until the next call
    graphs.bucket_for(tokens, chunks) -> the bucket, or None (the pack runs eagerly)
    graphs.buckets, graphs.capture_s, graphs.graph_mem_mib

Padding: rows past the pack's tokens hold token 0 at position 0 with slot -1 (the cache write
skips them; attention leaves them out), chunks past its own are empty (their query starts
repeat the pack's end) over table rows nobody reads. The inputs are checked on the host
first, as eagerly, and copied in two pinned -> device copies. A pack of more tokens than the
largest bucket or more chunks than ``max_chunks`` (or a longer block table) runs eagerly:
large packs are bound by their FLOPs, not their launches. Buckets are captured largest first
into one shared memory pool.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.host_copy import copy_into
from decodelab.core.validate import ConfigError, check_int
from decodelab.model.llama import PagedLlama
from decodelab.model.prefill_pack import HostPack, PrefillPack, host_pack

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
ALIGN = 16  # bucket sizes are multiples of it: each buffer view starts 16-byte aligned


class StaticPack:
    """The device buffers a prefill graph reads its pack from: up to ``rows`` rows and
    ``chunks`` chunks of tables ``width`` blocks wide, viewed per bucket (``view``) and filled
    from a checked host pack with its padding (``fill``)."""

    def __init__(self, rows: int, chunks: int, width: int, device: torch.device) -> None:
        self.chunks, self.width = chunks, width
        # int64 ids | positions | slots of a bucket's rows, back to back from offset 0
        self.tokens = torch.zeros(3 * rows, dtype=torch.int64, device=device)
        # int32 query starts (chunks + 1) | starts (chunks) | tables (chunks, width), each
        # 16-byte aligned
        self.starts_at = _aligned(chunks + 1)
        self.tables_at = self.starts_at + _aligned(chunks)
        self.small = torch.zeros(self.tables_at + chunks * width, dtype=torch.int32,
                                 device=device)

    def view(self, bucket: int) -> PrefillPack:
        """The pack of a bucket's rows (its ``last`` computed on the device)."""
        c, t, s = self.chunks, self.tokens, self.small
        qs = s[:c + 1]
        return PrefillPack(ids=t[:bucket], positions=t[bucket:2 * bucket],
                           slot_mapping=t[2 * bucket:3 * bucket],
                           block_tables=s[self.tables_at:].view(c, self.width),
                           query_starts=qs, starts=s[self.starts_at:self.starts_at + c],
                           last=(qs[1:] - 1).clamp_min(0).long())

    def empty(self, bucket: int) -> None:
        """No chunk, and rows that write nothing (warm-up and capture)."""
        self.small[:self.chunks + 1].zero_()
        self.tokens[2 * bucket:3 * bucket].fill_(-1)

    def fill(self, host: HostPack, bucket: int) -> None:
        """``host`` (``width``-wide tables) padded to ``bucket`` rows and ``chunks`` chunks:
        rows past its tokens are token 0 at position 0 writing nothing (slot -1), chunks past
        its own are empty (their query starts repeat its end). Two pinned -> device copies."""
        n, t, c = host.starts.shape[0], host.tokens.shape[1], self.chunks
        tokens = np.zeros((3, bucket), dtype=np.int64)
        tokens[:, :t] = host.tokens
        tokens[2, t:] = -1
        small = np.zeros(self.tables_at + n * self.width, dtype=np.int32)
        small[:n + 1], small[n + 1:c + 1] = host.bounds, t
        small[self.starts_at:self.starts_at + n] = host.starts
        small[self.tables_at:] = host.tables.ravel()
        copy_into(self.tokens[:3 * bucket], torch.from_numpy(tokens).view(-1))
        copy_into(self.small[:small.size], torch.from_numpy(small))


class PrefillGraphs:
    """One CUDA graph of ``model.prefill_packed`` per token bucket; ``prefill`` pads a pack to
    its bucket and replays (or runs it eagerly where none fits)."""

    def __init__(self, model: PagedLlama, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 max_chunks: int = 16, max_blocks_per_seq: int = 64, *, warmup: int = 2
                 ) -> None:
        own = "PrefillGraphs"
        if model.device.type != "cuda" or model.backend != "triton":
            raise ConfigError(f"{own}: needs a CUDA model on the Triton backend (the torch "
                              f"backend's attention reads the lengths on the host); model is "
                              f"{model.backend} on {model.device}")
        if not buckets:
            raise ConfigError(f"{own}.buckets: must list at least one token count")
        for b in buckets:
            check_int(own, "buckets[]", b, ALIGN, 1 << 16)
            if b % ALIGN:
                raise ConfigError(f"{own}.buckets[]={b}: must be a multiple of {ALIGN}")
        from decodelab.model.triton.prefill_attention import CHUNK_TILE  # Triton: lazily

        check_int(own, "max_chunks", max_chunks, 1, CHUNK_TILE)  # one pass finds a chunk
        check_int(own, "max_blocks_per_seq", max_blocks_per_seq, 1)
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.max_chunks, self.width = max_chunks, max_blocks_per_seq
        self.static = StaticPack(self.buckets[-1], max_chunks, max_blocks_per_seq, model.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._capture_all(warmup)

    def _run(self, bucket: int) -> torch.Tensor:
        return self.model.prefill_packed(self.static.view(bucket))

    def _capture_all(self, warmup: int) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in reversed(self.buckets):  # Triton compilation, cuBLAS handles: outside capture
            self.static.empty(b)
            warm_up(lambda b=b: self._run(b), warmup)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # so the pool's growth below is the graphs' own memory
        reserved = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.buckets):  # largest first: later graphs fit in its pool
            self.graphs[b], self.outputs[b] = capture(lambda b=b: self._run(b), pool=pool)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        self.graph_mem_mib = (torch.cuda.memory_reserved() - reserved) / 2**20

    def bucket_for(self, tokens: int, chunks: int) -> int | None:
        """The smallest bucket of at least ``tokens`` rows, or None (eager) past the largest or
        past ``max_chunks`` chunks."""
        if chunks > self.max_chunks:
            return None
        return next((b for b in self.buckets if b >= tokens), None)

    def prefill(self, token_ids: Sequence[Sequence[int]], block_tables: Sequence[Sequence[int]],
                starts: Sequence[int] | None = None) -> torch.Tensor:
        bucket = self.bucket_for(sum(map(len, token_ids)), len(token_ids))
        if bucket is None or max(map(len, block_tables), default=0) > self.width:
            return self.model.prefill(token_ids, block_tables, starts)
        cfg = self.model.config
        host = host_pack(self.model.cache, token_ids, block_tables, starts,
                         vocab_size=cfg.vocab_size, max_positions=cfg.max_position_embeddings,
                         width=self.width)
        self.static.fill(host, bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:len(token_ids)]


def _aligned(count: int) -> int:
    """``count`` int32 elements rounded up to whole 16-byte units."""
    return -(-count // 4) * 4
