"""The inputs of one decode step: static device buffers filled from pinned host mirrors.

Everything that changes per step (which slot a row reads its last token from, its position,
the cache slot it writes, its block table, its context length, its sampling parameters and
its uniform) is written on the host into a pinned buffer and copied to the device with one
asynchronous copy per buffer; nothing is allocated on the device in the loop. Two pinned
mirrors alternate: the engine waits for step t-1's outputs before it fills step t+1's inputs,
so the copy that last read a mirror has finished before the host writes it again.

Padding rows (up to the graph bucket) read and write the spare slot ``num_slots``, write
cache slot -1 (nothing) and attend to one position of the scratch block.

The sampling inputs are the packed rows ``requests.RowSampling`` declares (``ROW_DTYPE``):
a slot table of them on the host, filled at admission, and per step one row per batch row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from decodelab.engine.requests import Sequence
from decodelab.engine.row_sampling import (
    NO_TOP_K,
    ROW_DTYPE,
    ROW_WORDS,
    RowParams,
    RowSampling,
    row_array,
)
from decodelab.engine.sampler import (
    SamplerMode,
    key_uniforms,
    mode_of,
    row_uniforms,
    seed_keys,
)
from decodelab.model.kv_cache import slots_at

U_WINDOW = 64  # uniforms precomputed per slot


class Int(enum.IntEnum):
    """Rows of the step buffer's int64 block, (len(Int), rows): the forward pass's inputs."""

    SLOT = 0  # the slot a row reads its last token and penalty tables from
    POSITION = 1
    SLOT_MAPPING = 2  # the cache slot the row writes; -1 = padding (writes nothing)
    CONTEXT_LEN = 3


PADDING_ROW = RowSampling()  # the schema's defaults: greedy, every filter and penalty off


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Device views (B = bucket rows) handed to the model and the sampler."""

    input_ids: torch.Tensor  # (B,) int64
    positions: torch.Tensor  # (B,) int64
    slot_mapping: torch.Tensor  # (B,) int64, -1 = padding
    block_tables: torch.Tensor  # (B, max_blocks) int32
    context_lens: torch.Tensor  # (B,) int64 (int32 view in context_lens32)
    context_lens32: torch.Tensor
    params: RowParams


def prefill_params(rows: list[Sequence], device: torch.device) -> RowParams:
    """Sampling inputs of a prefill batch (admission steps only, so fresh tensors are fine)."""
    packed = row_array([RowSampling.of(s.params, slot=s.slot) for s in rows])
    packed["uniform"] = row_uniforms(np.array([s.seed for s in rows]),
                                     np.array([s.launched for s in rows]))
    return RowParams.of(packed, device)


class StaticBatch:
    """Preallocated step inputs for up to ``max_rows`` rows (the largest bucket).

    Per-slot host tables hold what changes only at admission (sampling parameters, seed) or
    when a block is added (the block table), so preparing a step is a few vectorised gathers.
    """

    def __init__(self, max_rows: int, max_blocks: int, num_slots: int, block_size: int,
                 scratch_block: int, device: torch.device) -> None:
        self.max_rows, self.max_blocks, self.block_size = max_rows, max_blocks, block_size
        self.spare_slot, self.scratch_block = num_slots, scratch_block
        self.device = device
        pin = device.type == "cuda"
        # One byte buffer holds the int fields, the sampling rows and the block tables (typed
        # views of it), so a step's inputs travel in ONE pinned -> device copy; two host
        # mirrors alternate.
        n_i, n_r = len(Int) * max_rows * 8, max_rows * ROW_WORDS * 4
        self._layout = (n_i, n_r, max_rows * max_blocks * 4)
        nbytes = sum(self._layout)
        self.host = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.host_i, self.host_r, self.host_bt = zip(*(self._typed(h) for h in self.host),
                                                     strict=True)
        self.dev_i, self.dev_r, self.dev_bt = self._typed(self.dev)
        self.dev_ids = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.dev_ctx32 = torch.zeros(max_rows, dtype=torch.int32, device=device)
        # last sampled token per slot (+ the spare slot of padding rows)
        self.last_token = torch.zeros(num_slots + 1, dtype=torch.int64, device=device)
        # per-slot host tables; the spare slot holds the padding row's values
        n = num_slots + 1
        self.slot_rows = row_array([PADDING_ROW] * n)  # (n,) ROW_DTYPE; uniform, slot: per step
        self.slot_key = np.zeros(n, dtype=np.uint64)  # seed_keys of the slot's request seed
        self.slot_pen = np.zeros(n, dtype=bool)
        self.slot_bt = np.full((n, max_blocks), scratch_block, dtype=np.int32)
        self.slot_prompt = np.zeros(n, dtype=np.int64)  # prompt length (position of token 0)
        # each slot's next U_WINDOW uniforms (counters base .. base + U_WINDOW - 1), computed
        # in one vectorised hash when a row leaves its window: per step, one gather
        self.slot_u = np.zeros((n, U_WINDOW), dtype=np.float32)
        self.slot_ubase = np.full(n, -2 * U_WINDOW, dtype=np.int64)  # stale: no window yet
        self._flip = 0
        self.longest = 0  # the longest context of the rows last prepared (0: none)
        self._views_of: dict[int, StepInputs] = {}  # bucket -> the static views (fixed)
        self._modes: dict[tuple[bytes, int, int], SamplerMode] = {}  # reset at each assign

    def _typed(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ints (len(Int), R) int64, sampling rows (R, ROW_WORDS) int32, block tables (R, M)
        int32) views."""
        n_i, n_r, _ = self._layout
        return (buf[:n_i].view(torch.int64).view(len(Int), self.max_rows),
                buf[n_i:n_i + n_r].view(torch.int32).view(self.max_rows, ROW_WORDS),
                buf[n_i + n_r:].view(torch.int32).view(self.max_rows, self.max_blocks))

    def assign(self, seq: Sequence) -> None:
        """Record an admitted sequence's parameters and blocks in its slot's host tables."""
        p, k = seq.params, seq.slot
        self.slot_rows[k] = row_array([RowSampling.of(p)])[0]
        self.slot_key[k], self.slot_pen[k] = seed_keys(np.array([seq.seed]))[0], p.uses_penalties
        self.slot_prompt[k] = seq.num_prompt
        self.slot_ubase[k] = -2 * U_WINDOW  # another seed: the old window is stale
        self._modes.clear()
        self.slot_bt[k] = self.scratch_block
        self.set_blocks(seq, 0)

    def set_blocks(self, seq: Sequence, first: int) -> None:
        """Copy ``seq.blocks[first:]`` (new blocks) into its slot's block table."""
        self.slot_bt[seq.slot, first:len(seq.blocks)] = seq.blocks[first:]

    def mode(self, slots: np.ndarray, vocab: int, max_partial: int) -> SamplerMode:
        """``choose_mode`` of the rows in these slots, vectorised over the slot tables and
        remembered per set of slots until the next admission changes a slot's parameters."""
        key = (slots.tobytes(), vocab, max_partial)
        mode = self._modes.get(key)
        if mode is None:
            mode = self._modes[key] = self._mode(slots, vocab, max_partial)
        return mode

    def _mode(self, slots: np.ndarray, vocab: int, max_partial: int) -> SamplerMode:
        rows = self.slot_rows[slots]
        sampling = rows["greedy"] == 0  # SamplingParams.greedy, recorded at admission
        ks = rows["top_k"][sampling]
        filters = bool(((ks < vocab) | (rows["top_p"][sampling] < 1.0)).any())
        ks = np.where(ks == NO_TOP_K, 0, ks)  # 0 = off, as choose_mode has it
        return mode_of(ks.size == 0, bool(self.slot_pen[slots].any()),
                       int(ks.min()) if ks.size else 0, int(ks.max()) if ks.size else 0,
                       vocab, max_partial, any_greedy=not sampling.all(), filters=filters,
                       min_p=bool((rows["min_p"][sampling] > 0.0).any()))

    def prepare(self, rows: list[Sequence], bucket: int, *, static: bool = True
                ) -> tuple[StepInputs, np.ndarray]:
        """Fill the next mirror for ``rows`` (padded to ``bucket``) and start its copy.
        Returns the device views and the rows' slots (host, (bucket,)); ``longest`` holds the
        rows' longest context."""
        k = self._flip
        self._flip ^= 1
        hi, hr, hbt = (t.numpy() for t in (self.host_i[k], self.host_r[k], self.host_bt[k]))
        n, bs = len(rows), self.block_size
        slots = np.full(bucket, self.spare_slot, dtype=np.int64)
        slots[:n] = [s.slot for s in rows]
        launched = np.zeros(bucket, dtype=np.int64)
        launched[:n] = [s.launched for s in rows]
        # input: the last launched token, at position prompt + launched - 1 (padding: 0)
        pos = self.slot_prompt[slots] + launched - 1
        pos[n:] = 0
        self.longest = int(pos[:n].max()) + 1 if n else 0
        bt = self.slot_bt[slots]  # (bucket, max_blocks)
        mapping = slots_at(bt, pos, bs)
        mapping[n:] = -1  # padding rows write nothing
        hi[Int.SLOT, :bucket], hi[Int.POSITION, :bucket] = slots, pos
        hi[Int.SLOT_MAPPING, :bucket], hi[Int.CONTEXT_LEN, :bucket] = mapping, pos + 1
        rows = hr.view(ROW_DTYPE).reshape(self.max_rows)[:bucket]  # the packed rows
        rows[:] = self.slot_rows[slots]
        rows["uniform"], rows["slot"] = self._uniforms(slots, launched), slots
        hbt[:bucket] = bt
        if not static:  # the naive way: fresh device tensors every step
            dev_i = torch.tensor(hi[:, :bucket], device=self.device)
            dev_r = torch.tensor(hr[:bucket], device=self.device)
            dev_bt = torch.tensor(hbt[:bucket], device=self.device)
            return self._views(dev_i, dev_r, dev_bt, self.last_token[dev_i[Int.SLOT]],
                               dev_i[Int.CONTEXT_LEN].to(torch.int32), bucket), slots
        # The whole mirror: one contiguous pinned -> device copy (a strided slice would be
        # staged through pageable memory and copied synchronously).
        self.dev.copy_(self.host[k], non_blocking=True)
        return self.static_views(bucket), slots

    def _uniforms(self, slots: np.ndarray, launched: np.ndarray) -> np.ndarray:
        """``key_uniforms(slot_key[slots], launched)``, read from the slots' windows."""
        off = launched - self.slot_ubase[slots]
        stale = (off < 0) | (off >= U_WINDOW)
        if stale.any():
            rows = np.flatnonzero(stale)
            s, base = slots[rows], launched[rows]  # repeated slots (padding) agree
            self.slot_ubase[s] = base
            self.slot_u[s] = key_uniforms(self.slot_key[s][:, None],
                                          base[:, None] + np.arange(U_WINDOW))
            off[rows] = 0
        return self.slot_u[slots, off]

    def static_views(self, bucket: int) -> StepInputs:
        """Views of the static device buffers for ``bucket`` rows (the same tensors every
        step: a CUDA graph captured over them reads each step's values). ``input_ids`` and
        ``context_lens32`` are filled by :meth:`stage`."""
        inp = self._views_of.get(bucket)
        if inp is None:
            inp = self._views_of[bucket] = self._views(
                self.dev_i, self.dev_r, self.dev_bt, self.dev_ids[:bucket],
                self.dev_ctx32[:bucket], bucket)
        return inp

    def stage(self, bucket: int, ids: torch.Tensor, ctx32: torch.Tensor) -> None:
        """Device side of preparing: each row's input token (the last token of its slot) into
        ``ids`` and its context length as int32 into ``ctx32`` ((bucket,) each)."""
        torch.index_select(self.last_token, 0, self.dev_i[Int.SLOT, :bucket], out=ids)
        ctx32.copy_(self.dev_i[Int.CONTEXT_LEN, :bucket])

    @staticmethod
    def _views(dev_i, dev_r, dev_bt, ids, ctx32, b: int) -> StepInputs:
        ints = dev_i[:, :b]
        return StepInputs(ids, ints[Int.POSITION], ints[Int.SLOT_MAPPING], dev_bt[:b],
                          ints[Int.CONTEXT_LEN], ctx32, RowParams(dev_r[:b]))
