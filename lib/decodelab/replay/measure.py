"""Phase 2: what a CUDA-graph replay costs, and multi-step capture of the toy step.

Two measurements, both on a CUDA GPU (graphs do not exist on the CPU backend):

- ``replay_nodes``: a graph of n tiny kernels (an in-place add on one element) replayed back to
  back, and the same n kernels launched eagerly: wall, host-CPU and device time per replay (per
  call of n launches for eager), n = 1, 2, 4 ... 1024. Fitted by :mod:`decodelab.replay.fit`.
- ``replay_multistep``: K toy steps captured in one graph (state chained on the device), replayed
  N/K times per sample: wall, host and device time per step. Variant ``none`` replays back to
  back; variant ``readout`` also copies the K tokens to pinned host memory after every replay and
  waits for them, as a server that streams tokens to clients must.

Every K-step graph is checked against K eager steps (exact tokens, states within tolerance)
before it is timed. Within each sweep all graphs are built first and then timed in interleaved
rounds (:mod:`decodelab.replay.interleave`), so slow drift of the machine does not bias some points.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.device import require_cuda
from decodelab.core.profiles import PROFILES
from decodelab.core.timing import Timing, auto_inner, device_sync, summarize
from decodelab.core.validate import (
    ConfigError,
    check_choice,
    check_float,
    check_int,
    check_int_list,
)
from decodelab.replay.interleave import Point, time_interleaved
from decodelab.toy import graphs
from decodelab.toy import step as toy

VARIANTS = ("none", "readout")
MAX_NODES = 4096
MAX_K = 1024


@dataclass(frozen=True, slots=True)
class ReplayBenchConfig:
    """Sizes of the phase-2 sweeps. Every K must divide ``steps_per_sample`` (N).

    ``repeats`` is the number of interleaved rounds: each point of a sweep gets one sample per
    round, and its statistics are over rounds.
    """

    node_counts: tuple[int, ...] = tuple(1 << i for i in range(11))  # 1 .. 1024
    k_values: tuple[int, ...] = tuple(1 << i for i in range(9))  # 1 .. 256
    configs: tuple[str, ...] = ("ultra-light", "h256", "medium")
    steps_per_sample: int = 512
    repeats: int = 20
    warmup: int = 2
    node_sample_ms: float = 4.0  # target wall time of one node-benchmark sample

    def __post_init__(self) -> None:
        owner = "ReplayBenchConfig"
        check_int_list(owner, "node_counts", list(self.node_counts), 1, MAX_NODES)
        check_int_list(owner, "k_values", list(self.k_values), 1, MAX_K)
        for name in ("node_counts", "k_values"):
            values = getattr(self, name)
            if len(set(values)) < 3:
                raise ConfigError(f"{owner}.{name}={list(values)!r}: needs at least 3 distinct "
                                  "values (a line fit with a confidence interval)")
        check_int(owner, "steps_per_sample", self.steps_per_sample, 1, 1 << 20)
        for k in self.k_values:
            if self.steps_per_sample % k:
                raise ConfigError(f"{owner}.k_values: K={k} does not divide steps_per_sample="
                                  f"{self.steps_per_sample} (each sample replays N/K graphs)")
        if not self.configs:
            raise ConfigError(f"{owner}.configs: must name at least one toy config")
        for name in self.configs:
            check_choice(owner, "configs[]", name, tuple(toy.NAMED_CONFIGS))
        check_int(owner, "repeats", self.repeats, 3, 10_000)
        check_int(owner, "warmup", self.warmup, 0, 10_000)
        check_float(owner, "node_sample_ms", self.node_sample_ms, 0.0, 1e4, low_open=True)

    @classmethod
    def for_profile(cls, profile: str) -> ReplayBenchConfig:
        """The sweeps of ``profile``, all on the GPU (graphs need one): ``gpu`` the full ones
        (the field defaults), ``cpu`` and ``smoke`` fewer and shorter."""
        check_choice("ReplayBenchConfig", "profile", profile, PROFILES)
        if profile == "smoke":
            return cls(node_counts=(1, 2, 4, 8), k_values=(1, 2, 4, 8), configs=("ultra-light",),
                       steps_per_sample=16, repeats=3, warmup=1, node_sample_ms=0.5)
        if profile == "cpu":
            return cls(node_counts=tuple(1 << i for i in range(9)),
                       k_values=tuple(1 << i for i in range(7)), configs=("ultra-light", "h256"),
                       steps_per_sample=128, repeats=7, warmup=1, node_sample_ms=2.0)
        return cls()


def _stats(prefix: str, samples, scale: float) -> dict[str, float]:
    s = summarize(samples).scaled(scale)
    return {prefix: s.median, f"{prefix}_q1": s.q1, f"{prefix}_q3": s.q3,
            f"{prefix}_ci_low": s.ci_low, f"{prefix}_ci_high": s.ci_high}


def _timing_columns(t: Timing, scale: float, suffix: str = "") -> dict[str, float]:
    """wall/host/device medians, quartiles and CIs in µs, times ``scale`` per call."""
    out = {}
    for name, samples in (("wall", t.wall), ("host", t.host), ("device", t.device)):
        out |= _stats(f"{name}_us{suffix}", samples, 1e6 * scale)
    return out


# --------------------------------------------------------------------------- replay vs nodes


def graph_of_adds(n: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A graph of ``n`` in-place adds on one fp32 element (n dependent tiny kernels)."""
    check_int("graph_of_adds", "n", n, 1, MAX_NODES)
    require_cuda("the replay bench (CUDA graphs)")
    x = torch.zeros(1, device="cuda")
    warm_up(lambda: x.add_(1.0))
    graph, _ = capture(lambda: [x.add_(1.0) for _ in range(n)])
    return graph, x


def _check_adds(graph: torch.cuda.CUDAGraph, x: torch.Tensor, n: int) -> None:
    x.zero_()
    graph.replay()
    if float(x.item()) != float(n):
        raise RuntimeError(f"graph of {n} adds produced {x.item()}, expected {n}")


def _inner_for(fn, cfg: ReplayBenchConfig) -> int:
    return auto_inner(fn, target_s=cfg.node_sample_ms * 1e-3, sync=device_sync)


def _eager_adds(n: int, x: torch.Tensor):
    def eager() -> None:
        for _ in range(n):
            x.add_(1.0)
    return eager


def measure_nodes(cfg: ReplayBenchConfig) -> list[dict]:
    """Rows of table ``replay_nodes``: per graph replay / per call of n eager launches.

    All graphs are built and checked first; then graph and eager points are timed together in
    interleaved rounds (:mod:`decodelab.replay.interleave`), one sample per point per round.
    """
    require_cuda("the replay bench (CUDA graphs)")
    points = {}  # the bound replay methods keep the graphs alive, the closures their buffers
    for n in cfg.node_counts:
        graph, x = graph_of_adds(n)
        _check_adds(graph, x, n)
        points[("graph", n)] = Point(graph.replay, _inner_for(graph.replay, cfg))
        eager = _eager_adds(n, x)
        points[("eager", n)] = Point(eager, _inner_for(eager, cfg))
    timings = time_interleaved(points, cfg.repeats, cfg.warmup)
    return [{"kind": kind, "n_kernels": n, "inner": points[(kind, n)].inner,
             "repeats": cfg.repeats, **_timing_columns(t, 1.0)}
            for (kind, n), t in timings.items()]


# --------------------------------------------------------------------------- multi-step capture


def validate_captured(weights: toy.ToyWeights, starts: list[torch.Tensor],
                      captured: graphs.CapturedSteps) -> float:
    """A replay from each start state must give exactly the tokens of K eager steps, and states
    within tolerance (several starts prove no state was frozen at capture). Returns the largest
    state error; raises RuntimeError on a mismatch."""
    k = captured.k_steps
    worst = 0.0
    for start in starts:
        captured.reset(start)
        captured.replay()
        ref = toy.run_eager(weights, start, k)
        got = captured.state.tokens
        if not torch.equal(got, ref.tokens):
            bad = int((got != ref.tokens).any(dim=1).nonzero()[0])
            raise RuntimeError(f"K={k}: graph token differs from eager at step {bad}")
        err = float((captured.state.x - ref.states[-1]).abs().max())
        tol = toy.state_tolerance(ref.states[-1], start.dtype)
        if err > tol:
            raise RuntimeError(f"K={k}: graph state differs from eager by {err:.3g} > {tol:.3g}")
        worst = max(worst, err)
    return worst


def _readout(captured: graphs.CapturedSteps):
    """Replay, copy the K tokens into pinned host memory, wait until the host has them."""
    host = torch.empty(captured.state.tokens.shape, dtype=torch.int64, pin_memory=True)
    done = torch.cuda.Event()

    def replay_and_read() -> None:
        captured.replay()
        host.copy_(captured.state.tokens, non_blocking=True)
        done.record()
        done.synchronize()

    return replay_and_read


def measure_multistep(cfg: ReplayBenchConfig, name: str) -> list[dict]:
    """Rows of table ``replay_multistep`` for one named toy config.

    Every K-step graph is captured and validated first; then all (K, variant) points are timed
    together in interleaved rounds, one sample of N/K replays per point per round.
    """
    require_cuda("the replay bench (CUDA graphs)")
    tc = toy.named(name)
    weights = toy.make_weights(tc, "cuda")
    x0 = toy.initial_state(tc, "cuda")
    starts = [x0, toy.initial_state(tc, "cuda", seed=tc.seed + 1000)]
    captured, capture_s, errors, points = {}, {}, {}, {}
    for k in cfg.k_values:
        t0 = time.perf_counter()
        captured[k] = graphs.CapturedSteps(weights, x0, k)
        torch.cuda.synchronize()
        capture_s[k] = time.perf_counter() - t0
        errors[k] = validate_captured(weights, starts, captured[k])
        captured[k].reset(x0)
        replays = cfg.steps_per_sample // k
        points[(k, "none")] = Point(captured[k].replay, replays)
        points[(k, "readout")] = Point(_readout(captured[k]), replays)
    timings = time_interleaved(points, cfg.repeats, cfg.warmup)
    rows = []
    for k in cfg.k_values:
        for variant in VARIANTS:
            t = timings[(k, variant)]
            rows.append({
                "config": name, "hidden": tc.hidden, "layers": tc.layers, "batch": tc.batch,
                "vocab": tc.vocab, "dtype": tc.dtype, "variant": variant, "k_steps": k,
                "steps_per_sample": cfg.steps_per_sample,
                "replays_per_sample": cfg.steps_per_sample // k, "repeats": cfg.repeats,
                **_timing_columns(t, 1.0 / k, "_per_step"),
                "wall_us_per_replay": summarize(t.wall).median * 1e6,
                "capture_s": capture_s[k], "validated": True, "max_state_err": errors[k],
            })
    del captured, points
    torch.cuda.empty_cache()
    return rows
