"""Packs of prefill chunks over a paged pool of shuffled blocks, shared by the CPU tests, the
interpreter checks and the GPU tests of varlen paged prefill attention."""

from __future__ import annotations

import torch


def paged_case(gen: torch.Generator, lens, starts, hkv: int, group: int, d: int = 16,
               bs: int = 4, dtype=torch.float32):
    """Random K/V pools of blocks in random order holding every sequence's positions 0 ..
    start + len - 1, and q for the chunks, packed: the arguments of
    ``paged_prefill_attention_ref`` (q, k_pool, v_pool, block_tables, query_starts, starts,
    scale), on ``gen``'s device. Block tables are padded with a block no sequence owns."""
    dev = gen.device
    need = [-(-(s + n) // bs) for s, n in zip(starts, lens, strict=True)]
    total = sum(need) + 3
    order = torch.randperm(total, generator=gen, device=dev).tolist()
    tables = []
    for m in need:
        blocks, order = order[:m], order[m:]
        tables.append(blocks + [order[-1]] * (max(need) - m))
    k_pool, v_pool = (torch.randn((total, hkv, bs, d), generator=gen, device=dev).to(dtype)
                      for _ in range(2))
    q = torch.randn((sum(lens), hkv * group, d), generator=gen, device=dev).to(dtype)
    bounds = [0, *torch.tensor(lens).cumsum(0).tolist()]

    def i32(x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=dev)

    return q, k_pool, v_pool, i32(tables), i32(bounds), i32(starts), d ** -0.5


def dense_kv(k_pool: torch.Tensor, table: torch.Tensor, ctx: int) -> torch.Tensor:
    """(Hkv, ctx, D): a sequence's first ctx positions gathered from the pool in order."""
    hkv, bs, d = k_pool.shape[1:]
    m = -(-ctx // bs)
    return k_pool[table[:m].long()].transpose(0, 1).reshape(hkv, m * bs, d)[:, :ctx]


def padded(case, rows: int, chunks: int):
    """``case`` (``paged_case``'s arguments) as a CUDA graph of ``rows`` query rows and
    ``chunks`` chunks replays it: q padded with random rows past the pack, empty chunks after
    its own (query starts repeat its end, start 0, a table of block 0)."""
    q, k_pool, v_pool, tables, bounds, starts, scale = case
    t, n = q.shape[0], starts.shape[0]
    extra = torch.randn((rows - t, *q.shape[1:]), device=q.device).to(q.dtype)
    pad = chunks - n
    return (torch.cat([q, extra]), k_pool, v_pool,
            torch.cat([tables, tables.new_zeros((pad, tables.shape[1]))]),
            torch.cat([bounds, bounds[-1:].repeat(pad)]), torch.cat([starts, starts.new_zeros(pad)]),
            scale)
