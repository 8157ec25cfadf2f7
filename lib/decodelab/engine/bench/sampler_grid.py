"""Table ``sampler_grid``: the sampler at the settings users run, against the field.

Every row kind alone and the issue-24 mix (eight kinds in equal shares), at every batch and
vocabulary of :class:`GridConfig`, on bf16 logits (``randn * 2``: the 0.9 nucleus of a row
alone holds tens of thousands of tokens at V = 128k). Samplers, each with the same rows:

- ``fused``: this project's Triton sampler (``fused_sampler.sample_step``, as the engine runs it);
- ``torch``: this project's plain-torch sampler (``sampler.sample_step``, its candidate
  selection as ``choose_mode`` picks it);
- ``torch_sort``: the plain way, one ``torch.sort`` of the row, then the same filters on the
  sorted probabilities (a prefix for top-k and top-p, no tie groups) and a draw in sorted
  order from the row's uniform;
- ``flashinfer`` (where it imports; ``pip install .[peers]``): the call that matches the kind,
  named in ``call``, its filters in ``matches`` (temperature is applied to the logits first).

Columns: ``device_us`` the call's kernels back to back (captured in a CUDA graph, replayed;
the CPU: wall time), ``issued_us`` its CUDA-event time issued op by op, ``floor_us`` the
logits read once at the measured copy bandwidth (``copy_gb_s``; ``x_floor`` = device / floor),
``in_kept_set`` the fraction of rows whose token the rule keeps (greedy rows: the argmax;
below 1 only where ``matches`` leaves a filter out), ``agrees_with_torch`` the fraction whose
token is the ``torch`` sampler's from the same uniform (NaN: another draw order or random
stream), ``row_passes`` the fused rows whose threshold took exact passes over the row (-1:
other samplers). Validated before timing: ``fused`` and ``torch_sort`` keep their tokens in
the rule's kept set and ``fused`` draws the ``torch`` sampler's, but for one row or a tenth
of the rows (within float32 rounding of a boundary).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from decodelab.core.results import write_table
from decodelab.core.timing import TimingConfig, copy_bandwidth_gb_s, median_times
from decodelab.core.validate import ConfigError
from decodelab.engine.bench.sampler_timing import graph_device_time
from decodelab.engine.randomness import row_uniforms
from decodelab.engine.requests import SamplingParams
from decodelab.engine.row_sampling import RowParams, RowSampling
from decodelab.engine.sampler import (
    choose_mode,
    fused,
    keep_mask,
    keep_threshold,
    penalised,
    sample,
    sample_step,
)

NAN = float("nan")
# name -> (temperature, top_k, top_p, min_p)
KINDS = {"greedy": (0.0, 0, 1.0, 0.0), "k50_p0.9": (0.8, 50, 0.9, 0.0), "k20": (1.0, 20, 1.0, 0.0),
         "k100_p0.95_minp0.05": (0.7, 100, 0.95, 0.05), "k40_p0.8": (1.1, 40, 0.8, 0.0),
         "p0.9": (1.0, 0, 0.9, 0.0), "minp0.1": (0.9, 0, 1.0, 0.1), "plain": (1.0, 0, 1.0, 0.0),
         "serving_t0.6": (0.6, 0, 1.0, 0.0), "k2000": (1.0, 2000, 1.0, 0.0)}
MIX = tuple(list(KINDS)[:8])  # the issue-24 mix: the first eight kinds in equal shares
SAMPLERS = ("fused", "torch", "torch_sort", "flashinfer")


@dataclass(frozen=True, slots=True)
class GridConfig:
    batches: tuple[int, ...]
    vocabs: tuple[int, ...]
    kinds: tuple[str, ...]  # KINDS names and "mix"
    samplers: tuple[str, ...]
    logits_scale: float = 2.0
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(3, 10, 5))

    def __post_init__(self) -> None:
        for name, values, low in (("batches", self.batches, 1), ("vocabs", self.vocabs, 64)):
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < low
                                 for v in values):
                raise ConfigError(f"GridConfig.{name}={values!r}: must be a non-empty tuple of "
                                  f"integers >= {low}")
        for name, values, allowed in (("kinds", self.kinds, (*KINDS, "mix")),
                                      ("samplers", self.samplers, SAMPLERS)):
            bad = [v for v in values if v not in allowed]
            if not values or bad:
                raise ConfigError(f"GridConfig.{name}={values!r}: {bad or 'empty'}; allowed: "
                                  f"{', '.join(allowed)}")

    @classmethod
    def for_device(cls, device: torch.device) -> GridConfig:
        """The full grid on a GPU; on a CPU the torch samplers at tiny sizes (a smoke run)."""
        if device.type == "cuda":
            return cls((1, 8, 32, 128, 256), (32000, 128256, 151936), (*KINDS, "mix"), SAMPLERS)
        return cls((1, 4), (1000,), (*KINDS, "mix"), ("torch", "torch_sort"),
                   timing=TimingConfig(1, 3, 2))


@dataclass(frozen=True, slots=True)
class SamplerGridRow:
    """Table ``sampler_grid``: one sampler on one batch of one kind (the columns: above)."""

    sampler: str
    call: str
    matches: str
    kind: str
    batch: int
    vocab: int
    logits_dtype: str
    device_us: float
    issued_us: float
    floor_us: float
    x_floor: float
    copy_gb_s: float
    in_kept_set: float
    agrees_with_torch: float
    row_passes: int
    logits_scale: float


def kind_settings(kind: str, batch: int) -> list[tuple[float, int, float, float]]:
    """The batch's rows: the kind's setting, or the mix's kinds in turn."""
    kinds = itertools.cycle(MIX) if kind == "mix" else itertools.repeat(kind)
    return [KINDS[k] for k in itertools.islice(kinds, batch)]


def grid_params(settings, device: torch.device, counter: int = 0) -> RowParams:
    """The rows through SamplingParams, as the engine packs them (seeds 0.., one slot each)."""
    u = row_uniforms(np.arange(len(settings)), np.full(len(settings), counter))
    rows = [RowSampling.of(SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m),
                           uniform=float(u[i]), slot=i)
            for i, (t, k, p, m) in enumerate(settings)]
    return RowParams.of(rows, device)


def sort_sample(logits: torch.Tensor, p: RowParams) -> torch.Tensor:
    """The plain sampler: sort, softmax, top-k and top-p prefixes and min-p on the sorted
    probabilities, the draw in sorted order from the row's uniform; greedy rows the argmax."""
    z = logits.float() * p.inv_temperature[:, None]
    vals, idx = torch.sort(z, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(vals, dim=-1)
    rank = torch.arange(z.shape[1], device=z.device)
    drop = rank[None, :] >= p.top_k.long()[:, None]
    probs = probs.masked_fill(drop, 0.0)
    drop |= probs.cumsum(dim=-1) - probs >= p.top_p[:, None] * probs.sum(dim=-1, keepdim=True)
    drop |= probs < p.min_p[:, None] * probs[:, :1]
    cum = probs.masked_fill(drop, 0.0).cumsum(dim=-1)
    pick = (cum < p.uniform[:, None] * cum[:, -1:]).sum(dim=-1).clamp_(max=z.shape[1] - 1)
    return torch.where(p.sampling(), idx.gather(1, pick[:, None]).squeeze(1), z.argmax(dim=-1))


def flashinfer_call(settings, logits: torch.Tensor, p: RowParams
                    ) -> tuple[str, str, Callable[[], torch.Tensor]] | None:
    """(call, filters it matches, the call) of FlashInfer for these rows; None where it is not
    installed or has no call for them (greedy rows alone)."""
    try:
        fi = importlib.import_module("flashinfer.sampling")
    except ImportError:
        return None
    kinds = {(k > 0, p_ < 1, m > 0) for t, k, p_, m in settings if t > 0}
    if not kinds:
        return None
    inv_t = p.inv_temperature.contiguous()[:, None]
    top_p, min_p = p.top_p.contiguous(), p.min_p.contiguous()
    top_k = torch.where(p.sampling(), p.top_k.clamp(max=logits.shape[1]), 1)  # greedy: top-k 1

    def probs() -> torch.Tensor:
        return torch.softmax(logits.float() * inv_t, dim=-1)

    if kinds == {(False, False, False)}:
        name, matches = "sampling_from_logits", "temperature"
        call = lambda **kw: fi.sampling_from_logits(logits.float() * inv_t, **kw)  # noqa: E731
    elif kinds == {(False, True, False)}:
        name, matches = "top_p_sampling_from_probs", "temperature, top-p"
        call = lambda **kw: fi.top_p_sampling_from_probs(probs(), top_p, **kw)  # noqa: E731
    elif kinds == {(False, False, True)}:
        name, matches = "min_p_sampling_from_probs", "temperature, min-p"
        call = lambda **kw: fi.min_p_sampling_from_probs(probs(), min_p, **kw)  # noqa: E731
    else:
        left = " (not min-p)" if any(m for _, _, m in kinds) else ""
        name, matches = "top_k_top_p_sampling_from_logits", f"temperature, top-k, top-p{left}"
        call = lambda **kw: fi.top_k_top_p_sampling_from_logits(  # noqa: E731
            logits.float() * inv_t, top_k, top_p, **kw)
    fixed = dict(deterministic=True, seed=1, offset=0)  # the same draws eagerly and replayed
    try:
        call(**fixed)
    except TypeError:  # a release without seed / offset: its own generator (no graph time)
        fixed = dict(deterministic=True)
    return name, matches, lambda: call(**fixed)


def _kept(logits: torch.Tensor, p: RowParams, mode) -> torch.Tensor:
    """(B, V) the rule's kept tokens; a greedy row keeps its argmax only."""
    z = penalised(logits, p, mode, None)
    top = z.max(dim=-1).values
    e = torch.exp((z - top[:, None]) * p.inv_t()[:, None])
    kept = keep_mask(z, e, keep_threshold(z, top, e, p, mode), p)
    argmax = torch.zeros_like(kept).scatter_(1, z.argmax(dim=-1, keepdim=True), True)
    return torch.where(p.sampling()[:, None], kept, argmax)


def grid_case(kind: str, batch: int, vocab: int, scale: float, device: torch.device):
    """One case: (bf16 logits randn * scale, seeded by it; the rows' settings; RowParams; mode)."""
    g = torch.Generator().manual_seed(batch * 7 + vocab)
    logits = (torch.randn(batch, vocab, generator=g) * scale).to(torch.bfloat16).to(device)
    settings = kind_settings(kind, batch)
    mode = choose_mode([t == 0 for t, *_ in settings], [k for _, k, _, _ in settings],
                       [False] * batch, vocab, top_p=[p_ for *_, p_, _ in settings],
                       min_p=[m for *_, m in settings])
    return logits, settings, grid_params(settings, device), mode


def _samplers(cfg: GridConfig, settings, logits: torch.Tensor, p: RowParams, mode):
    """name -> (call, matches, tokens() -> (B,) tensor) of the configured samplers."""
    b = logits.shape[0]
    last, out = (torch.zeros(n, dtype=torch.int64, device=logits.device) for n in (b, b))

    def step(m):
        def run():
            sample_step(logits, p, m, None, last, out)
            return out
        return run

    found = {"fused": ("fused_sampler.sample_step", "all", step(fused(mode))),
             "torch": ("sampler.sample_step", "all", step(mode)),
             "torch_sort": ("torch.sort", "all (top-k/top-p as sorted prefixes)",
                            lambda: sort_sample(logits, p))}
    if "flashinfer" in cfg.samplers and (call := flashinfer_call(settings, logits, p)):
        found["flashinfer"] = call
    return {name: found[name] for name in cfg.samplers if name in found}


def grid_rows(cfg: GridConfig, device: torch.device) -> list[SamplerGridRow]:
    cuda = device.type == "cuda"
    copy_gb_s = copy_bandwidth_gb_s(device, (1 << 30) if cuda else (64 << 20), cfg.timing)
    rows = []
    for vocab, batch, kind in itertools.product(cfg.vocabs, cfg.batches, cfg.kinds):
        logits, settings, p, mode = grid_case(kind, batch, vocab, cfg.logits_scale, device)
        samplers = _samplers(cfg, settings, logits, p, mode)
        kept = _kept(logits, p, mode)
        want = sample(logits, p, mode)[0]
        floor_s = logits.numel() * logits.element_size() / (copy_gb_s * 1e9)
        for name, (call, matches, fn) in samplers.items():
            tokens = fn().clone()
            in_kept = kept.gather(1, tokens.long()[:, None]).float().mean().item()
            agree = (tokens == want).float().mean().item() if name in ("fused", "torch") else NAN
            passes = _row_passes(logits, p, mode) if name == "fused" else -1
            _validate(name, kind, batch, vocab, in_kept, agree)
            wall_s, _, issued_s = median_times(fn, cuda, cfg.timing)
            device_s = graph_device_time(lambda fn=fn: (fn(),), cfg.timing) if cuda else wall_s
            best = issued_s if device_s != device_s else device_s
            rows.append(SamplerGridRow(name, call, matches, kind, batch, vocab, "bfloat16",
                                       device_s * 1e6, issued_s * 1e6, floor_s * 1e6,
                                       best / floor_s, copy_gb_s, in_kept, agree, passes,
                                       cfg.logits_scale))
        print(f"[bench] sampler_grid: {kind} batch {batch} vocab {vocab}: " + ", ".join(
            f"{r.sampler} {r.device_us:.0f} us" for r in rows[-len(samplers):]), flush=True)
    return rows


def _validate(name: str, kind: str, batch: int, vocab: int, in_kept: float, agree: float) -> None:
    """Raise unless the fused sampler and the plain sort keep their tokens in the rule's set
    and the fused sampler draws the torch sampler's tokens, but for a row or a tenth of them
    within float32 rounding of a boundary."""
    slack = max(1, batch // 10) / batch
    if (name in ("fused", "torch_sort") and in_kept < 1 - slack) or (
            name == "fused" and agree < 1 - slack):
        raise AssertionError(f"sampler_grid: {name} on {kind}, batch {batch}, vocab {vocab}: "
                             f"{in_kept:.1%} of its tokens in the rule's kept set, {agree:.1%} "
                             "equal to the torch sampler's")


def _row_passes(logits: torch.Tensor, p: RowParams, mode) -> int:
    from decodelab.engine import fused_sampler

    paths = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    fused_sampler.sample(logits, p, fused(mode), paths=paths)
    return int((paths == 2).sum().item())


def write_grid(device: torch.device, out_dir: Path, profile: str,
               cfg: GridConfig | None = None) -> list[Path]:
    """Measure the grid on ``device`` and write table ``sampler_grid``."""
    cfg = cfg or GridConfig.for_device(device)
    rows = grid_rows(cfg, device)
    print(f"[bench] sampler_grid: {len(rows)} rows", flush=True)
    return [write_table("sampler_grid", rows, out_dir=out_dir, config=cfg, profile=profile)]


def main(argv: list[str] | None = None) -> None:
    """``python -m decodelab.engine.bench.sampler_grid --out DIR [--device cuda|cpu]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the table")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    write_grid(torch.device(args.device), args.out, "gpu" if args.device == "cuda" else "cpu")


if __name__ == "__main__":
    main()
