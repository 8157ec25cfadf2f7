"""The engine's decode step as three CUDA graph replays per bucket: stage, forward, sample.

With graphs, issuing one decode step is, on the host: one pinned -> device copy of the
step's inputs (``StaticBatch.prepare``), then

    stage   (a graph per bucket)          last tokens gathered into the forward graph's
                                          input buffers, with positions, cache slots, block
                                          tables and context lengths;
    forward (phase 4a's ``DecodeGraphs``)  the model, replayed;
    sample  (a graph per bucket and mode)  ``sampling.sample_step``: the whole batched
                                          sampler with the last-token scatter, the penalty
                                          counts and the packed output row;

then one device -> pinned copy of the packed tokens. Eagerly the same work is ~40 kernel
launches, each costing the host more than the kernel costs the device.

Every per-step value is read at replay from static device tensors (the ``StaticBatch``
buffers, which the step's single copy fills, the forward graph's output, the penalty tables
and ``last_token``); nothing per step is a Python value frozen at capture. Only the
*mode* (all greedy, penalties, number of candidates) is fixed per graph, so there is one
graph per (bucket, mode), captured the first time that pair occurs. The sampler graphs
write only into static tensors (``out`` and the tables), so their intermediates are dead
after each replay and they share one memory pool.
"""

from __future__ import annotations

import torch

from decodelab.runtime.batch import StaticBatch
from decodelab.runtime.sampling import PenaltyState, SamplerMode, sample, sample_step


class StepGraphs:
    def __init__(self, graphs, batch: StaticBatch, penalties: PenaltyState) -> None:
        if batch.max_blocks > graphs.max_blocks_per_seq:
            raise ValueError(f"StepGraphs: the engine's block tables have {batch.max_blocks} "
                             f"columns; the forward graphs were captured with "
                             f"{graphs.max_blocks_per_seq}")
        self.graphs, self.batch, self.penalties = graphs, batch, penalties
        self.out = torch.zeros(batch.max_rows, dtype=torch.int64, device=batch.device)
        self.pool = None  # one memory pool for all of them, made at the first capture
        self._stage: dict[int, torch.cuda.CUDAGraph] = {}
        self._sample: dict[tuple[int, SamplerMode], torch.cuda.CUDAGraph] = {}
        self.captures = 0
        self.last: tuple[int, SamplerMode] | None = None  # (bucket, mode) of the last sample

    # ------------------------------------------------------------------ the bodies
    def stage_body(self, bucket: int) -> None:
        g, b, m = self.graphs, self.batch, self.batch.max_blocks
        b.stage(bucket, g.input_ids[:bucket], g.context_lens[:bucket])
        g.positions[:bucket].copy_(b.dev_i[1, :bucket])
        g.slot_mapping[:bucket].copy_(b.dev_i[2, :bucket])
        g.block_tables[:bucket, :m].copy_(b.dev_bt[:bucket])

    def logits(self, bucket: int) -> torch.Tensor:
        """The forward graph's static output (bucket, vocab)."""
        return self.graphs.outputs[bucket]

    def sample_body(self, bucket: int, mode: SamplerMode) -> None:
        sample_step(self.logits(bucket), self.batch.static_views(bucket).params, mode,
                    self.penalties, self.batch.last_token, self.out[:bucket])

    # ------------------------------------------------------------------ the step
    def stage(self, bucket: int) -> None:
        graph = self._stage.get(bucket)
        if graph is None:
            body = lambda: self.stage_body(bucket)  # noqa: E731 - idempotent: its own warm-up
            graph = self._stage[bucket] = self._capture(body, body)
        graph.replay()

    def forward(self, bucket: int) -> torch.Tensor:
        self.graphs.graphs[bucket].replay()
        return self.logits(bucket)

    def sample(self, bucket: int, mode: SamplerMode) -> torch.Tensor:
        """Replay the sampler graph of (bucket, mode); returns ``out[:bucket]`` (tokens, -1
        for non-finite rows), valid until the next call."""
        key = (bucket, mode)
        graph = self._sample.get(key)
        if graph is None:
            params = self.batch.static_views(bucket).params
            graph = self._sample[key] = self._capture(
                lambda: self.sample_body(bucket, mode),
                # warm-up without side effects (the body's scatters would count twice)
                lambda: sample(self.logits(bucket), params, mode, self.penalties))
        graph.replay()
        self.last = key
        return self.out[:bucket]

    def check(self, bucket: int, mode: SamplerMode) -> bool:
        """Replay the sampler graph of (bucket, mode) and run its body eagerly on the same
        inputs (the current logits, parameters and tables): True if the tokens and the
        updated tables are identical. The tables are left as they were."""
        last, counts = self.batch.last_token, self.penalties.counts
        last0, counts0 = last.clone(), counts.clone()
        graph_out = self.sample(bucket, mode).clone()
        graph_tables = (last.clone(), counts.clone())
        last.copy_(last0)
        counts.copy_(counts0)
        self.sample_body(bucket, mode)
        ok = (torch.equal(graph_out, self.out[:bucket]) and torch.equal(graph_tables[0], last)
              and torch.equal(graph_tables[1], counts))
        last.copy_(last0)
        counts.copy_(counts0)
        return ok

    def _capture(self, body, warm) -> torch.cuda.CUDAGraph:
        """Capture ``body`` after one run of ``warm`` on a side stream (lazy initialisation
        of the kernels' workspaces happens outside the capture)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            warm()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            body()
        self.captures += 1
        return graph
