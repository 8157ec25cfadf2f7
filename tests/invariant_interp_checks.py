"""The batch-invariant kernels (``model.triton.invariant``) in Triton's CPU interpreter (fp32),
run by test_batch_invariant.py in a child process with TRITON_INTERPRET=1: each row's output
is the same bits alone and in any batch, in any block-table width, from prefill as from
decode, and close to the torch reference. These checks prove the kernels' order of work, not
the tensor cores': the interpreter's dot is NumPy's matmul, whose BLAS gives a row other bits
at another place in its tile, so ``_rowwise_dot`` computes each row of a dot on its own (the
property a tensor-core tile is taken to have, which the GPU-marked tests check on the GPU).

    python tests/invariant_interp_checks.py CHECK [CHECK ...]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from prefill_cases import padded
from triton_interp_checks import _bool_comparisons, _rel, _scalar_loop_bounds

RTOL = 1e-5  # fp32 on both sides: summation order only


def _rowwise_dot() -> None:
    """The interpreter's tl.dot, one row at a time (each row's products alone, whatever its
    place in the tile)."""
    import numpy as np
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def rowwise(self, a, b, d, input_precision, max_num_imprecise_acc):
        rows = [dot(self, interpreter.TensorHandle(a.data[i:i + 1], a.dtype.scalar), b,
                    interpreter.TensorHandle(d.data[i:i + 1], d.dtype.scalar), input_precision,
                    max_num_imprecise_acc).data for i in range(a.data.shape[0])]
        return interpreter.TensorHandle(np.concatenate(rows), d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = rowwise


def matmul() -> None:
    """Rows alone equal rows in batches of 3 and 70 (two M tiles), at both tile shapes."""
    from decodelab.model.triton import invariant

    gen = torch.Generator().manual_seed(0)
    for n, k in ((80, 96), (4100, 130)):
        w = torch.randn((n, k), generator=gen)
        x = torch.randn((70, k), generator=gen)
        full = invariant.matmul(x, w)
        assert _rel(full, F.linear(x, w)) < RTOL, (n, k)
        for rows in (slice(0, 1), slice(5, 8), slice(60, 70)):
            assert torch.equal(invariant.matmul(x[rows], w), full[rows]), rows


def _cache(gen, blocks: int, hkv: int = 2, bs: int = 16, d: int = 16):
    return (torch.randn((blocks, hkv, bs, d), generator=gen),
            torch.randn((blocks, hkv, bs, d), generator=gen))


def attention() -> None:
    """Rows of contexts 1 to 700 (up to three splits): each alone equals its row in the batch,
    in a wider block table, with any number of lanes, and the reference within fp32
    rounding."""
    from decodelab.model.attention import paged_decode_attention_ref
    from decodelab.model.triton import invariant

    gen = torch.Generator().manual_seed(1)
    k, v = _cache(gen, 240)
    lens = torch.tensor([1, 17, 256, 257, 700], dtype=torch.int32)
    width = 44  # 704 positions of 16
    tables = torch.randperm(240, generator=gen)[:5 * width].view(5, width).int()
    q = torch.randn((5, 4, 16), generator=gen)
    scale = 16 ** -0.5
    full = invariant.decode_attention(q, k, v, tables, lens, scale)
    ref = paged_decode_attention_ref(q, k, v, tables, lens, scale)
    assert _rel(full, ref) < RTOL, _rel(full, ref)
    wider = torch.cat([tables, tables[:, :20]], dim=1)  # 64 columns: more (empty) splits
    assert torch.equal(invariant.decode_attention(q, k, v, wider, lens, scale), full)
    lanes = invariant.split_lanes
    for fixed in (1, 2):  # one program per row and head walks every split, or every other one
        invariant.split_lanes = lambda programs, splits, sms, fixed=fixed: fixed
        try:
            assert torch.equal(invariant.decode_attention(q, k, v, wider, lens, scale), full)
        finally:
            invariant.split_lanes = lanes
    for i in range(5):
        alone = invariant.decode_attention(q[i:i + 1], k, v, tables[i:i + 1], lens[i:i + 1],
                                           scale)
        assert torch.equal(alone, full[i:i + 1]), i


def prefill() -> None:
    """Chunks after cached positions: each token's output equals the decode kernel's for its
    position, bitwise, and the prefill reference within fp32 rounding."""
    from decodelab.model.attention import paged_prefill_attention_ref
    from decodelab.model.triton import invariant

    gen = torch.Generator().manual_seed(2)
    k, v = _cache(gen, 120)
    lens, starts = [5, 1, 40], [0, 300, 17]
    width = 24
    tables = torch.randperm(120, generator=gen)[:3 * width].view(3, width).int()
    qs = torch.tensor([0, 5, 6, 46], dtype=torch.int32)
    st = torch.tensor(starts, dtype=torch.int32)
    q = torch.randn((46, 4, 16), generator=gen)
    scale = 16 ** -0.5
    got = invariant.prefill_attention(q, k, v, tables, qs, st, scale)
    ref = paged_prefill_attention_ref(q, k, v, tables, qs, st, scale)
    assert _rel(got, ref) < RTOL, _rel(got, ref)
    # as a prefill graph runs it: rows and empty chunks past the pack change no bit
    big = invariant.prefill_attention(*padded((q, k, v, tables, qs, st, scale), 66, 7))
    assert torch.equal(big[:46], got)
    lanes, invariant.split_lanes = invariant.split_lanes, lambda programs, splits, sms: 1
    try:  # every split of a token block from one program
        assert torch.equal(invariant.prefill_attention(q, k, v, tables, qs, st, scale), got)
    finally:
        invariant.split_lanes = lanes
    for c, (n, s) in enumerate(zip(lens, starts, strict=True)):
        for j in sorted({0, 1, 31, 32, n // 2, n - 1} & set(range(n))):  # 32: its 2nd program
            t = int(qs[c]) + j
            row = invariant.decode_attention(q[t:t + 1], k, v, tables[c:c + 1],
                                             torch.tensor([s + j + 1], dtype=torch.int32), scale)
            assert torch.equal(row, got[t:t + 1]), (c, j)


def model() -> None:
    """The tiny model on the invariant ops: a prompt's last logits are the same bits from one
    prefill, from chunks, and from a decode step after the prompt less its last token; a
    request's decode logits the same alone and in a batch of three; close to the torch ops."""
    from decodelab.model import compare
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache, slots_at
    from decodelab.model.llama import PagedLlama
    from decodelab.model.triton.ops import InvariantOps
    from decodelab.model.weights import from_state_dict, random_state_dict

    config = named_config("tiny")
    weights = from_state_dict(config, random_state_dict(config, seed=1))
    cache = PagedKVCache(config, 96, 16)
    ref = PagedLlama(config, weights, cache, backend="torch")
    model = PagedLlama(config, weights, cache, backend="torch")
    model.ops = InvariantOps(pdl=False)
    pool = cache.pool
    prompts = compare.prompts(config, 3)
    tables = [pool.allocate(pool.blocks_needed(len(p) + 2)) for p in prompts]
    try:
        whole = model.prefill(prompts, tables)
        assert _rel(whole, ref.prefill(prompts, tables)) < 1e-4
        p, t = prompts[0], tables[:1]
        cut = len(p) // 2
        model.prefill([p[:cut]], t)
        assert torch.equal(model.prefill([p[cut:]], t, [cut])[0], whole[0])  # chunked
        model.prefill([p[:-1]], t)
        bt = cache.block_table_tensor(t)
        pos = torch.tensor([len(p) - 1])
        step = model.decode(torch.tensor([p[-1]]), pos, slots_at(bt, pos, 16), bt,
                            (pos + 1).int())
        assert torch.equal(step[0], whole[0])  # decode of the last token = prefill's
        # the next token, alone and beside two other requests at other positions
        model.prefill(prompts, tables)
        bt = cache.block_table_tensor(tables)
        pos = torch.tensor([len(q) for q in prompts])
        nxt = whole.argmax(-1)
        batched = model.decode(nxt, pos, slots_at(bt, pos, 16), bt, (pos + 1).int())
        alone = model.decode(nxt[:1], pos[:1], slots_at(bt[:1], pos[:1], 16), bt[:1],
                             (pos[:1] + 1).int())
        assert torch.equal(alone[0], batched[0])
    finally:
        for table in tables:
            pool.free(table)


def tiles() -> None:
    """The tile sweep's rows (``batch_invariance_tiles``) on a narrow and a wide weight: every
    candidate the same bits as rows alone, the rule's tile marked at each row count, a time
    for each timed (tile, rows) beside the stand-in cuBLAS time. Here numpy sums a K chunk's
    products, so only tiles of the rule's K chunk give the same bits (on the GPU every chunk
    chains the same 16-wide products, which the table shows): the grid keeps that chunk."""
    from decodelab.engine.bench import invariance_tiles as it
    from decodelab.model.triton import invariant

    gen = torch.Generator().manual_seed(2)
    for n, k, chunk in ((80, 96, 128), (4100, 130, 64)):
        cfg = it.TileSweepConfig(rows=(3, 70), block_m=(16, 64), block_n=(16, 64, 128),
                                 block_k=(chunk,), checked_rows=5)
        w = torch.randn((n, k), generator=gen) / k ** 0.5
        rows = it.sweep_weight("w", w, cfg, lambda fn: (fn(), 2.0)[1])
        assert rows and all(r.same_bits for r in rows), [r for r in rows if not r.same_bits]
        assert {r.block_k for r in rows} == {chunk}
        assert {r.block_n for r in rows} == ({16, 32, 64, 128} if n < 4096 else {64, 128})
        for count in cfg.rows:
            picked = [r for r in rows if r.rows == count and r.picked]
            assert len(picked) == 1, (n, count, picked)
            r = picked[0]
            assert invariant.matmul_tile(count, n, k) == (r.block_m, r.block_n, r.block_k,
                                                          r.warps)
        assert {r.x_cublas for r in rows} == {1.0}
        assert all(it.timed_at(r.block_m, r.rows) for r in rows)


CHECKS = {"matmul": matmul, "attention": attention, "prefill": prefill, "model": model,
          "tiles": tiles}

if __name__ == "__main__":
    _scalar_loop_bounds()
    _bool_comparisons()
    _rowwise_dot()
    for name in sys.argv[1:]:
        CHECKS[name]()
        print(f"{name}: ok")
