"""Offered load against capacity in chapter 04b's Poisson workload (table ``runtime_requests``):
why its time to first token is seconds while a decode step is a millisecond or so.

A workload offers ``arrival_rate`` requests per second (Poisson) until ``n`` have arrived, about
``n / rate`` seconds; the engine served them in ``workload_s``, so it served ``n / workload_s``
requests per second at that mix of prompts and outputs. Where the offer exceeds that rate a
queue builds: a request's time to first token is then mostly its wait in the queue, and its
time per output token is a share of steps that also prefill the prompts arriving behind it, not
the steady decode step (table ``runtime``, variant engine) a full batch would run. Pandas only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from decodelab.analysis.layers import MissingData, Tables, selector_of


@dataclass(frozen=True, slots=True)
class Load:
    """One origin's workload: what it offered, what the engine served, what clients saw."""

    requests: int
    offered_per_s: float  # arrival rate (Poisson), requests/s
    served_per_s: float  # requests / the workload's wall time
    arrivals_s: float  # n / rate: about when the last request arrived
    workload_s: float  # first arrival to last token
    output_tok_s: float  # output tokens/s the engine delivered
    ttft_median_s: float
    tpot_median_ms: float
    step_us: float  # the steady decode step of the engine (runtime table), NaN if absent
    step_batch: int  # its batch
    source: str

    @property
    def overload(self) -> float:
        """Offered / served request rate: above 1 a queue builds."""
        return self.offered_per_s / self.served_per_s


def load_of(tables: Tables) -> Load:
    """The workload of the tables' origin (MissingData where it was not run)."""
    req = tables.frame("runtime_requests", ["arrival_rate", "workload_s", "ttft_ms", "tpot_ms",
                                            "throughput_tok_s"])
    src = selector_of("runtime_requests", tables.origin, {})
    n, rate, span = len(req), float(req["arrival_rate"].iloc[0]), float(req["workload_s"].iloc[0])
    if not (rate > 0 and span > 0):
        raise MissingData(f"{src} records no arrival rate or workload time")
    step, batch = math.nan, 0
    try:
        row, _ = tables.one("runtime", {"variant": "engine"}, ["wall_us", "batch"])
        step, batch = float(row["wall_us"]), int(row["batch"])
    except MissingData:
        pass
    return Load(n, rate, n / span, n / rate, span, float(req["throughput_tok_s"].iloc[0]),
                float(req["ttft_ms"].median()) / 1e3, float(req["tpot_ms"].median()), step,
                batch, src)


def load_text(load: Load) -> str:
    """The workload's latencies explained by its load, in a few sentences."""
    text = (f"The Poisson workload of chapter 04b offered {load.offered_per_s:g} requests/s "
            f"({load.requests} requests, the last arriving after about {load.arrivals_s:.2g} s); "
            f"the engine served them in {load.workload_s:.3g} s, {load.served_per_s:.3g} "
            f"requests/s ({load.output_tok_s:,.0f} output tokens/s) at that mix of prompts and "
            "outputs")
    if load.overload <= 1:
        return text + (f": the offer is within what it serves, so time to first token "
                       f"(median {load.ttft_median_s * 1e3:,.0f} ms) is prefill and a short "
                       "wait, not a queue.")
    wait = ("mostly waiting behind the requests that arrived first, and says how far the "
            "offer exceeds the capacity, not how fast a step is" if load.overload > 2 else
            "in part waiting behind the requests that arrived first")
    ttft = (f"{load.ttft_median_s:.2g} s" if load.ttft_median_s >= 1
            else f"{load.ttft_median_s * 1e3:.3g} ms")
    text += (f". The offer is {load.overload:.1f}x what it serves, so a queue builds: the median "
             f"time to first token, {ttft}, is {wait}")
    if math.isfinite(load.step_us):
        rate = load.step_batch / (load.step_us * 1e-6)
        text += (f". Its median time per output token is {load.tpot_median_ms:.3g} ms where "
                 f"the engine's steady decode step takes {load.step_us / 1e3:.3g} ms at batch "
                 f"{load.step_batch} ({rate:,.0f} tokens/s if every step decoded a full batch, "
                 f"against the {load.output_tok_s:,.0f} served): the steps of this workload "
                 "also prefill the prompts arriving behind each request, the only other work "
                 "a step does")
    return text + "."


def loads(frames: dict[str, pd.DataFrame]) -> dict[str, Load]:
    """Each origin's workload among stored frames (``runtime_requests``, ``runtime``; every
    origin), by origin."""
    out = {}
    for origin in dict.fromkeys(frames["runtime_requests"]["origin"]):
        try:
            out[str(origin)] = load_of(Tables(frames, str(origin)))
        except MissingData:
            continue
    return out


LOAD_LABELS = {"origin": "source", "requests": "requests", "offered_per_s": "offered (req/s)",
               "served_per_s": "served (req/s)", "overload": "offered / served",
               "ttft_median_s": "median TTFT (s)", "tpot_median_ms": "median TPOT (ms)",
               "step_us": "steady decode step (µs)"}


def load_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per origin of the stored workloads: offered and served rate, their ratio, the
    median latencies and the steady decode step they are read against."""
    rows = [{"origin": origin, "requests": x.requests, "offered_per_s": x.offered_per_s,
             "served_per_s": x.served_per_s, "overload": x.overload,
             "ttft_median_s": x.ttft_median_s, "tpot_median_ms": x.tpot_median_ms,
             "step_us": x.step_us} for origin, x in loads(frames).items()]
    return pd.DataFrame(rows, columns=list(LOAD_LABELS))
