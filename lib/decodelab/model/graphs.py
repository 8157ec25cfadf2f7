"""Decode captured as CUDA graphs, one per batch-size bucket, over static input buffers.

Interface (stable):

    graphs = DecodeGraphs(model, buckets=(1, 2, 4, 8, 16, 24, 32), max_blocks_per_seq=M)
    logits = graphs.run(input_ids (B,), positions (B,), slot_mapping (B,),
                        block_tables (B, m <= M) int32, context_lens (B,))   # B <= max bucket
        -> (B, vocab) float32, a view of the bucket's static output: valid until the next
           ``run``; clone it to keep it.
    graphs.bucket_for(B), graphs.buckets, graphs.capture_s, graphs.graph_mem_mib
    graphs.fits_narrow(bucket, longest)  # replay graphs.narrow[bucket] (its graph, output)?

The arguments are those of ``PagedLlama.decode`` (device tensors, or host tensors that are
copied in). ``run`` copies them into the first B rows of the static buffers and fills rows
B .. bucket-1 as padding: token 0, position 0, slot -1 (the cache write skips it), a block
table of the scratch block and context length 1, so padding never touches a real sequence.
Buckets are captured largest first into one shared memory pool (the smaller graphs reuse the
largest one's memory). Positions, slots, block tables and context lengths are read from device
buffers at replay, never frozen at capture time.

Where the model's decode step of a bucket takes rows whole in a narrower block table (Triton
attention once the batch fills the GPU: ``attention_plan.UNCAPPED_TABLE``), that bucket gets a
second graph over the first ``narrow_blocks`` columns of the same buffer: one launch per layer
less (no merge of splits). A caller that knows its batch's longest row on the host replays it
when the row fits (``fits_narrow``; ``run`` does when given ``longest`` or a table that narrow);
a row of 1,025 to 2,048 positions is rounded otherwise there than in the full table's chunks.
The second graphs cost capture time and memory: bench serve's 15 buckets on an H100 (10 with a
narrow graph) took 18.0 s and 1,530 MiB against 9.8 s and 930 MiB (figures in
``attention_plan``'s ``UNCAPPED_TABLE``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.validate import ConfigError, check_int
from decodelab.model.llama import PagedLlama

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    """One CUDA graph of ``model.decode`` per bucket; ``run`` pads to the bucket and replays."""

    def __init__(self, model: PagedLlama, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 max_blocks_per_seq: int = 64, *, warmup: int = 2) -> None:
        if model.device.type != "cuda":
            raise ConfigError(f"DecodeGraphs: CUDA graphs need a CUDA device; model is on "
                              f"{model.device}")
        if not buckets:
            raise ConfigError("DecodeGraphs.buckets: must list at least one batch size")
        for b in buckets:
            check_int("DecodeGraphs", "buckets[]", b, 1, 4096)
        check_int("DecodeGraphs", "max_blocks_per_seq", max_blocks_per_seq, 1)
        self.model = model
        self.block_size = model.cache.block_size
        self.buckets = tuple(sorted(set(buckets)))
        self.max_blocks_per_seq = max_blocks_per_seq
        n, dev = self.buckets[-1], model.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.full((n, max_blocks_per_seq), model.cache.scratch_block,
                                       dtype=torch.int32, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        kv_heads = model.config.num_kv_heads
        narrow = {b: model.ops.whole_rows_table(b, kv_heads, dev) // self.block_size
                  for b in self.buckets}
        narrow = {b: w for b, w in narrow.items() if 0 < w < max_blocks_per_seq}
        # one width for every narrow graph (the plan's, whatever the bucket)
        self.narrow_blocks = min(narrow.values(), default=0)
        self.narrow: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture_all(warmup, tuple(narrow))

    def _static(self, b: int, blocks: int | None = None) -> tuple[torch.Tensor, ...]:
        return (self.input_ids[:b], self.positions[:b], self.slot_mapping[:b],
                self.block_tables[:b, :blocks], self.context_lens[:b])

    def _capture_all(self, warmup: int, narrow: tuple[int, ...]) -> None:
        # Kernel choices per bucket, fixed before capture (timed apart: not capture cost).
        self.model.tune_rows(self.buckets)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        graphs = [(b, None) for b in reversed(self.buckets)]  # largest first: later graphs
        graphs += [(b, self.narrow_blocks) for b in reversed(narrow)]  # fit in its pool
        for b, blocks in graphs:  # Triton compilation, cuBLAS handles: outside capture
            warm_up(lambda b=b, w=blocks: self.model.decode(*self._static(b, w)), warmup)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # so the pool's growth below is the graphs' own memory
        reserved = torch.cuda.memory_reserved()
        for b, blocks in graphs:
            graph = capture(lambda b=b, w=blocks: self.model.decode(*self._static(b, w)),
                            pool=pool)
            if blocks is None:
                self.graphs[b], self.outputs[b] = graph
            else:
                self.narrow[b] = graph
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        self.graph_mem_mib = (torch.cuda.memory_reserved() - reserved) / 2**20

    def bucket_for(self, batch: int) -> int:
        for b in self.buckets:
            if b >= batch:
                return b
        raise ValueError(f"batch {batch} exceeds the largest captured bucket {self.buckets[-1]}")

    def fits_narrow(self, bucket: int, longest: int) -> bool:
        """Whether a batch of ``bucket`` whose longest row holds ``longest`` positions replays
        the narrow table's graph (``narrow[bucket]``)."""
        return bucket in self.narrow and longest <= self.narrow_blocks * self.block_size

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            block_tables: torch.Tensor, context_lens: torch.Tensor, longest: int | None = None
            ) -> torch.Tensor:
        """``longest``: the batch's longest context, if the caller knows it on the host."""
        b = input_ids.shape[0]
        bucket = self.bucket_for(b)
        m = block_tables.shape[1]
        if m > self.max_blocks_per_seq:
            raise ValueError(f"block tables have {m} columns; captured width is "
                             f"{self.max_blocks_per_seq}")
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slot_mapping[:b].copy_(slot_mapping, non_blocking=True)
        self.block_tables[:b, :m].copy_(block_tables, non_blocking=True)
        self.context_lens[:b].copy_(context_lens, non_blocking=True)
        if bucket > b:  # padding rows: write nothing, attend to one scratch slot
            self.input_ids[b:bucket].zero_()
            self.positions[b:bucket].zero_()
            self.slot_mapping[b:bucket].fill_(-1)
            self.block_tables[b:bucket].fill_(self.model.cache.scratch_block)
            self.context_lens[b:bucket].fill_(1)
        if self.fits_narrow(bucket, m * self.block_size if longest is None else longest):
            graph, out = self.narrow[bucket]
        else:
            graph, out = self.graphs[bucket], self.outputs[bucket]
        graph.replay()
        return out[:b]
