"""The paged-model tables read for notebook 04_model: step time against the HBM roofline, tokens
per second against ``transformers``, the per-kernel profile with the bytes each kernel moves,
attention's bandwidth at long context and the graph capture cost.

Pandas only (no torch): every function takes tables as ``load_table`` returns them (an
``origin`` column labels the shipped reference and this machine's runs) and computes; nothing
here holds a measured number. Bytes that a kernel must move are derived from the model's shapes
(:class:`decodelab.model.config.ModelConfig`), never typed. The floors are those bytes at the
read ceiling of the origin's ``environment`` table (:mod:`decodelab.model.floors`; a decode
step's bytes are reads), or at the run's own copy bandwidth where no read ceiling was
measured, which a read-only kernel can beat (its ``ceiling`` column says which).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from decodelab.model.floors import ceiling_gb_s, floor_ms
from decodelab.model.modes import COMPILED, OURS, PEERS, SERIAL
from decodelab.model.pdl_policy import for_rows

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# What a profiled kernel does, from its name (first match wins; patterns, so that a renamed or
# new variant keeps its role): our Triton kernels start with "_"; cuBLAS names its matmul
# kernels after the architecture (nvjet, sm90_xmma, cutlass, ..._gemm). Attention comes first:
# fused attention kernels may carry a GEMM library's name (cutlass fmha).
ROLES: tuple[tuple[str, str], ...] = (
    ("attention merge", r"merge_split"),
    ("attention row order", r"row_order"),
    ("attention", r"attn|attention|fmha|flash|sdpa"),
    ("matmul (Triton gemv)", r"^_gemv|^_skinny"),
    ("matmul (cuBLAS)", r"gemm|nvjet|cutlass|xmma|matmul"),
    ("norm + residual", r"rms_norm"),
    ("rotary + cache write", r"rope"),
    ("copy", r"memcpy|copy"),
    ("embedding gather", r"index|embed"),
)


def _with_origin(df: pd.DataFrame) -> pd.DataFrame:
    return df if "origin" in df else df.assign(origin="local")


def step_view(pm: pd.DataFrame) -> pd.DataFrame:
    """Our eager and graph rows with the step split against the roofline: ``floor_ms`` (bytes /
    the ceiling, :func:`floor_ms`) and ``above_floor_ms`` (the measured step minus that floor)."""
    pm = _with_origin(pm)
    ours = pm[pm["mode"].isin(OURS)].copy()
    ours["floor_ms"] = floor_ms(ours)
    ours["above_floor_ms"] = ours["ms_per_step"] - ours["floor_ms"]
    cols = ["origin", "model", "mode", "batch", "context", "ms_per_step", "tokens_per_s",
            "achieved_gb_s", "roofline_fraction", "floor_ms", "above_floor_ms"]
    return ours[cols].sort_values(["origin", "mode", "context", "batch"]).reset_index(drop=True)


def vs_transformers(pm: pd.DataFrame) -> pd.DataFrame:
    """Per origin, model, batch and context where ``transformers`` was timed: tokens/s of each
    mode, the faster of transformers' two caches, and ``speedup`` = our graph (eager where no
    graph was measured) / that faster peer."""
    pm = _with_origin(pm)
    keys = ["origin", "model", "batch", "context"]
    wide = pm.pivot_table(index=keys, columns="mode", values="tokens_per_s").reset_index()
    peers = [p for p in PEERS if p in wide.columns]
    if not peers:
        return pd.DataFrame(columns=[*keys, "ours", "best_peer", "speedup"])
    wide = wide.dropna(subset=peers, how="all").reset_index(drop=True)
    for mode in OURS:
        if mode not in wide.columns:
            wide[mode] = math.nan
    graph = wide["graph"].notna()
    wide["ours"] = graph.map({True: "graph", False: "eager"})
    wide["best_peer"] = wide[peers].idxmax(axis=1)
    wide["speedup"] = wide["graph"].where(graph, wide["eager"]) / wide[peers].max(axis=1)
    wide.columns.name = None
    return wide.reset_index(drop=True)


def linear_shapes(config) -> pd.DataFrame:
    """The matmuls of one decode step from the model's shapes: (n, k, swiglu) as table
    ``paged_model_linear`` names them, with what each is and how often a step runs it."""
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
    rows = [("qkv", config.q_size + 2 * config.kv_size, d, False, layers),
            ("o", d, config.q_size, False, layers), ("gate_up", 2 * f, d, False, layers),
            ("down", d, f, True, layers), ("lm_head", config.vocab_size, d, False, 1)]
    return pd.DataFrame(rows, columns=["weight", "n", "k", "swiglu", "calls_per_step"])


def role_of(kernel: str) -> str:
    for role, pattern in ROLES:
        if re.search(pattern, kernel, flags=re.I):
            return role
    return "other"


def short_name(kernel: str) -> str:
    """A kernel name without its template arguments and signature (the profiler's names may be
    cut off, so an unclosed ``<`` or ``(`` ends the name too)."""
    name = kernel.removeprefix("void ").replace("(anonymous namespace)::", "")
    while (inner := re.sub(r"<[^<>]*>", "", name)) != name:
        name = inner
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or kernel


def _matmul_bytes(linear: pd.DataFrame, shapes: pd.DataFrame, batch: int, dtype_bytes: int
                  ) -> dict[str, tuple[float, float]]:
    """Per matmul role: (bytes per step, calls per step) of the shapes the model hands to it
    (weights, plus the batch's input and output rows)."""
    chosen = linear[linear["chosen"].astype(str) == "True"]
    picked = shapes.merge(chosen[["n", "k", "swiglu", "candidate"]], on=["n", "k", "swiglu"])
    picked["role"] = picked["candidate"].map(
        lambda c: "matmul (cuBLAS)" if c == "cublas" else "matmul (Triton gemv)")
    per_call = (picked["n"] * picked["k"] + batch * (picked["n"] + picked["k"])) * dtype_bytes
    picked["bytes"] = per_call * picked["calls_per_step"]
    sums = picked.groupby("role")[["bytes", "calls_per_step"]].sum()
    return {role: (float(r["bytes"]), float(r["calls_per_step"])) for role, r in sums.iterrows()}


def kernel_profile(kernels: pd.DataFrame, linear: pd.DataFrame | None, pm: pd.DataFrame
                   ) -> pd.DataFrame:
    """Table ``paged_model_kernels`` with each kernel's role and, where the model's shapes say
    what it must read, the bytes per step, the rate it reached (TB/s) and that rate as a share
    of the ceiling (``of_ceiling``, :func:`ceiling_gb_s`). Matmul bytes count only when the kernel's calls per step
    equal those of the shapes assigned to it (else ``note`` says why they are left out);
    attention reads the batch's K and V at the profiled context."""
    from decodelab.model.config import NAMED_CONFIGS

    out = []
    for origin, ks in _with_origin(kernels).groupby("origin", sort=False):
        runs = _with_origin(pm)
        runs = runs[runs["origin"] == origin]
        model, dtype = runs["model"].iloc[0], runs["dtype"].iloc[0]
        copy = float(ceiling_gb_s(runs).median())
        config, nbytes = NAMED_CONFIGS.get(model), DTYPE_BYTES.get(dtype)
        ks = ks.assign(role=ks["kernel"].map(role_of), name=ks["kernel"].map(short_name),
                       bytes_per_step=math.nan, note="")
        if config is not None and nbytes is not None:
            ks = _assign_bytes(ks, config, nbytes, linear, origin)
        ks["tb_s"] = ks["bytes_per_step"] / (ks["us_per_step"] * 1e-6) / 1e12
        ks["of_ceiling"] = ks["tb_s"] * 1e3 / copy
        ks["ceiling"] = str(runs["ceiling"].iloc[0]) if "ceiling" in runs else "copy bandwidth"
        ks["model"] = model
        out.append(ks)
    cols = ["origin", "model", "batch", "context", "name", "role", "calls_per_step",
            "us_per_step", "share", "bytes_per_step", "tb_s", "of_ceiling", "ceiling", "note"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def _assign_bytes(ks: pd.DataFrame, config, nbytes: int, linear: pd.DataFrame | None,
                  origin: str) -> pd.DataFrame:
    ks = ks.copy()
    attn = ks["role"] == "attention"
    kv = ks["batch"] * ks["context"] * config.kv_bytes_per_token(nbytes)
    ks.loc[attn, "bytes_per_step"] = kv[attn]
    if linear is None:
        ks.loc[ks["role"].str.startswith("matmul"), "note"] = "no paged_model_linear table"
        return ks
    lin = _with_origin(linear)
    lin = lin[lin["origin"] == origin]
    batch = int(ks["batch"].iloc[0])
    for role, (total, calls) in _matmul_bytes(lin, linear_shapes(config), batch, nbytes).items():
        rows = ks["role"] == role
        profiled = float(ks.loc[rows, "calls_per_step"].sum())
        if rows.sum() == 1 and profiled == calls:
            ks.loc[rows, "bytes_per_step"] = total
        elif rows.any():
            ks.loc[rows, "note"] = (f"{profiled:g} calls profiled, {calls:g} expected from the "
                                    "shapes: bytes not assigned")
    return ks


def linear_choices(linear: pd.DataFrame) -> pd.DataFrame:
    """Per origin and matmul shape (and row count, for table ``paged_model_gemm``): the
    candidate the model uses, its time and weight bandwidth, and cuBLAS's time on the same
    shape (``vs_cublas`` = cuBLAS / chosen)."""
    lin = _with_origin(linear)
    keys = ["origin", "n", "k", "swiglu", *(["rows"] if "rows" in lin else [])]
    chosen = lin[lin["chosen"].astype(str) == "True"].set_index(keys)
    cublas = lin[lin["candidate"] == "cublas"].set_index(keys)["us"].rename("cublas_us")
    out = chosen[["candidate", "us", "weight_gb_s"]].join(cublas).reset_index()
    out["vs_cublas"] = out["cublas_us"] / out["us"]
    return out


def matmul_headroom(linear: pd.DataFrame, pm: pd.DataFrame) -> pd.DataFrame:
    """Per origin and batch-1 matmul weight (qkv, o, gate_up, down, lm_head): the chosen
    kernel's µs per call as the matmul plan timed it (back to back inside a CUDA graph), the
    µs its weight needs at the ceiling (``floor_us``, :func:`ceiling_gb_s`), and ``above_us`` =
    calls per step x (time - floor): what each matmul's start, tail and slower streaming add to
    the step. Negative only where the copy bandwidth stands in for a read ceiling: a read-only
    kernel can outrun the copy, which also writes."""
    from decodelab.model.config import NAMED_CONFIGS

    out, runs = [], _with_origin(pm)
    for origin, lin in linear_choices(linear).groupby("origin", sort=False):
        run = runs[runs["origin"] == origin]
        if run.empty or (config := NAMED_CONFIGS.get(run["model"].iloc[0])) is None:
            continue
        rows = linear_shapes(config).merge(lin, on=["n", "k", "swiglu"])
        nbytes = DTYPE_BYTES.get(run["dtype"].iloc[0], math.nan)
        rows["floor_us"] = rows["n"] * rows["k"] * nbytes / (ceiling_gb_s(run).median() * 1e3)
        rows["above_us"] = rows["calls_per_step"] * (rows["us"] - rows["floor_us"])
        rows["ceiling"] = str(run["ceiling"].iloc[0]) if "ceiling" in run else "copy bandwidth"
        out.append(rows)
    cols = ["origin", "weight", "n", "k", "calls_per_step", "candidate", "us", "floor_us",
            "above_us", "ceiling"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def attention_marginal(pm: pd.DataFrame, mode: str = "graph") -> pd.DataFrame:
    """Attention's bandwidth read off the step itself: between the shortest and the longest
    measured context at one batch, the weights read are the same, so the extra time is the
    extra K/V read. ``kv_tb_s`` = extra bytes / extra device time; ``of_ceiling`` its share of
    the ceiling (:func:`ceiling_gb_s`); ``kv_share_long`` the K/V share of the step's bytes at the long
    context."""
    pm = _with_origin(pm)
    rows = []
    sel = pm[pm["mode"] == mode]
    for (origin, model, batch), g in sel.groupby(["origin", "model", "batch"], sort=False):
        g = g.sort_values("context")
        if g["context"].nunique() < 2:
            continue
        lo, hi = g.iloc[0], g.iloc[-1]
        extra_bytes = float(hi["bytes_per_step"] - lo["bytes_per_step"])
        col = "device_ms_per_step" if pd.notna(hi.get("device_ms_per_step")) else "ms_per_step"
        extra_ms = float(hi[col] - lo[col])
        tb_s = extra_bytes / (extra_ms * 1e-3) / 1e12 if extra_ms > 0 else math.nan
        rows.append(dict(origin=origin, model=model, mode=mode, batch=int(batch),
                         context_short=int(lo["context"]), context_long=int(hi["context"]),
                         extra_kv_bytes=extra_bytes, extra_ms=extra_ms, kv_tb_s=tb_s,
                         of_ceiling=tb_s * 1e3 / float(ceiling_gb_s(hi)),
                         ceiling=str(hi.get("ceiling") or "copy bandwidth"),
                         kv_share_long=extra_bytes / float(hi["bytes_per_step"])))
    return pd.DataFrame(rows)


def capture_cost(pm: pd.DataFrame) -> pd.DataFrame:
    """Per origin and model: the one-time graph capture (s), the memory the graphs hold (MiB)
    and the batch buckets captured."""
    pm = _with_origin(pm)
    g = pm[(pm["mode"] == "graph") & pm["capture_s"].notna()]
    out = g.groupby(["origin", "model"], sort=False).agg(
        capture_s=("capture_s", "max"), graph_mem_mib=("graph_mem_mib", "max"),
        buckets=("bucket", lambda b: ", ".join(str(int(x)) for x in sorted(b.dropna().unique()))))
    return out.reset_index()


def _paired(pm: pd.DataFrame, other: str, cols: list[str]) -> pd.DataFrame:
    """Our graph rows joined with mode ``other`` at the same origin, batch and context."""
    pm = _with_origin(pm)
    pm = pm.assign(**{c: math.nan for c in cols if c not in pm})  # tables of older layouts
    keys = ["origin", "model", "batch", "context"]
    gb = ["floor_gb_s"] if "floor_gb_s" in pm else []
    ours = pm[pm["mode"] == "graph"][[*keys, "ms_per_step", "copy_gb_s", *gb, "bytes_per_step"]]
    peer = pm[pm["mode"] == other][[*keys, *cols]].rename(
        columns={"ms_per_step": f"{other}_ms"})
    return ours.merge(peer, on=keys).sort_values(keys).reset_index(drop=True)


def boundary_effect(pm: pd.DataFrame) -> pd.DataFrame:
    """What programmatic dependent launch removes: per point, the graph step without it
    (``graph_no_pdl_ms``) and with it, the time saved, and both as a share of the roofline.
    ``pdl`` says whether the graph step used PDL at that batch (``pdl_policy``): where it did
    not, both timings launched the same kernels serially and their difference is run-to-run
    spread (tables of older runs timed such points too)."""
    out = _paired(pm, SERIAL, ["ms_per_step"])
    out["pdl"] = [for_rows(True, int(b)) for b in out["batch"]]
    out["saved_us"] = (out[f"{SERIAL}_ms"] - out["ms_per_step"]) * 1e3
    floor = floor_ms(out)
    out["roofline_before"] = floor / out[f"{SERIAL}_ms"]
    out["roofline_after"] = floor / out["ms_per_step"]
    return out.drop(columns=["copy_gb_s", "floor_gb_s", "bytes_per_step"], errors="ignore")


def vs_compiled(pm: pd.DataFrame) -> pd.DataFrame:
    """Our graph step against ``compile_static`` at the points both were timed: ``speedup`` =
    its step / ours; ``compile_s`` is its one-time compilation."""
    out = _paired(pm, COMPILED, ["ms_per_step", "compile_s"])
    out["speedup"] = out[f"{COMPILED}_ms"] / out["ms_per_step"]
    return out.drop(columns=["copy_gb_s", "floor_gb_s", "bytes_per_step"], errors="ignore")


def point(pm: pd.DataFrame, origin: str, mode: str, batch: int, context: int) -> pd.Series | None:
    """One measured row, or None when that point was not measured."""
    pm = _with_origin(pm)
    hit = pm[(pm["origin"] == origin) & (pm["mode"] == mode) & (pm["batch"] == batch)
             & (pm["context"] == context)]
    return hit.iloc[0] if not hit.empty else None
