"""Validation of ``bench runtime`` before anything is timed: the engine's greedy tokens against
a reference engine, and the engine's captured sampler against its eager body."""

from __future__ import annotations

import random
from dataclasses import replace

from decodelab.engine.bench.step_timing import steady_requests
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import Request, SamplingParams


def validate_engine(model, graphs, base: EngineConfig) -> float:
    """Greedy tokens of the engine with graphs vs the eager engine (a full bucket of 8 rows);
    on a CPU, of the engine vs its synchronous, dynamic-input variant. Returns the fraction
    of equal tokens; raises below 0.9 (a wiring bug breaks every row from its first step)."""
    rng = random.Random(1)
    reqs = [Request(f"v{i}", tuple(rng.randrange(model.config.vocab_size)
                                   for _ in range(rng.randint(5, 40))),
                    SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))
            for i in range(8)]
    other = (replace(base, use_graphs=False) if graphs is not None
             else replace(base, async_output=False, static_inputs=False))

    def tokens(ecfg):
        eng = Engine(model, ecfg, graphs)
        hs = [eng.submit(r) for r in reqs]
        eng.run()
        return [t for h in hs for t in h.tokens]

    a, b = tokens(base), tokens(other)
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
    if agree < 0.9:
        raise AssertionError(f"engine tokens agree with the reference on only {agree:.0%}")
    return agree


def validate_step_graphs(model, graphs, base: EngineConfig, batch: int, steps: int = 12) -> int:
    """The engine's captured sampler against its eager body, every decode step of a run with
    mixed rows (top-k/top-p/min-p, greedy, penalties): same logits and parameters, the same
    tokens and tables. Returns the steps checked; raises on the first disagreement."""
    eng = Engine(model, base, graphs)
    reqs = steady_requests(model.config.vocab_size, batch, 24, steps + 4)
    reqs[0] = replace(reqs[0], params=replace(reqs[0].params, temperature=0.0))
    reqs[1] = replace(reqs[1], params=replace(reqs[1].params, repetition_penalty=1.2,
                                                frequency_penalty=0.3))
    handles = [eng.submit(r) for r in reqs]
    sg = eng.runner.step_graphs
    checked = 0
    for _ in range(steps):
        eng.step()
        if sg.last is not None and eng.metrics.steps[-1].batch:
            if not sg.check(*sg.last):
                raise AssertionError(f"captured sampler disagrees with the eager one at {sg.last}")
            checked += 1
    for h in handles:
        h.abort()
    if not checked:
        raise AssertionError("no decode step reached the captured sampler")
    for (bucket, mode), sel in sg.selections.items():
        print(f"[bench] runtime: bucket {bucket}, k_cand {mode.k_cand}: two-stage selection "
              f"{sel['two_stage_us']:.0f} us, direct {sel['direct_us']:.0f} us -> "
              f"{'two-stage' if sel['chunk'] else 'direct'}", flush=True)
    if sg.failed:
        print(f"[bench] runtime: {sg.failed} step graph captures FAILED; those "
              "bodies ran eagerly (same tokens, more host time)", flush=True)
    return checked
