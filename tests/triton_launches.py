"""Every Triton launch the paged model and the fused sampler make, recorded on the CPU without
running a kernel, then compiled ahead of time for a GPU target (``tests/test_triton_aot.py``).

Recording: ``JITFunction.run`` (what ``kernel[grid](...)`` calls) is replaced by one that binds
the arguments with Triton's own binder, so each launch yields what a GPU launch would compile:
the signature (argument types, pointer alignment and integer attributes), the constexprs and
the options; nothing is compiled or launched. The launch sites run as the code runs them: the
model's decode step (also with ``batch_invariant=True``, and its prefill) at every graph
bucket with every matmul tile candidate and cuBLAS (and at
one row more than each bucket, an eager step between buckets, whose row count Triton may
specialise otherwise), its prefill, the tensor-parallel shards, the sampler in every mode and
phase 0's read stream, on shape-only CPU tensors
(``torch.empty``, never read as numbers) with ``F.linear`` (the cuBLAS path) returning an empty
result of its shape. Two layers stand for all of them (the first has no residual add; the rest
launch alike). Per target the device is emulated where the code asks: its compute capability
(which decides programmatic dependent launch), SM count and shared memory per block
(attention's splits and tiles).

``launch_pdl`` is left out of the options: it is a launch option (Triton 3.6's CUDA compiler
does not read it), so the kernels a captured step launches compile as the eager step's.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from unittest import mock

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDAOptions
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from decodelab.core.precision import allowed_dtypes, auto_dtype

MODELS = (("llama-3.2-1b", 1), ("llama-3.2-1b", 2), ("llama-3.1-8b", 1), ("llama-3.1-8b", 2))
MAX_ROWS = 128  # the largest decode batch a bench runs (graph buckets and paged_model batches)
# Block-table widths: paged_model's (context 4096 + 1 block) and one that 16 divides (Triton
# specialises an integer on it: the engine's width is max_model_len / block_size).
WIDTHS = (257, 256)
# (lengths, starts): 512 and 1,040 tokens reach the invariant matmul's two prefill tiles
PREFILLS = (((512,), None), ((1040,), None), ((100, 37, 1), None), ((16, 40), (32, 0)))
_SKIPPED_OPTIONS = {"launch_pdl", "debug", "instrumentation_mode"}
_OPTIONS = set(CUDAOptions.__dataclass_fields__) - _SKIPPED_OPTIONS


@dataclass(frozen=True, slots=True)
class Target:
    """A GPU architecture, with the numbers of one GPU of it that the launch plans read."""

    name: str  # "sm_75"
    capability: tuple[int, int]
    gpu: str
    sms: int
    max_shared: int  # bytes of shared memory one block may use (the opt-in limit)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """What ``core.precision`` lets a run pick here, ``auto``'s choice first."""
        return allowed_dtypes(self.capability)

    @property
    def auto_dtype(self) -> str:
        return auto_dtype(self.capability)


TARGETS = (Target("sm_75", (7, 5), "Tesla T4", 40, 64 << 10),
           Target("sm_80", (8, 0), "A100", 108, 163 << 10),
           Target("sm_89", (8, 9), "L4", 58, 99 << 10),
           Target("sm_90", (9, 0), "H100/H200", 132, 227 << 10))


@dataclass(frozen=True, slots=True)
class Launch:
    """What one ``kernel[grid](...)`` call compiles (hashable: equal launches compile once)."""

    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[tuple[int, ...], object], ...]
    attrs: tuple[tuple[tuple[int, ...], tuple[tuple[str, int], ...]], ...]
    options: tuple[tuple[str, object], ...]

    def label(self) -> str:
        names = [name for name, _ in self.signature]
        consts = ", ".join(f"{names[path[0]]}={v}" for path, v in self.constexprs)
        ptrs = sorted({kind for _, kind in self.signature if kind.startswith("*")})
        opts = ", ".join(f"{k}={v}" for k, v in self.options)
        return f"{self.kernel}[{opts}]({consts}; {' '.join(ptrs)})"


@dataclass(slots=True)
class _Recorder:
    backend: object = field(default_factory=lambda: make_backend(GPUTarget("cuda", 90, 32)))
    binders: dict = field(default_factory=dict)
    launches: set = field(default_factory=set)

    def run(self, fn: JITFunction, args, kwargs) -> None:
        binder = self.binders.get(fn)
        if binder is None:
            binder = self.binders[fn] = create_function_from_signature(fn.signature, fn.params,
                                                                       self.backend)
        bound, spec, opts = binder(*args, **kwargs)
        _, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound, spec, opts)
        self.launches.add(Launch(
            fn.fn.__module__, fn.fn.__qualname__, tuple(signature.items()),
            tuple(sorted(constexprs.items())),
            tuple(sorted((k, tuple(map(tuple, v))) for k, v in attrs.items())),
            tuple(sorted((k, v) for k, v in kwargs.items() if k in _OPTIONS))))


@contextlib.contextmanager
def recording() -> Iterator[set[Launch]]:
    """Within: every Triton launch is recorded (into the yielded set), none runs, and
    ``F.linear`` returns an uninitialised result of its shape."""
    rec = _Recorder()

    def run(self, *args, grid, warmup, **kwargs):
        rec.run(self, args, kwargs)

    def linear(x, w, b=None):
        return torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)

    with mock.patch.object(JITFunction, "run", run), \
            mock.patch.object(torch.nn.functional, "linear", linear):
        yield rec.launches


@contextlib.contextmanager
def emulated(target: Target) -> Iterator[None]:
    """The code's device queries answer as ``target`` would (no cached answer is kept)."""
    from decodelab.model.triton import attention_plan, pdl

    with mock.patch.object(torch.cuda, "get_device_capability", lambda *_: target.capability), \
            mock.patch.object(pdl, "_capable", pdl._capable.__wrapped__), \
            mock.patch.object(attention_plan, "sm_count", lambda device: target.sms), \
            mock.patch.object(attention_plan, "shared_per_block", lambda d: target.max_shared), \
            mock.patch.object(torch.cuda, "is_current_stream_capturing", lambda: False):
        yield


def shape_weights(config, dtype: torch.dtype, vocab_rows: int):
    """Weights of ``config``'s shapes, never initialised (only shapes and strides matter)."""
    from decodelab.model.weights import LayerWeights, Weights

    d, f = config.hidden_size, config.intermediate_size

    def empty(*shape):
        return torch.empty(shape, dtype=dtype)

    layers = tuple(LayerWeights(empty(d), empty(config.q_size + 2 * config.kv_size, d), None,
                                empty(d, config.q_size), empty(d), empty(2 * f, d),
                                empty(d, f)) for _ in range(config.num_layers))
    embed = empty(vocab_rows, d)
    head = embed if config.tie_word_embeddings else empty(vocab_rows, d)
    return Weights(embed, layers, empty(d), head)


def _matmul_choices(weights, rows: int) -> list[dict]:
    """The empty ``linear_choice`` (every matmul on cuBLAS), then where ``rows`` has Triton
    candidates one per tile (every matmul on that tile)."""
    from decodelab.model.triton import linear, skinny
    from decodelab.model.triton.matmul_choice import tunable

    if not tunable(rows):
        return [{}]
    lw = weights.layers[0]
    shapes = [(lw.qkv, False), (lw.o, False), (lw.gate_up, False), (lw.down, True),
              (weights.lm_head, False)]
    tiles = linear.TILES if rows == 1 else skinny.TILES
    return [{}, *({(*w.shape, swiglu, rows): tile for w, swiglu in shapes} for tile in tiles)]


def _model(name: str, tp: int, dtype: torch.dtype):
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama
    from decodelab.parallel.shard import local_config

    full = named_config(name)
    config = replace(local_config(full, tp), num_layers=2)
    weights = shape_weights(config, dtype, full.vocab_size // tp)
    if tp > 1:  # PagedLlama checks the head against the config's vocabulary; a rank's is a slice
        config = replace(config, vocab_size=full.vocab_size // tp)
    cache = PagedKVCache(config, MAX_ROWS + 64, 16, dtype=dtype)
    return PagedLlama(config, weights, cache, backend="torch")


def _decode(model, rows: int, choice: dict, pdl: bool | None, width: int = WIDTHS[0], *,
            invariant: bool = False) -> None:
    from decodelab.model.kv_cache import decode_inputs
    from decodelab.model.llama import _ops

    model.ops = _ops("triton", torch.device("cuda"), pdl, choice, invariant)
    tables, inputs = decode_inputs(model.cache, rows, 16, width=width)
    try:
        model.decode(*inputs)
    finally:
        for t in tables:
            model.cache.pool.free(t)


def _prefill(model, pdl: bool | None, *, invariant: bool = False) -> None:
    from decodelab.model.llama import _ops

    model.ops = _ops("triton", torch.device("cuda"), pdl, {}, invariant)
    pool = model.cache.pool
    for lengths, starts in PREFILLS:
        ends = [n + (s if starts else 0) for n, s in zip(lengths, starts or lengths, strict=True)]
        tables = [pool.allocate(pool.blocks_needed(e)) for e in ends]
        try:
            model.prefill([[1] * n for n in lengths], tables, starts)
        finally:
            for t in tables:
                pool.free(t)


def model_launches(target: Target, dtype: str, models=MODELS) -> set[Launch]:
    """The launches of decode and prefill steps of every model shape at every PDL setting
    the code allows on ``target`` (``pdl=None``: its own choice; ``False``: the benches'
    serial twin)."""
    from decodelab.model.graphs import DEFAULT_BUCKETS
    from decodelab.model.triton import pdl as pdl_support

    torch_dtype = getattr(torch, dtype)
    with recording() as launches, emulated(target), torch.inference_mode():
        settings = (None, False) if pdl_support.supported(torch.device("cuda")) else (None,)
        for name, tp in models:
            model = _model(name, tp, torch_dtype)
            for pdl in settings:
                _prefill(model, pdl)
                for rows in DEFAULT_BUCKETS:
                    for choice in _matmul_choices(model.weights, rows):
                        _decode(model, rows, choice, pdl)
                for rows in sorted({b + 1 for b in DEFAULT_BUCKETS if b < MAX_ROWS}
                                   - set(DEFAULT_BUCKETS)):
                    # an eager step between buckets: the row count's other attributes
                    _decode(model, rows, _matmul_choices(model.weights, rows)[-1], pdl)
                for rows in DEFAULT_BUCKETS:
                    _decode(model, rows, {}, pdl, WIDTHS[1])
                _prefill(model, pdl, invariant=True)  # the batch-invariant switch
                for rows in DEFAULT_BUCKETS:
                    _decode(model, rows, {}, pdl, invariant=True)
    return launches


def sampler_launches(target: Target, vocab: int = 128256) -> set[Launch]:
    """The fused sampler's launches at every graph bucket, in every mode (greedy or sampling,
    with or without penalties), through ``sample`` and ``sample_step``; logits in float32, as
    the model returns them."""
    from decodelab.engine.row_sampling import ROW_WORDS
    from decodelab.engine.sampler import (
        PenaltyState,
        RowParams,
        SamplerMode,
        fused,
        sample,
        sample_step,
    )
    from decodelab.model.graphs import DEFAULT_BUCKETS

    with recording() as launches, emulated(target):
        for b in DEFAULT_BUCKETS:
            params = RowParams(torch.empty(b, ROW_WORDS, dtype=torch.int32))
            logits = torch.empty(b, vocab)
            pen = PenaltyState(torch.empty(b, vocab, dtype=torch.int32),
                               torch.empty(b, vocab, dtype=torch.bool))
            last, out = torch.empty(b + 1, dtype=torch.int64), torch.empty(b, dtype=torch.int64)
            for greedy in (True, False):
                for penalties in (True, False):
                    mode = fused(SamplerMode(greedy, penalties, 0))
                    sample(logits, params, mode, pen)
                    sample_step(logits, params, mode, pen, last, out)
    return launches


def calibration_launches(target: Target) -> set[Launch]:
    """Phase 0's read-ceiling stream (``env.read_stream``) at each of its configurations."""
    from decodelab.env.read_stream import STREAM_CONFIGS, stream_sum

    block_max = max(b for b, _, _ in STREAM_CONFIGS)
    with recording() as launches, emulated(target):
        src, partial = torch.empty(4 * block_max), torch.empty(1024)
        for block, warps, per_sm in STREAM_CONFIGS:
            stream_sum(src, block, warps, per_sm * 132, partial)
    return launches


@dataclass(frozen=True, slots=True)
class Compiled:
    launch: Launch
    target: str
    shared: int = 0  # bytes of shared memory per block
    registers: int = 0  # per thread (0: cuobjdump not found)
    stack: int = 0  # bytes of stack frame and local memory per thread: register spills
    error: str | None = None


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers, stack + local-memory bytes) per thread from cuobjdump; (0, 0) without it."""
    import re

    from triton import knobs

    tool = Path(knobs.nvidia.cuobjdump.path)
    if not tool.exists():
        return 0, 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", fh.name], capture_output=True,
                             text=True, check=False).stdout
    found = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out)}
    return found.get("REG", 0), found.get("STACK", 0) + found.get("LOCAL", 0)


def compile_launch(launch: Launch, target: Target) -> Compiled:
    """Compile ``launch`` to a cubin for ``target`` (no GPU: Triton's bundled ptxas)."""
    import triton

    fn = getattr(importlib.import_module(launch.module), launch.kernel)
    backend = make_backend(GPUTarget("cuda", target.capability[0] * 10 + target.capability[1],
                                     32))
    options = backend.parse_options(dict(launch.options)).__dict__
    source = ASTSource(fn, dict(launch.signature), dict(launch.constexprs),
                       {k: [list(a) for a in v] for k, v in launch.attrs})
    try:
        kernel = triton.compile(source, target=backend.target, options=options)
    except Exception as exc:  # noqa: BLE001 - reported per launch by the test
        root = exc
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__
        why = f"{type(exc).__name__}: {str(exc)[-1500:]}"
        if root is not exc:
            why += f"\n  because {type(root).__name__}: {str(root)[-500:]}"
        return Compiled(launch, target.name, error=why)
    regs, stack = _resources(kernel.asm["cubin"])
    return Compiled(launch, target.name, kernel.metadata.shared, regs, stack)
