"""The device side of one engine step: a step's inputs, the forward pass, the sampler, and the
copy of the sampled tokens towards the host. The engine decides which rows run; the runner
issues their work, asynchronously, and charges each part to its phase (``metrics.PHASES``).

A step (:meth:`ModelRunner.launch`) may mix prefill chunks and decode rows. The chunks run
first, in one varlen ``model.prefill(chunks, tables, starts)`` call (eagerly, or through the
prefill graph of their token bucket with ``prefill_graphs``); only the sequences whose last chunk this is sample (from its last position's logits;
the other chunks' logits are discarded). Decode rows take the static-batch path
(``StaticBatch``: one pinned -> device copy of the step's inputs), then, with graphs, three
replays (stage, forward, sample: ``StepGraphs``); without, the same work eagerly. The two
parts touch disjoint slots and blocks. Sampled tokens are scattered into the per-slot
``last_token`` table on the device, where the next step's inputs read them, and copied into
the engine's ``TokenOutput``.
"""

from __future__ import annotations

import torch

from decodelab.core.host_copy import to_device
from decodelab.engine.batch import StaticBatch, prefill_params
from decodelab.engine.config import EngineConfig
from decodelab.engine.metrics import PhaseClock
from decodelab.engine.output import TokenOutput
from decodelab.engine.plan import Chunk, SchedulePlan
from decodelab.engine.protocols import ForwardGraphs, Prefill, RuntimeModel
from decodelab.engine.requests import Sequence
from decodelab.engine.sampler import (
    PenaltyState,
    RowParams,
    SamplerMode,
    choose_mode,
    fused,
    sample_step,
    use_fused,
)
from decodelab.engine.step_graphs import StepGraphs


class ModelRunner:
    def __init__(self, model: RuntimeModel, config: EngineConfig, graphs: ForwardGraphs | None,
                 max_blocks: int, output: TokenOutput, prefill_graphs: Prefill | None = None
                 ) -> None:
        self.model, self.cfg, self.output = model, config, output
        # prefill chunks through their token bucket's graph (eager where none holds them)
        self.prefill_graphs = prefill_graphs if config.use_graphs else None
        self.device = torch.device(model.device)
        self.vocab = model.config.vocab_size
        self.fused = use_fused(config.sampler, self.device)  # the Triton sampler
        self.graphs = graphs if config.use_graphs else None
        rows, cache = config.max_num_seqs, model.cache
        self.batch = StaticBatch(rows, max_blocks, rows, cache.block_size, cache.scratch_block,
                                 self.device)
        self.penalties = PenaltyState.empty(rows + 1, self.vocab, self.device)
        # stage + sampler graphs around the forward graph (only with static inputs: they
        # read the static buffers)
        self.step_graphs = (StepGraphs(self.graphs, self.batch, self.penalties)
                            if self.graphs is not None and config.static_inputs else None)
        # Fault injection for tests and demos: logits_hook(rows, logits) may edit the logits of
        # a step in place before sampling. None (the default) costs nothing.
        self.logits_hook = None

    def bucket(self, n: int) -> int:
        """Decode rows after padding to the forward graph's bucket."""
        return n if self.graphs is None else self.graphs.bucket_for(n)

    def launch(self, plan: SchedulePlan, bucket: int, buf: int, clock: PhaseClock
               ) -> tuple[list[Sequence], list[int]]:
        """Issue the plan's step: its chunks, then its decode rows (padded to ``bucket``).
        Returns the rows that sample and the column of each in ``buf``."""
        rows: list[Sequence] = []
        cols: list[int] = []
        if plan.prefill:
            done = self.prefill(plan.prefill, buf, clock)
            rows += done
            cols += range(self.output.prefill_col, self.output.prefill_col + len(done))
        if plan.decode:
            decode = [s for s, _ in plan.decode]
            self.decode(decode, bucket, buf, clock)
            rows += decode
            cols += range(len(decode))
        return rows, cols

    def prefill(self, chunks: tuple[Chunk, ...], buf: int, clock: PhaseClock) -> list[Sequence]:
        """Prefill the chunks in one call; the sequences whose last chunk this is sample their
        next token into ``buf``'s prefill columns. Returns those sequences."""
        dev = self.device
        for c in chunks:
            if c.start == 0 and c.seq.params.uses_penalties:  # its first chunk: a new slot
                self._reset_penalties(c.seq)
        final = [i for i, c in enumerate(chunks) if c.final]
        rows = [chunks[i].seq for i in final]
        params = prefill_params(rows, dev) if rows else None
        clock.mark("prepare")
        # looked up per call, not bound once: tests and fault demos wrap model.prefill
        call = self.model.prefill if self.prefill_graphs is None else self.prefill_graphs.prefill
        logits = call([c.seq.all_tokens()[c.start:c.start + c.tokens]
                      for c in chunks], [c.seq.blocks for c in chunks], [c.start for c in chunks])
        clock.mark("forward")  # logits: (len(chunks), vocab)
        if rows:
            if len(rows) < len(chunks):  # the other chunks end mid-prompt: discarded
                logits = logits[to_device(torch.tensor(final), dev)]
            ps = [s.params for s in rows]
            mode = choose_mode([p.greedy for p in ps], [p.top_k for p in ps],
                               [p.uses_penalties for p in ps], self.vocab,
                               self.cfg.max_partial_k, top_p=[p.top_p for p in ps],
                               min_p=[p.min_p for p in ps])
            self._sample_into(rows, logits, params, fused(mode) if self.fused else mode, buf)
        clock.mark("sample")
        return rows

    def _reset_penalties(self, seq: Sequence) -> None:
        """The slot's penalty tables count ``seq``'s prompt and output so far (recompute)."""
        dev = self.device
        self.penalties.reset_slot(seq.slot, to_device(torch.tensor(seq.request.prompt), dev),
                                  to_device(torch.tensor(seq.output, dtype=torch.int64), dev))

    def decode(self, decode: list[Sequence], bucket: int, buf: int, clock: PhaseClock) -> None:
        """One decode step of running rows (padded to ``bucket``), sampled into ``buf``'s
        decode columns."""
        sg = self.step_graphs
        inp, slots = self.batch.prepare(decode, bucket, static=self.cfg.static_inputs)
        mode = self.batch.mode(slots[:len(decode)], self.vocab, self.cfg.max_partial_k)
        mode = fused(mode) if self.fused else mode
        if sg is None and self.cfg.static_inputs:
            self.batch.stage(bucket, inp.input_ids, inp.context_lens32)
        clock.mark("prepare")
        if sg is not None:
            sg.stage(bucket)
            logits = sg.forward(bucket, self.batch.longest)
        else:
            args = (inp.input_ids, inp.positions, inp.slot_mapping, inp.block_tables,
                    inp.context_lens32)
            logits = (self.graphs.run(*args) if self.graphs is not None
                      else self.model.decode(*args))
        clock.mark("forward")  # logits: (bucket, vocab)
        if self.logits_hook is not None:
            self.logits_hook(decode, logits)
        if sg is not None:
            out = sg.sample(bucket, mode)
        else:
            out = torch.empty(bucket, dtype=torch.int64, device=self.device)
            sample_step(logits, inp.params, mode, self.penalties, self.batch.last_token, out)
        self.output.copy(out, buf, 0, len(decode))
        clock.mark("sample")

    def _sample_into(self, rows: list[Sequence], logits: torch.Tensor, params: RowParams,
                     mode: SamplerMode, buf: int) -> None:
        if self.logits_hook is not None:
            self.logits_hook(rows, logits)
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=self.device)
        sample_step(logits, params, mode, self.penalties, self.batch.last_token, out)
        self.output.copy(out, buf, self.output.prefill_col, len(rows))
