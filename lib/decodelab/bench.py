"""The registry of phase benchmarks behind ``python -m decodelab bench PHASE``.

Each phase module exposes ``bench(profile: str, out_dir: Path) -> list[Path]`` that measures,
validates before timing, and writes its result tables (with metadata) under ``out_dir``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Order matters for ``bench all``: the environment's ceilings first.
PHASES: dict[str, str] = {
    "env": "decodelab.env.bench",
    "dispatch": "decodelab.dispatch.bench",
    "replay": "decodelab.replay.bench",
    "persistent": "decodelab.persistent.bench",
    "paged_model": "decodelab.model.bench",
    "runtime": "decodelab.engine.bench",
    "serve": "decodelab.engine.bench.serve",
    "tiles": "decodelab.engine.bench.invariance_tiles",
    "tp": "decodelab.parallel.bench",
}
# Phases that need one process per GPU (``make bench-gpu-tp`` starts them under torchrun);
# ``bench all`` leaves them out.
TORCHRUN_PHASES = ("tp",)
# Phases that run the model in a dtype of ``core.precision``'s choice (``bench(..., dtype=)``);
# the others measure the toy step and the calibrations in their own dtypes.
DTYPE_PHASES = ("paged_model", "runtime", "serve", "tiles", "tp")


def run_phase(phase: str, profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``dtype`` other than ``auto`` is refused for a phase outside ``DTYPE_PHASES``."""
    from decodelab.core.validate import ConfigError

    module = importlib.import_module(PHASES[phase])
    if phase in DTYPE_PHASES:
        return module.bench(profile, out_dir, dtype=dtype)
    if dtype != "auto":
        raise ConfigError(f"dtype {dtype!r}: phase {phase} has no model dtype; it applies to "
                          f"{', '.join(DTYPE_PHASES)}")
    return module.bench(profile, out_dir)


def run_all(phases: list[str], profile: str, out_dir: Path, *, isolate: bool = True,
            dtype: str = "auto") -> int:
    """Run each phase; a failing phase is reported and the rest still run. Returns exit code.

    With ``isolate`` (the default for more than one phase) every phase runs in a fresh Python
    process: a profiler attached by one phase (CUPTI stays attached and slows later launches),
    compiled-graph caches or a fragmented allocator must not change the next phase's numbers.
    """
    from decodelab.core.device import has_cuda

    failed, skipped, refused = [], [], []
    isolate = isolate and len(phases) > 1
    for phase in phases:
        t0 = time.perf_counter()
        print(f"[bench] {phase}: starting (profile={profile}, out={out_dir})", flush=True)
        if isolate:
            cmd = [sys.executable, "-m", "decodelab", "bench", phase, "--profile", profile,
                   "--out", str(out_dir), "--quiet"]
            if phase in DTYPE_PHASES:
                cmd += ["--dtype", dtype]
            code = subprocess.run(cmd, check=False).returncode
        else:
            code = _run_in_process(phase, profile, out_dir, dtype if phase in DTYPE_PHASES
                                   else "auto")
        if code == 2 and len(phases) > 1 and not has_cuda():  # GPU-only phase in `bench all`
            skipped.append(phase)
            state = "skipped (needs a CUDA GPU)"
        elif code == 2:  # the one phase asked for refused its input: say so, exit 2
            refused.append(phase)
            state = "refused"
        elif code != 0:
            failed.append(phase)
            state = "FAILED"
        else:
            state = "done"
        print(f"[bench] {phase}: {state} in {time.perf_counter() - t0:.1f} s", flush=True)
    if skipped:
        print(f"[bench] skipped phases: {', '.join(skipped)}")
    if failed:
        print(f"[bench] failed phases: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 2 if refused else 0


def _run_in_process(phase: str, profile: str, out_dir: Path, dtype: str = "auto") -> int:
    """0 on success, 2 when the phase refused its input (ConfigError), 1 on any other error."""
    from decodelab.core.validate import ConfigError

    try:
        written = run_phase(phase, profile, out_dir, dtype)
    except ConfigError as exc:
        print(f"[bench] {phase}: refused: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception:  # noqa: BLE001 - one broken phase must not lose the others' results
        traceback.print_exc()
        return 1
    for path in written:
        print(f"[bench] {phase}: wrote {path}", flush=True)
    return 0


def run_phase_quietly(phase: str, profile: str, out_dir: Path, dtype: str = "auto") -> int:
    """One phase in this process, exit code as :func:`_run_in_process` (a child of run_all)."""
    return _run_in_process(phase, profile, out_dir, dtype)
