"""The static batch's named layout: the sampling rows packed as ``RowSampling`` declares them,
the step buffer and the prefill path agreeing field by field, padding rows holding the
schema's defaults."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from decodelab.engine.batch import PADDING_ROW, Int, StaticBatch, prefill_params
from decodelab.engine.requests import Request, SamplingParams, Sequence
from decodelab.engine.row_sampling import (
    I32,
    NO_TOP_K,
    ROW_DTYPE,
    ROW_WORDS,
    RowField,
    RowParams,
    RowSampling,
    row_array,
)


def test_the_packed_row_and_its_views_follow_the_schema():
    """RowSampling declares the layout once: the packed dtype, the field index and the
    RowParams views (float32 or int32, as declared) all follow its fields in order."""
    names = [f.name for f in fields(RowSampling)]
    assert list(ROW_DTYPE.names) == names and len(RowField) == ROW_WORDS == len(names)
    assert [m.name.lower() for m in RowField] == names
    assert [m.value for m in RowField] == list(range(ROW_WORDS))
    assert [m.value for m in Int] == list(range(len(Int)))
    row = RowSampling.of(SamplingParams(temperature=0.5, top_k=7, top_p=0.8, min_p=0.1,
                                        repetition_penalty=1.1, presence_penalty=0.2,
                                        frequency_penalty=-0.3), uniform=0.25, slot=5)
    p = RowParams.of([row, PADDING_ROW])
    for f in fields(RowSampling):
        view = getattr(p, f.name)
        assert view.dtype == (torch.int32 if f.type == I32 else torch.float32), f.name
        assert view[0].item() == np.asarray(getattr(row, f.name), view.numpy().dtype), f.name
        assert view[1].item() == np.asarray(getattr(PADDING_ROW, f.name), view.numpy().dtype)
    assert row_array([row])["greedy"][0] == 0 and p.greedy.tolist() == [0, 1]
    assert p.inv_temperature[0].item() == np.float32(2.0)
    p.uniform = torch.tensor([0.75, 0.5])  # a field written through its view
    assert p.block.view(torch.float32)[0, RowField.UNIFORM].item() == 0.75


def _seqs() -> list[Sequence]:
    params = [SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=1),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.3, repetition_penalty=1.2, presence_penalty=0.5,
                             frequency_penalty=-0.25, seed=3)]
    seqs = [Sequence(Request(f"q{i}", (1, 2, 3, 4 + i), p), arrival=i, seed=100 + i, slot=2 - i)
            for i, p in enumerate(params)]
    for s in seqs:
        s.blocks = [2 * s.slot, 2 * s.slot + 1]
        s.launched = 1 + s.slot
    return seqs


def test_step_buffer_and_prefill_pack_the_same_parameters():
    seqs = _seqs()
    batch = StaticBatch(4, 2, 3, 4, 9, torch.device("cpu"))
    for s in seqs:
        batch.assign(s)
    inp, slots = batch.prepare(seqs, 4)
    want = prefill_params(seqs, torch.device("cpu"))
    assert torch.equal(inp.params.block[:3], want.block)  # every field, bit for bit
    assert inp.params.temperature[:3].tolist() == [np.float32(x) for x in (0.7, 0.0, 1.3)]
    assert inp.params.top_k[:3].tolist() == [20, NO_TOP_K, NO_TOP_K]
    assert inp.params.inv_temperature[1] == 1.0  # greedy rows: 1 / T is 1
    assert slots.tolist() == [2, 1, 0, 3]  # the padding row reads the spare slot
    assert inp.positions[:3].tolist() == [6, 5, 4]  # prompt (4) + launched (3, 2, 1) - 1
    assert inp.context_lens[:3].tolist() == [7, 6, 5]
    assert batch.longest == 7  # the rows' longest context, padding left out
    # position p writes block blocks[p // 4] at offset p % 4; padding writes nothing
    assert inp.slot_mapping.tolist() == [5 * 4 + 2, 3 * 4 + 1, 1 * 4 + 0, -1]


def test_mode_counts_a_tiny_temperature_as_greedy_like_the_rows_and_the_device():
    """Temperatures below GREEDY_BELOW are greedy (SamplingParams.greedy, RowParams.sampling):
    the step's mode from the slot tables agrees with choose_mode of the rows."""
    from decodelab.engine.sampler import choose_mode

    batch = StaticBatch(6, 2, 6, 4, 9, torch.device("cpu"))
    settings = [(5e-6, 0, 0.5, 0.0), (0.8, 16, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (1e-5, 4, 1.0, 0.0),
                (0.7, 0, 1.0, 0.1), (1.0, 0, 0.9, 0.0)]  # greedy with a top-p; min-p; top-p
    rows = [Sequence(Request(f"q{i}", (1, 2), SamplingParams(temperature=t, top_k=k, top_p=p,
                                                             min_p=m)),
                     arrival=i, seed=i, slot=i) for i, (t, k, p, m) in enumerate(settings)]
    for s in rows:
        batch.assign(s)
    assert [s.params.greedy for s in rows] == [True, False, True, False, False, False]
    for subset in (rows, rows[:1], rows[::2], rows[1:2], rows[1:], rows[4:5], rows[5:],
                   [rows[0], rows[4]]):
        slots = np.array([s.slot for s in subset])
        ps = [s.params for s in subset]
        want = choose_mode([p.greedy for p in ps], [p.top_k for p in ps],
                           [p.uses_penalties for p in ps], 512, top_p=[p.top_p for p in ps],
                           min_p=[p.min_p for p in ps])
        assert batch.mode(slots, 512, 1024) == want, [s.request_id for s in subset]
    # a greedy row's top-p needs no threshold; a min-p row alone no top-k/top-p kernels
    assert not batch.mode(np.array([0, 2]), 512, 1024).filters
    assert batch.mode(np.array([4]), 512, 1024).min_p
    assert not batch.mode(np.array([4]), 512, 1024).filters


def test_padding_rows_hold_the_padding_row():
    batch = StaticBatch(4, 2, 3, 4, 9, torch.device("cpu"))
    inp, _ = batch.prepare([], 4)
    p = inp.params
    for f in fields(RowSampling):
        if f.name not in ("uniform", "slot"):  # set per step
            assert (getattr(p, f.name) == getattr(PADDING_ROW, f.name)).all(), f.name
    assert (p.inv_temperature == 1.0).all() and (p.top_k == NO_TOP_K).all()
    assert (p.slot == batch.spare_slot).all() and (inp.slot_mapping == -1).all()
