"""The engine's decode step as three CUDA graph replays per bucket: stage, forward, sample.

With graphs, issuing one decode step is, on the host: one pinned -> device copy of the
step's inputs (``StaticBatch.prepare``), then

    stage   (a graph per bucket)          last tokens gathered into the forward graph's
                                          input buffers, with positions, cache slots, block
                                          tables and context lengths;
    forward (phase 4a's ``DecodeGraphs``)  the model, replayed (over the narrow block table
                                          where the bucket has one and the batch's longest
                                          row fits it);
    sample  (a graph per bucket and mode)  ``sampler.sample_step``: the whole batched
                                          sampler (the fused Triton kernels on a GPU with
                                          Triton) with the last-token scatter, the penalty
                                          counts and the packed output row;

then one device -> pinned copy of the packed tokens. Eagerly the same work is ~40 kernel
launches, each costing the host more than the kernel costs the device.

Every per-step value is read at replay from static device tensors (the ``StaticBatch``
buffers, which the step's single copy fills, the forward graph's output, the penalty tables
and ``last_token``); nothing per step is a Python value frozen at capture. Only the
*mode* (all greedy, penalties, number of candidates) is fixed per graph, so there is one
graph per (bucket, mode, forward table): each forward graph of a bucket writes its own logits,
and the first time a (bucket, mode) pair occurs its graphs for both tables are captured, so a
warm-up over short contexts prepares the steps over long ones too. Where two-stage candidate
selection applies, that first time also times it against one direct ``topk`` (graphs of the
sampler alone, on that step's logits) and captures the faster: the same candidates either way. The sampler graphs
write only into static tensors (``out`` and the tables), so their intermediates are dead
after each replay and they share one memory pool.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from decodelab.core.timing import time_graph_replays
from decodelab.engine.batch import Int, StaticBatch
from decodelab.engine.sampler import PenaltyState, SamplerMode, sample, sample_step


class StepGraphs:
    def __init__(self, graphs, batch: StaticBatch, penalties: PenaltyState) -> None:
        if batch.max_blocks > graphs.max_blocks_per_seq:
            raise ValueError(f"StepGraphs: the engine's block tables have {batch.max_blocks} "
                             f"columns; the forward graphs were captured with "
                             f"{graphs.max_blocks_per_seq}")
        self.graphs, self.batch, self.penalties = graphs, batch, penalties
        self.out = torch.zeros(batch.max_rows, dtype=torch.int64, device=batch.device)
        self.pool = None  # one memory pool for all of them, made at the first capture
        self._stage: dict[int, torch.cuda.CUDAGraph | None] = {}
        # (bucket, narrow, mode) -> (graph or None: eager, the mode it runs: the selection)
        self._sample: dict[tuple[int, bool, SamplerMode],
                           tuple[torch.cuda.CUDAGraph | None, SamplerMode]] = {}
        self.selections: dict[tuple[int, SamplerMode], dict] = {}  # timed choices
        self.captures = 0
        self.failed = 0  # captures that failed (those bodies run eagerly)
        self.last: tuple[int, SamplerMode] | None = None  # (bucket, mode) of the last sample
        self.narrow = False  # the last forward replayed the narrow table's graph

    # ------------------------------------------------------------------ the bodies
    def stage_body(self, bucket: int) -> None:
        g, b, m = self.graphs, self.batch, self.batch.max_blocks
        b.stage(bucket, g.input_ids[:bucket], g.context_lens[:bucket])
        g.positions[:bucket].copy_(b.dev_i[Int.POSITION, :bucket])
        g.slot_mapping[:bucket].copy_(b.dev_i[Int.SLOT_MAPPING, :bucket])
        g.block_tables[:bucket, :m].copy_(b.dev_bt[:bucket])

    def logits(self, bucket: int, narrow: bool = False) -> torch.Tensor:
        """The static output (bucket, vocab) of the bucket's forward graph (``narrow``: the
        one over the narrow block table)."""
        return self.graphs.narrow[bucket][1] if narrow else self.graphs.outputs[bucket]

    def sample_body(self, bucket: int, mode: SamplerMode, narrow: bool = False) -> None:
        sample_step(self.logits(bucket, narrow), self.batch.static_views(bucket).params, mode,
                    self.penalties, self.batch.last_token, self.out[:bucket])

    # ------------------------------------------------------------------ the step
    def stage(self, bucket: int) -> None:
        if bucket not in self._stage:
            body = lambda: self.stage_body(bucket)  # noqa: E731 - idempotent: its own warm-up
            self._stage[bucket] = self._capture_or_none(f"stage[{bucket}]", body, body)
        graph = self._stage[bucket]
        if graph is None:
            self.stage_body(bucket)
        else:
            graph.replay()

    def forward(self, bucket: int, longest: int) -> torch.Tensor:
        """Replay the bucket's forward graph for a batch whose longest row holds ``longest``
        positions: the narrow table's where it fits. Returns its logits."""
        self.narrow = self.graphs.fits_narrow(bucket, longest)
        (self.graphs.narrow[bucket][0] if self.narrow else self.graphs.graphs[bucket]).replay()
        return self.logits(bucket, self.narrow)

    def sample(self, bucket: int, mode: SamplerMode) -> torch.Tensor:
        """Replay the sampler graph of (bucket, mode) on the last forward's logits; returns
        ``out[:bucket]`` (tokens, -1 for non-finite rows), valid until the next call."""
        narrow = self.narrow
        key = (bucket, narrow, mode)
        if key not in self._sample:  # one selection; a graph on each forward table's logits
            used = self._selection(bucket, mode, narrow)
            params = self.batch.static_views(bucket).params
            for table in (False, True) if bucket in self.graphs.narrow else (False,):
                graph = self._capture_or_none(
                    f"sample[{bucket}, {used}]",
                    lambda t=table: self.sample_body(bucket, used, t),
                    # warm-up without side effects (the body's scatters would count twice)
                    lambda t=table: sample(self.logits(bucket, t), params, used, self.penalties))
                self._sample[(bucket, table, mode)] = (graph, used)
        graph, used = self._sample[key]
        if graph is None:
            self.sample_body(bucket, used, narrow)
        else:
            graph.replay()
        self.last = (bucket, mode)
        return self.out[:bucket]

    def _selection(self, bucket: int, mode: SamplerMode, narrow: bool) -> SamplerMode:
        """Two-stage or direct candidate selection, whichever is faster here, timed once per
        (bucket, mode) on the device on this step's logits (those of the ``narrow`` table's
        graph or the full one's; side-effect-free graphs of the sampler alone). Both find the
        same candidates (the order of ties at the edge of the candidate set aside, which no
        row's top-k reaches)."""
        if not mode.chunk:
            return mode
        options = (mode, replace(mode, chunk=0))
        try:
            times = [self._replay_ms(bucket, m, narrow) for m in options]
        except RuntimeError as exc:
            print(f"[step_graphs] selection timing failed, two-stage kept: {exc}", flush=True)
            return mode
        used = options[int(times[1] < times[0])]
        self.selections[(bucket, mode)] = dict(two_stage_us=times[0] * 1e3,
                                               direct_us=times[1] * 1e3, chunk=used.chunk)
        return used

    def _replay_ms(self, bucket: int, mode: SamplerMode, narrow: bool, reps: int = 5) -> float:
        params = self.batch.static_views(bucket).params

        def pure():
            sample(self.logits(bucket, narrow), params, mode, self.penalties)

        graph = self._capture(pure, pure)
        return time_graph_replays(graph, reps) * 1e3  # ms

    def check(self, bucket: int, mode: SamplerMode) -> bool:
        """Replay the sampler graph of (bucket, mode) on the last forward's logits and run its
        body eagerly on the same inputs (those logits, parameters and tables): True if the
        tokens and the updated tables are identical. The tables are left as they were."""
        last, counts = self.batch.last_token, self.penalties.counts
        last0, counts0 = last.clone(), counts.clone()
        graph_out = self.sample(bucket, mode).clone()
        graph_tables = (last.clone(), counts.clone())
        last.copy_(last0)
        counts.copy_(counts0)
        self.sample_body(bucket, self._sample[(bucket, self.narrow, mode)][1], self.narrow)
        ok = (torch.equal(graph_out, self.out[:bucket]) and torch.equal(graph_tables[0], last)
              and torch.equal(graph_tables[1], counts))
        last.copy_(last0)
        counts.copy_(counts0)
        return ok

    def _capture_or_none(self, name: str, body, warm) -> torch.cuda.CUDAGraph | None:
        """The captured graph, or None (the body then runs eagerly, same result) if capture
        fails; the failure is reported once and counted."""
        try:
            return self._capture(body, warm)
        except RuntimeError as exc:
            self.failed += 1
            print(f"[step_graphs] capture of {name} failed, running it eagerly: {exc}",
                  flush=True)
            return None

    def _capture(self, body, warm) -> torch.cuda.CUDAGraph:
        """Capture ``body`` after one run of ``warm`` (lazy initialisation of the kernels'
        workspaces happens outside the capture), both on a side stream ordered after the
        work already issued. Unlike ``torch.cuda.graph``, no device synchronisation, garbage
        collection or cache release: a capture in the middle of a run costs only itself."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            warm()
            graph.capture_begin(pool=self.pool)
            try:
                body()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        self.captures += 1
        return graph
