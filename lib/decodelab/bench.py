"""The registry of phase benchmarks behind ``python -m decodelab bench PHASE``.

Each phase module exposes ``bench(profile: str, out_dir: Path) -> list[Path]`` that measures,
validates before timing, and writes its result tables (with metadata) under ``out_dir``.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

# Order matters for ``bench all``: the environment's ceilings first.
PHASES: dict[str, str] = {
    "env": "decodelab.device",
    "dispatch": "decodelab.dispatch",
    "replay": "decodelab.replay",
    "persistent": "decodelab.persistent",
    "paged_model": "decodelab.runtime.bench_model",
    "runtime": "decodelab.runtime.bench_engine",
}


def run_phase(phase: str, profile: str, out_dir: Path) -> list[Path]:
    module = importlib.import_module(PHASES[phase])
    return module.bench(profile, out_dir)


def run_all(phases: list[str], profile: str, out_dir: Path) -> int:
    """Run each phase; a failing phase is reported and the rest still run. Returns exit code."""
    failed = []
    for phase in phases:
        t0 = time.perf_counter()
        print(f"[bench] {phase}: starting (profile={profile}, out={out_dir})", flush=True)
        try:
            written = run_phase(phase, profile, out_dir)
        except Exception:  # noqa: BLE001 - one broken phase must not lose the others' results
            traceback.print_exc()
            failed.append(phase)
            print(f"[bench] {phase}: FAILED after {time.perf_counter() - t0:.1f} s", flush=True)
            continue
        for path in written:
            print(f"[bench] {phase}: wrote {path}", flush=True)
        print(f"[bench] {phase}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    if failed:
        print(f"[bench] failed phases: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
