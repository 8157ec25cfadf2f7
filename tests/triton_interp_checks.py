"""Checks of the model's Triton kernels in Triton's CPU interpreter, run by
test_triton_interpreter.py in a child process with TRITON_INTERPRET=1 (the variable must be set
before the kernels are defined). fp32, and float16 in ``float16`` (the dtype a T4 runs): the
interpreter's bf16 dot is not faithful.
Decode attention runs here with fp32 caches (bf16 and the tensor cores: test_paged_model_gpu.py).

    python tests/triton_interp_checks.py CHECK [CHECK ...]
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F
import triton.language as tl

from decodelab.model.llama import TorchOps

RTOL = 1e-5  # fp32 on both sides: summation order only


def _scalar_loop_bounds() -> None:
    """Triton 3.6's interpreter hands a kernel's scalar arguments over as 1-element arrays and
    converts them with ``int()``, which NumPy 2 refuses for a loop bound (``range(.., K, ..)``).
    Take the single element instead."""
    import numpy as np
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def with_scalar_index(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = with_scalar_index


def _bool_comparisons() -> None:
    """Triton 3.6's interpreter labels a comparison's result with its operands' type, so a
    scalar comparison of floats broadcast against a vector (``mask & (x > 0.0)``) becomes a
    float32 vector that ``&`` refuses. Label comparisons int1, as the compiler does."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder

    def labelled(op):
        def compare(self, lhs, rhs):
            return interpreter.TensorHandle(np.asarray(op(self, lhs, rhs).data, dtype=bool),
                                            tl.int1)
        return compare

    for name in [n for n in dir(builder) if n.startswith(("create_fcmp", "create_icmp"))]:
        setattr(builder, name, labelled(getattr(builder, name)))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def gemv() -> None:
    from decodelab.model.triton.linear import gemv as run
    from decodelab.model.triton.matmul_choice import cublas

    gen = torch.Generator().manual_seed(0)
    for n, k, tile, swiglu in ((48, 64, (8, 32, 4), False), (33, 100, (4, 64, 4), False),
                               (16, 64, (2, 64, 4), True), (20, 96, (8, 128, 4), True)):
        w = torch.randn((n, k), generator=gen)
        x = torch.randn((1, k * (2 if swiglu else 1)), generator=gen)
        assert _rel(run(x, w, tile, swiglu=swiglu), cublas(x, w, swiglu)) < RTOL, (n, k, tile)


def add_norm_gemv() -> None:
    from decodelab.model.triton.linear import add_norm_gemv as run

    gen = torch.Generator().manual_seed(1)
    for n, k, tile, add in ((48, 64, (8, 32, 4), True), (33, 100, (4, 64, 4), True),
                            (16, 64, (2, 64, 4), False)):
        w, h = torch.randn((n, k), generator=gen), torch.randn((1, k), generator=gen)
        res, nw = torch.randn((1, k), generator=gen), torch.randn(k, generator=gen)
        before = h.clone()
        h_new, y = run(h, res if add else None, nw, 1e-5, w, tile)
        if add:
            want_h, normed = TorchOps.add_rms_norm(before, res, nw, 1e-5)
        else:
            want_h, normed = before, TorchOps.rms_norm(before, nw, 1e-5)
        assert torch.equal(h, before), "the input residual must stay as it was"
        assert _rel(h_new, want_h) < RTOL and _rel(y, F.linear(normed, w)) < RTOL, (n, k, add)


def skinny() -> None:
    from decodelab.model.triton.matmul_choice import cublas
    from decodelab.model.triton.skinny import TILES
    from decodelab.model.triton.skinny import skinny as run

    gen = torch.Generator().manual_seed(2)
    for m, n, k, swiglu in ((2, 48, 64, False), (5, 33, 100, False), (8, 40, 64, True),
                            (17, 70, 300, False)):
        w = torch.randn((n, k), generator=gen)
        x = torch.randn((m, k * (2 if swiglu else 1)), generator=gen)
        for tile in TILES[:2]:
            got = run(x, w, tile, swiglu=swiglu)
            assert _rel(got, cublas(x, w, swiglu)) < RTOL, (m, n, k, swiglu, tile)


def model() -> None:
    """The whole decode step on TritonOps (norms, rotary + cache write, gemv with the fused
    norm at one row, skinny matmuls at three) against the torch ops, teacher-forced."""
    from decodelab.model import compare
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama, greedy_generate
    from decodelab.model.triton.ops import TritonOps
    from decodelab.model.weights import from_state_dict, random_state_dict

    config = named_config("tiny")
    weights = from_state_dict(config, random_state_dict(config, seed=1))
    cache = PagedKVCache(config, 96, 16)
    ref = PagedLlama(config, weights, cache, backend="torch")
    fast = PagedLlama(config, weights, cache, backend="torch")
    gemv_tiles, skinny_tiles = ((8, 32, 4), (4, 64, 4)), ((16, 256, 4, 4), (32, 128, 4, 4))
    shapes = [(w, False) for lw in weights.layers for w in (lw.qkv, lw.o, lw.gate_up)]
    shapes += [(lw.down, True) for lw in weights.layers] + [(weights.lm_head, False)]
    choice = {(*w.shape, swiglu, rows): tiles[i % 2]  # two tiles per kind, alternating
              for rows, tiles in ((1, gemv_tiles), (3, skinny_tiles))
              for i, (w, swiglu) in enumerate(shapes)}
    fast.ops = TritonOps(pdl=False, linear_choice=choice)  # timing needs a GPU: given choice
    fast.ops.decode_attention = TorchOps.decode_attention
    for n in (1, 3):
        prompts = compare.prompts(config, n)
        tokens, want = greedy_generate(ref, prompts, 5)
        _, got = greedy_generate(fast, prompts, 5, forced=tokens)
        assert _rel(got, want) < RTOL, (n, _rel(got, want))


def attention() -> None:
    """Paged decode attention over a shuffled block table, contexts of 1 to 1,500 in one batch
    at batch 1, 5 and 40 (8, 2 and 1 splits on the interpreter's 8 SMs), with the plan's launch
    (splits capped at the default; batch 40 fills the GPU: each row whole) and with every split
    capped at 64 positions (more splits than the merge reads at once): the reference
    within fp32 rounding, and the same bits in a wider block table (a graph's) and with the
    rows taken longest first or in a random order. The model's sort of the rows
    (``row_rank.longest_first``) equal to torch's stable one."""
    from decodelab.model.attention import paged_decode_attention_ref
    from decodelab.model.triton.attention import paged_decode_attention
    from decodelab.model.triton.attention_plan import LaunchConfig
    from decodelab.model.triton.row_rank import longest_first

    gen = torch.Generator().manual_seed(2)
    hkv, group, d, bs, width = 2, 4, 16, 16, 96
    blocks = 40 * width
    k = torch.randn((blocks, hkv, bs, d), generator=gen)
    v = torch.randn((blocks, hkv, bs, d), generator=gen)
    for batch in (1, 5, 40):
        lens = torch.tensor([(1, 1500, 17, 300, 64, 1000, 129)[i % 7] for i in range(batch)],
                            dtype=torch.int32)
        tables = torch.randperm(blocks, generator=gen)[:batch * width].view(batch, width).int()
        wider = torch.cat([tables, tables[:, :32]], dim=1)
        q = torch.randn((batch, hkv * group, d), generator=gen)
        ref = paged_decode_attention_ref(q, k, v, tables, lens, d ** -0.5)
        for launch in (None, LaunchConfig(tile=16, stages=2, warps=1, max_chunk=64)):
            got = paged_decode_attention(q, k, v, tables, lens, d ** -0.5, launch)
            assert _rel(got, ref) < RTOL, (batch, launch, _rel(got, ref))
            assert torch.equal(paged_decode_attention(q, k, v, wider, lens, d ** -0.5, launch),
                               got), (batch, launch)
            for order in (torch.argsort(lens, descending=True).int(),
                          torch.randperm(batch, generator=gen).int()):
                assert torch.equal(paged_decode_attention(q, k, v, tables, lens, d ** -0.5,
                                                          launch, row_order=order), got)
    try:  # an order that is not one int32 per row is refused before any launch
        paged_decode_attention(q, k, v, tables, lens, d ** -0.5, row_order=lens.long())
        raise AssertionError("a 64-bit row_order was taken")
    except ValueError as exc:
        assert "row_order must be (40,) int32" in str(exc), exc
    # the model's order, one launch: the stable descending argsort, ties (many) included
    for n in (1, 40, 300, 600):  # 600: past the kernel's rows, the argsort
        lens = torch.randint(1, 9, (n,), generator=gen, dtype=torch.int32)
        want = torch.argsort(lens, descending=True, stable=True).int()
        assert torch.equal(longest_first(lens), want), n


def float16() -> None:
    """The kernels a T4 runs (``core.precision``: float16 below sm_80) on float16 inputs against
    the float32 reference on the same (rounded) inputs: within float16 rounding. The norm, the
    SwiGLU product, the gemv (with and without the fused norm) and the skinny matmul."""
    from decodelab.model.triton.fused import rms_norm_rows, silu_mul
    from decodelab.model.triton.linear import add_norm_gemv as norm_gemv
    from decodelab.model.triton.linear import gemv as run_gemv
    from decodelab.model.triton.matmul_choice import cublas
    from decodelab.model.triton.skinny import TILES
    from decodelab.model.triton.skinny import skinny as run_skinny

    gen = torch.Generator().manual_seed(3)

    def draw(*shape):  # float16 values; the reference reads them in float32
        return torch.randn(shape, generator=gen).half()

    h, x, nw = draw(3, 96), draw(3, 96), 1 + 0.1 * draw(96)
    want_h, normed = TorchOps.add_rms_norm(h.float(), x.float(), nw.float(), 1e-5)
    got = rms_norm_rows(h.clone(), x, nw, 1e-5)
    assert got.dtype == torch.float16 and _rel(got.float(), normed) < F16_RTOL
    gu = draw(3, 2 * 80)
    assert _rel(silu_mul(gu).float(), TorchOps.silu_mul(gu.float())) < F16_RTOL
    for n, k, tile, swiglu in ((48, 64, (8, 32, 4), False), (33, 100, (4, 64, 4), True)):
        w, v = draw(n, k) / k ** 0.5, draw(1, k * (2 if swiglu else 1))
        assert _rel(run_gemv(v, w, tile, swiglu=swiglu).float(),
                    cublas(v.float(), w.float(), swiglu)) < F16_RTOL, (n, k, tile)
    w, h1, res, nw = draw(40, 64) / 8, draw(1, 64), draw(1, 64), 1 + 0.1 * draw(64)
    h_new, y = norm_gemv(h1, res, nw, 1e-5, w, (8, 32, 4))
    want_h, normed = TorchOps.add_rms_norm(h1.float(), res.float(), nw.float(), 1e-5)
    assert _rel(h_new.float(), want_h) < F16_RTOL
    assert _rel(y.float(), F.linear(normed, w.float())) < F16_RTOL
    for m, n, k, swiglu in ((2, 48, 64, False), (17, 70, 300, True)):
        w, v = draw(n, k) / k ** 0.5, draw(m, k * (2 if swiglu else 1))
        got = run_skinny(v, w, TILES[0], swiglu=swiglu)
        assert got.dtype == torch.float16
        assert _rel(got.float(), cublas(v.float(), w.float(), swiglu)) < F16_RTOL, (m, n, k)


def rope_write() -> None:
    """The fused rotary + cache write (one program per token, all its heads) against the torch
    ops: q rotated, k rotated and v stored at each token's slot, and a padding row (slot -1)
    writing nothing anywhere; at a head count that is not a power of two (tiny: 8 + 2)."""
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama
    from decodelab.model.triton.fused import rope_write as run
    from decodelab.model.weights import from_state_dict, random_state_dict

    config = named_config("tiny")
    h, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    assert (h + hkv) & (h + hkv - 1), "the check wants a padded head tile"
    model = PagedLlama(config, from_state_dict(config, random_state_dict(config, seed=2)),
                       PagedKVCache(config, 8, 4), backend="torch")
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn((5, (h + 2 * hkv) * d), generator=gen)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(5, h, d), k.view(5, hkv, d), v.view(5, hkv, d)
    positions = torch.tensor([0, 3, 9, 17, 2])
    slots = torch.tensor([1, 6, -1, 13, 20])
    want_cache, got_cache = PagedKVCache(config, 8, 4), PagedKVCache(config, 8, 4)
    want_q = TorchOps.rope_write(q, k, v, positions, model.cos, model.sin, want_cache, 1, slots)
    got_q = run(q, k, v, positions, model.cos, model.sin, got_cache, 1, slots)
    assert _rel(got_q, want_q) < RTOL
    scratch = want_cache.scratch_block  # the torch path parks a padding row's k/v there
    for got, want in ((got_cache.k, want_cache.k), (got_cache.v, want_cache.v)):
        want[:, scratch] = 0
        assert torch.allclose(got, want, rtol=RTOL, atol=1e-6)
        assert got.count_nonzero() == 4 * hkv * d, "only the four real rows are stored"


def fp32_logits() -> None:
    """The LM head's kernels (``ops.logits``) on float16 inputs writing float32: the fp32 sum
    of the products unrounded, far inside float16's rounding (2^-11 relative), at one row
    (gemv), a few (skinny) and any count (the batch-invariant tiles, whose rows keep their
    bits in any batch)."""
    from decodelab.model.triton import invariant
    from decodelab.model.triton.linear import gemv as run_gemv
    from decodelab.model.triton.skinny import TILES
    from decodelab.model.triton.skinny import skinny as run_skinny

    gen = torch.Generator().manual_seed(4)
    w = (torch.randn((70, 300), generator=gen) / 300 ** 0.5).half()
    x = torch.randn((17, 300), generator=gen).half()
    want = F.linear(x.double(), w.double())
    got = {"gemv": run_gemv(x[:1], w, (8, 128, 4), out_dtype=torch.float32),
           "skinny": run_skinny(x, w, TILES[0], out_dtype=torch.float32),
           "invariant": invariant.matmul(x, w, out_dtype=torch.float32)}
    for name, y in got.items():
        assert y.dtype == torch.float32, name
        assert _rel(y.double(), want[:y.shape[0]]) < FP32_SUM_RTOL, (name, _rel(y.double(), want))
    assert torch.equal(invariant.matmul(x[3:5], w, out_dtype=torch.float32), got["invariant"][3:5])


# The fp32 accumulator's own rounding over a few hundred products (far below float16's)
FP32_SUM_RTOL = 1e-5
# float16 keeps 11 significant bits (2^-11 ~ 4.9e-4 relative): the output's rounding, and the
# intermediate roundings to the model dtype that the kernels make as the torch ops do
F16_RTOL = 2e-3
CHECKS = {"gemv": gemv, "add_norm_gemv": add_norm_gemv, "skinny": skinny, "model": model,
          "attention": attention, "float16": float16, "fp32_logits": fp32_logits,
          "rope_write": rope_write}

if __name__ == "__main__":
    _scalar_loop_bounds()
    _bool_comparisons()
    for name in sys.argv[1:]:
        CHECKS[name]()
        print(f"{name}: ok")
