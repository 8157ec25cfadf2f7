"""Every Triton kernel launch the paged model and the fused sampler make compiles ahead of
time, on the CPU, for sm_75 (T4), sm_80 (A100), sm_89 (L4) and sm_90 (H100, H200), with the
dtype ``core.precision`` picks there, and fits that GPU's shared memory.

The launches are recorded as the code makes them (``triton_launches``: the model's decode
and prefill steps at the benches' shapes, every matmul tile candidate, the tensor-parallel
shards, the sampler in every mode), then compiled to cubins with the ptxas that the Triton
wheel carries, in a process pool, once per test session (the Triton cache in a temporary
folder). A launch that does not compile fails here; so does one that needs more shared memory
than the GPU gives a block, except the matmul tile candidates, which ``matmul_choice`` skips
on that GPU (it catches ``OutOfResources``). Programmatic dependent launch is compiled where
the code uses it (sm_90) and refused below, with a message, where ptxas would fail.
The other dtypes a run may ask for (float16 from sm_80, float32) compile in the slow test.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (it is on Linux x86-64)")
import triton_launches as tl  # noqa: E402 - needs Triton
from triton import knobs  # noqa: E402

pytestmark = pytest.mark.skipif(bool(knobs.runtime.interpret),
                                reason="TRITON_INTERPRET is set: the kernels are interpreted")
LIB = Path(__file__).resolve().parents[1] / "lib" / "decodelab"
# The tile candidates: a tile that needs more shared memory than the GPU has is not timed
# (matmul_choice catches Triton's OutOfResources), so cuBLAS or another tile runs.
TILE_KERNELS = {"_gemv_kernel", "_skinny_kernel"}


@pytest.fixture(scope="session")
def triton_cache(tmp_path_factory):
    """A Triton cache for this session only (the workers inherit the variable)."""
    before = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    yield
    if before is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = before


def compile_all(jobs: list[tuple[tl.Launch, tl.Target]]) -> list[tl.Compiled]:
    """Compile in a pool of one process per CPU (spawned: a forked torch is not safe)."""
    if not jobs:
        return []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=ctx) as pool:
        return list(pool.map(tl.compile_launch, *zip(*jobs, strict=True), chunksize=2))


def launches(target: tl.Target, dtype: str) -> list[tl.Launch]:
    found = (tl.model_launches(target, dtype) | tl.sampler_launches(target)
             | tl.calibration_launches(target))
    return sorted(found, key=tl.Launch.label)


@pytest.fixture(scope="session")
def recorded() -> dict[str, list[tl.Launch]]:
    """Every target's launches at its ``auto`` dtype."""
    return {t.name: launches(t, t.auto_dtype) for t in tl.TARGETS}


@pytest.fixture(scope="session")
def compiled(triton_cache, recorded) -> dict[str, list[tl.Compiled]]:
    """``recorded``, compiled once (one pool for every target)."""
    jobs = [(launch, t) for t in tl.TARGETS for launch in recorded[t.name]]
    results: dict[str, list[tl.Compiled]] = {t.name: [] for t in tl.TARGETS}
    for r in compile_all(jobs):
        results[r.target].append(r)
    return results


def check(results: list[tl.Compiled], target: tl.Target) -> None:
    failed = [f"{r.launch.label()}\n{r.error}" for r in results if r.error]
    too_big = [f"{r.launch.label()}: {r.shared} bytes" for r in results
               if r.shared > target.max_shared and r.launch.kernel not in TILE_KERNELS]
    problems = [f"{len(failed)} of {len(results)} launch(es) do not compile for {target.name} "
                f"({', '.join(sorted({r.launch.kernel for r in results if r.error}))})"] \
        if failed else []
    if too_big:
        problems.append(f"{len(too_big)} need more shared memory than a {target.gpu} block has "
                        f"({target.max_shared} bytes): " + "; ".join(too_big))
    assert not problems, "\n".join(problems + failed[:3])


@pytest.mark.parametrize("target", tl.TARGETS, ids=lambda t: t.name)
def test_every_launch_compiles_for_the_target(compiled, target):
    results = compiled[target.name]
    check(results, target)
    kernels = {r.launch.kernel for r in results}
    assert {"_attn_split_kernel", "_gemv_kernel", "_skinny_kernel", "_rope_write_kernel"} <= kernels
    spills = sorted({r.launch.kernel for r in results if r.stack})
    print(f"{target.name} ({target.gpu}, {target.auto_dtype}): {len(results)} launches of "
          f"{len(kernels)} kernels compile; max {max(r.registers for r in results)} registers, "
          f"stack (spills) in {', '.join(spills) or 'none'}")


def test_every_tile_candidate_that_does_not_fit_leaves_another_choice(compiled):
    """A tile over the shared-memory limit is not a candidate; cuBLAS always is, and on every
    target some Triton tile of each kind fits."""
    for target in tl.TARGETS:
        fitting = {r.launch.kernel for r in compiled[target.name]
                   if r.launch.kernel in TILE_KERNELS and r.shared <= target.max_shared}
        assert fitting == TILE_KERNELS, target.name


def _launch_sites() -> set[str]:
    """Names of the Triton kernels launched (``name[grid](``) anywhere in the library."""
    from triton.runtime.jit import JITFunction

    names = set()
    for path in LIB.rglob("*.py"):
        text = path.read_text()
        if "triton" not in text:
            continue
        module = ".".join(path.relative_to(LIB.parent).with_suffix("").parts)
        mod = importlib.import_module(module)
        for name in re.findall(r"\b(\w+)\[[^\]\n]*\]\(", text):
            if isinstance(getattr(mod, name, None), JITFunction):
                names.add(name)
    return names


def test_the_recorder_reaches_every_launch_site(recorded):
    """A kernel launched somewhere in the library but never by the recorded steps (a new
    kernel, or one behind a path the recorder does not take) fails here."""
    kernels = {launch.kernel for found in recorded.values() for launch in found}
    missing = _launch_sites() - kernels
    assert not missing, f"launched in lib/ but not recorded (extend triton_launches): {missing}"


@pytest.mark.parametrize("target", [t for t in tl.TARGETS if t.capability < (9, 0)],
                         ids=lambda t: t.name)
def test_pdl_is_refused_below_sm90(target, triton_cache):
    """ptxas rejects PDL's griddepcontrol below sm_90; the model refuses it there first."""
    from decodelab.core.validate import ConfigError
    from decodelab.model.llama import _ops
    from decodelab.model.triton.fused import silu_mul

    with tl.emulated(target):
        assert _ops("triton", torch.device("cuda"), None, {}).pdl is False
        with pytest.raises(ConfigError, match=f"needs sm_90 or newer; cuda is {target.name}"):
            _ops("triton", torch.device("cuda"), True, {})
        with tl.recording() as found:
            silu_mul(torch.empty(2, 128, dtype=torch.float16), pdl=True)
    (forced,) = found
    assert "ptxas" in (tl.compile_launch(forced, target).error or "")


@pytest.mark.slow
@pytest.mark.parametrize("target", tl.TARGETS, ids=lambda t: t.name)
def test_the_other_dtypes_compile(target, triton_cache):
    """The dtypes a run may ask for by name (``core.precision.allowed_dtypes``) beyond
    ``auto``'s pick: float16 from sm_80, float32 everywhere."""
    jobs = [(launch, target) for dtype in target.dtypes[1:] for launch in launches(target, dtype)]
    check(compile_all(jobs), target)


def test_the_fused_sampler_launches_only_the_kernels_its_rows_need():
    """Plain-temperature rows: the max/mass pass and the draw (two kernels); min-p alone adds
    its kept-mass pass; a top-k or a top-p the threshold search (eight kernels, nine launches)."""
    from decodelab.engine.row_sampling import ROW_WORDS
    from decodelab.engine.sampler import RowParams, SamplerMode, fused, sample

    logits = torch.empty(8, 128256)
    params = RowParams(torch.empty(8, ROW_WORDS, dtype=torch.int32))
    kernels = {}
    for name, flags in (("plain", dict(filters=False, min_p=False)),
                        ("min_p", dict(filters=False, min_p=True)), ("filtered", {})):
        with tl.recording() as found:
            sample(logits, params, fused(SamplerMode(False, False, 0, **flags)))
        kernels[name] = {launch.kernel for launch in found}
    assert kernels["plain"] == {"stats_kernel", "pick_kernel"}
    assert kernels["min_p"] == kernels["plain"] | {"histogram_kernel"}
    assert kernels["filtered"] == kernels["min_p"] | {"plan_kernel", "refine_kernel",
                                                      "gather_kernel", "solve_kernel",
                                                      "kept_kernel"}
