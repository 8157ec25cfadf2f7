"""The device side of one engine step: a step's inputs, the forward pass, the sampler, and the
copy of the sampled tokens towards the host. The engine decides which rows run; the runner
issues their work, asynchronously, and charges each part to its phase (``metrics.PHASES``).

Decode rows take the static-batch path (``StaticBatch``: one pinned -> device copy of the
step's inputs), then, with graphs, three replays (stage, forward, sample: ``StepGraphs``);
without, the same work eagerly. Prefill rows (admission only) use fresh tensors. Sampled
tokens are scattered into the per-slot ``last_token`` table on the device, where the next
step's inputs read them, and copied into the engine's ``TokenOutput``.
"""

from __future__ import annotations

import torch

from decodelab.engine.batch import StaticBatch, prefill_params
from decodelab.engine.config import EngineConfig
from decodelab.engine.metrics import PhaseClock
from decodelab.engine.output import TokenOutput
from decodelab.engine.protocols import ForwardGraphs, RuntimeModel
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
                 max_blocks: int, output: TokenOutput) -> None:
        self.model, self.cfg, self.output = model, config, output
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

    def prefill(self, admit: list[Sequence], buf: int, clock: PhaseClock) -> None:
        """Prefill admitted rows and sample their next token into ``buf``'s prefill columns."""
        uses_pen = [s.params.uses_penalties for s in admit]
        for seq in admit:
            if seq.params.uses_penalties:
                dev = self.device
                self.penalties.reset_slot(seq.slot, torch.tensor(seq.request.prompt, device=dev),
                                          torch.tensor(seq.output, dtype=torch.int64, device=dev))
        params = prefill_params(admit, self.device)
        clock.mark("prepare")
        logits = self.model.prefill([s.all_tokens() for s in admit], [s.blocks for s in admit])
        clock.mark("forward")  # logits: (len(admit), vocab)
        mode = choose_mode([s.params.greedy for s in admit], [s.params.top_k for s in admit],
                           uses_pen, self.vocab, self.cfg.max_partial_k)
        mode = fused(mode) if self.fused else mode
        self._sample_into(admit, logits, params, mode, buf)
        clock.mark("sample")

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
            logits = sg.forward(bucket)
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
