"""The model's Triton kernels and the fused sampler's run in Triton's CPU interpreter against
the torch ops and the sampling rule (fp32), so their logic is tested on every machine that has
Triton, not only on a GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (it is on Linux x86-64)")
HERE = Path(__file__).parent


def _run(*checks: str, script: str = "triton_interp_checks.py", timeout: int = 600) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "lib"),
                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / script), *checks],
                          capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the checks' own lines (a bench run inside a check prints its progress lines too)
    return "".join(line for line in proc.stdout.splitlines(True)
                   if not line.startswith("[bench]"))


def test_matmul_kernels_equal_torch():
    out = _run("gemv", "add_norm_gemv", "skinny", "fp32_logits")
    assert out.splitlines() == ["gemv: ok", "add_norm_gemv: ok", "skinny: ok", "fp32_logits: ok"]


def test_rotary_and_cache_write_equal_torch():
    assert _run("rope_write").strip() == "rope_write: ok"


def test_paged_attention_equals_reference_and_ignores_the_table_width():
    """Mixed contexts (1 to 1,500) at batches that split 8, 2 and 1 ways, splits capped at 64
    positions too: the reference within fp32 rounding; a wider block table, the same bits."""
    assert _run("attention").strip() == "attention: ok"


@pytest.mark.slow
def test_decode_step_on_triton_ops_equals_torch_ops():
    assert _run("model").strip() == "model: ok"


def test_fused_sampler_follows_the_rule_for_every_row_kind():
    """Every row kind (greedy, plain temperature, min-p alone, top-p alone on flat rows whose
    nucleus holds thousands of tokens, top-k up to 5000 with and without top-p) on peaked,
    flat and bf16 rows: thresholds and tokens the rule's within float32 rounding, every row on
    the candidates; tie groups at each boundary and at the reach of each sort size, with the
    kept masses from the candidates and from a pass; each row alone equal to its row in a
    mixed batch; non-finite and masked rows; the step's tables; the threshold kernels a batch
    of plain and min-p rows does not need, left out, change nothing."""
    checks = ("kinds", "ties", "tiers", "invariance", "edges", "step", "unneeded")
    out = _run(*checks, script="sampler_interp_checks.py", timeout=1800)
    assert out.splitlines() == [f"{c}: ok" for c in checks]


@pytest.mark.slow
def test_fused_sampler_penalties_exact_passes_and_gpu_sizes():
    """Penalised rows of every kind; rows whose candidates pass a scaled-down buffer take the
    exact row passes and still follow the rule; the issue-24 mix at V = 128256 in bf16 with
    the GPU's program sizes, every row on the candidates; the sampler grid's fused rows."""
    checks = ("penalties", "fallback", "full_size", "grid")
    out = _run(*checks, script="sampler_interp_checks.py", timeout=3000)
    assert out.splitlines() == [f"{c}: ok" for c in checks]


def test_batch_invariant_kernels_give_a_row_the_same_bits_in_any_batch():
    """The batch-invariant matmul (one and 70 rows, SwiGLU), decode attention (contexts over
    up to three fixed splits, a wider block table) and prefill through the decode kernel: a
    row alone = its row in a batch, bitwise; the references within fp32 rounding. The tile
    sweep's rows (``batch_invariance_tiles``) on a narrow and a wide weight."""
    checks = ("matmul", "attention", "prefill", "tiles")
    out = _run(*checks, script="invariant_interp_checks.py")
    assert out.splitlines() == [f"{c}: ok" for c in checks]


@pytest.mark.slow
def test_batch_invariant_model_prefill_equals_decode_bitwise():
    """The tiny model on the invariant ops: a prompt's last logits the same bits from one
    prefill, from two chunks and from a decode step; a request's decode logits the same
    alone and beside two others at other positions."""
    assert _run("model", script="invariant_interp_checks.py").strip() == "model: ok"
