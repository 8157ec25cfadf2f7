"""The model's Triton kernels run in Triton's CPU interpreter against the torch ops (fp32), so
their logic is tested on every machine that has Triton, not only on a GPU."""

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


def _run(*checks: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "lib"),
                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "triton_interp_checks.py"), *checks],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_matmul_kernels_equal_torch():
    out = _run("gemv", "add_norm_gemv", "skinny")
    assert out.splitlines() == ["gemv: ok", "add_norm_gemv: ok", "skinny: ok"]


@pytest.mark.slow
def test_decode_step_on_triton_ops_equals_torch_ops():
    assert _run("model").strip() == "model: ok"
