"""Notebook 04_runtime: its parameters, a live demonstration of the engine, and summaries.

The demonstration runs the real engine on the tiny Llama (CPU, seconds): a mixed batch with
streaming, requests rejected at admission, and one request failing in each way (its callback
raises, its logits turn non-finite, it is aborted) while the others finish untouched.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pandas as pd

from decodelab.core.params import ModelParams as BaseParams
from decodelab.core.params import param
from decodelab.engine.serve_summary import serve_summary as serve_summary  # the notebook's

TABLES = ("runtime", "runtime_steps", "runtime_sampler", "runtime_batch", "runtime_requests",
          "runtime_errors")


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 04_runtime (``profile``, ``interactive`` and ``dtype`` come from
    the base)."""

    NOTEBOOK: ClassVar[str] = "04_runtime"

    run_bench: bool = param(True, "measure this machine (False: stored results only)")


class _LogToStderr(io.TextIOBase):
    """The bench's ``[bench]`` progress lines go to stderr (shown while a cell runs, left out
    of the exported report); the lines that report a failure or a skip are also kept."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def write(self, text: str) -> int:
        sys.stderr.write(text)
        self.problems += [line.removeprefix("[bench] ") for line in text.splitlines()
                          if "FAILED" in line or "skipped" in line]
        return len(text)


def run_local_bench(params: NotebookParams) -> tuple[list[Path], list[str]]:
    """Run the runtime bench on this machine: (tables written, failures and skips reported)."""
    from decodelab.core import paths
    from decodelab.engine.bench import bench

    if not params.run_bench:
        return [], []
    log = _LogToStderr()
    with contextlib.redirect_stdout(log):
        written = bench(params.profile, paths.local_dir(), params.dtype)
    return written, log.problems


def technique_costs(runtime: pd.DataFrame) -> str:
    """Markdown, one line per origin: each technique switched off, as a multiple of the full
    engine's step."""
    from decodelab.core.results import origin_label

    lines = []
    for origin, sel in runtime.groupby("origin", sort=False):
        v = sel.set_index("variant")["wall_us"]
        off = [x for x in ("no_graphs", "no_async_output", "no_static_inputs") if x in v.index]
        costs = ", ".join(f"`{x}` {v[x] / v['engine']:.2f}x" for x in off)
        lines.append(f"- {origin_label(origin)}: relative to the full engine, {costs}.")
    return "\n".join(lines)


def sampler_ratios(samplers: pd.DataFrame) -> str:
    """Markdown, one line per origin: full-vocabulary sort over partial selection, and partial
    selection over the fused sampler where it ran, device time."""
    from decodelab.core.results import origin_label

    s = samplers.set_index(["origin", "variant"])["device_us"]

    def fused(o) -> str:
        if (o, "fused") not in s.index:
            return ""
        return (f"; partial selection / fused sampler = "
                f"{s[(o, 'partial_topk')] / s[(o, 'fused')]:.1f}x ({s[(o, 'fused')]:.0f} µs)")

    return "\n".join(
        f"- {origin_label(o)}: full sort / partial selection = "
        f"{s[(o, 'full_sort')] / s[(o, 'partial_topk')]:.1f}x{fused(o)}"
        for o in samplers["origin"].unique()
        if (o, "full_sort") in s.index and (o, "partial_topk") in s.index)


def step_medians(steps: pd.DataFrame) -> pd.DataFrame:
    """Median µs per step of each phase, the sync wait and the wall, per origin and variant.
    The sync wait is part of the emit phase (the host blocked on the device while emitting):
    ``emit_excl_wait_us`` is emit without it, so the phases and the wait add up to the step
    (medians of each column: up to the spread between steps), never past it."""
    from decodelab.engine.metrics import PHASE_COLS

    steps = steps.assign(emit_us=steps["emit_us"] - steps["sync_wait_us"]).rename(
        columns={"emit_us": "emit_excl_wait_us"})
    cols = [c if c != "emit_us" else "emit_excl_wait_us" for c in PHASE_COLS]
    return steps.groupby(["origin", "variant"])[[*cols, "sync_wait_us", "wall_us"]].median(
        ).reset_index()


def load_tables() -> dict[str, pd.DataFrame]:
    """Every stored copy (shipped reference and this machine) of the runtime tables."""
    from decodelab.core.results import stored_tables

    return stored_tables(TABLES)


def demo() -> tuple[pd.DataFrame, list[str], dict[str, int]]:
    """Run the engine on the tiny model with healthy and failing requests.

    Returns (one row per request: status, reason, tokens, error; the admission errors;
    the block pool's state at the end)."""
    from decodelab.engine.config import EngineConfig
    from decodelab.engine.engine import Engine
    from decodelab.engine.requests import InvalidRequestError, Request, SamplingParams
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama
    from decodelab.model.weights import random_weights

    cfg = named_config("tiny")
    model = PagedLlama(cfg, random_weights(cfg, 0), PagedKVCache(cfg, 48, 8))
    eng = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=128))
    rejected = []
    for bad in (Request("empty", ()), Request("oov", (1, cfg.vocab_size)),
                Request("long", tuple(range(1, 200)))):
        try:
            eng.submit(bad)
        except InvalidRequestError as exc:
            rejected.append(str(exc))
    try:
        SamplingParams(top_p=1.5)
    except InvalidRequestError as exc:
        rejected.append(str(exc))

    def raising(ev):
        if ev.index == 2:
            raise ConnectionError("client disconnected")

    def aborting(ev):
        if ev.index == 3:
            eng.abort("aborted")

    eng.logits_hook = lambda rows, logits: [  # row of request "nan" from its 5th token on
        logits[i].fill_(float("nan")) for i, s in enumerate(rows)
        if s.request_id == "nan" and s.launched >= 4]
    specs = {"greedy": dict(temperature=0.0), "top_k": dict(temperature=0.8, top_k=20),
             "top_p": dict(temperature=1.0, top_p=0.9), "min_p": dict(temperature=1.2, min_p=0.1),
             "penalties": dict(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5),
             "callback": dict(temperature=0.8), "nan": dict(temperature=0.8),
             "aborted": dict(temperature=0.8)}
    callbacks = {"callback": raising, "aborted": aborting}
    handles = [eng.submit(Request(name, (1, 2, 3, 4 + i), SamplingParams(
        **kw, seed=i, max_new_tokens=10), on_token=callbacks.get(name)))
        for i, (name, kw) in enumerate(specs.items())]
    eng.run()
    rows = pd.DataFrame([dict(request=h.request_id, status=h.status.value,
                              reason=h.finish_reason, tokens=len(h.tokens), error=h.error)
                         for h in handles])
    pool = dict(free=eng.pool.num_free, total=eng.pool.num_total)
    return rows, rejected, pool


def summary(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown lines with the headline numbers of every origin (no number typed by hand)."""
    from decodelab.core.results import origin_label

    lines = []
    rt = tables.get("runtime")
    if rt is None:
        return "No runtime results are stored yet: run the bench (`run_bench=True`)."
    for origin, sel in rt.groupby("origin", sort=False):
        v = sel.set_index("variant")
        eng, bare = v.loc["engine"], v.loc["bare_forward"]
        lines.append(
            f"- **{origin_label(origin)}**, batch {int(eng['batch'])}: engine step "
            f"{eng['wall_us']:.0f} µs vs bare forward {bare['wall_us']:.0f} µs "
            f"(**{eng['ratio_to_bare']:.2f}x**, target ≤ {eng['target_ratio']:.2f}x); "
            f"sampler {eng['sampler_device_us']:.0f} µs of device time = "
            f"**{100 * eng['sampler_share']:.1f}%** of the step (target ≤ "
            f"{100 * eng['target_sampler_share']:.0f}%), while inside the loop the sample "
            f"phase takes {100 * eng['sample_phase_share']:.1f}% of the step in host time; "
            f"host time outside the forward {eng['orchestration_us']:.0f} µs per step.")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the serving bench
SERVE_TABLES = ("serve_offline", "serve_online", "serve_steps")


def run_local_serve(params: NotebookParams) -> tuple[list[Path], list[str]]:
    """Run the serving bench on this machine (as :func:`run_local_bench` runs the runtime
    bench): (tables written, failures and skips reported)."""
    from decodelab.core import paths
    from decodelab.engine.bench.serve import bench

    if not params.run_bench:
        return [], []
    log = _LogToStderr()
    with contextlib.redirect_stdout(log):
        written = bench(params.profile, paths.local_dir(), params.dtype)
    return written, log.problems


def load_serve_tables() -> dict[str, pd.DataFrame]:
    """Every stored copy (shipped reference and this machine) of the serving tables."""
    from decodelab.core.results import stored_tables

    return stored_tables(SERVE_TABLES)
