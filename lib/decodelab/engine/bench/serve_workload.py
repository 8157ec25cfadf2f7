"""The request lists of ``bench serve``, defined exactly (seeded; imports no torch).

Offline (:class:`OfflineWorkload`, every request submitted at time 0), nano-vllm's benchmark
(``bench.py`` of GeeeekExplorer/nano-vllm: 256 requests, prompt and output lengths uniform
integers in [100, 1024], random prompt token ids, temperature 0.6, ``ignore_eos``, as many
new tokens as the output length), drawn in its order from one ``random.Random(seed)``::

    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(*prompt_len))]
               for _ in range(num_requests)]
    outputs = [rng.randint(*output_len) for _ in range(num_requests)]

With ``num_requests=256``, ``prompt_len=output_len=(100, 1024)`` and ``seed=0`` these are the
numbers nano-vllm's ``seed(0)`` + ``randint`` draw (its global generator is a
``random.Random(0)``). Token ids are used as drawn where the model's vocabulary holds them
(Llama-3.2-1B: 128,256) and taken modulo the vocabulary where it is smaller (the tiny model:
512), so that the lengths stay those of the same stream. The long-prompt workload is the same
draw with other ranges and seed (the GPU profile: prompts 2,048-8,192, outputs 128-512).

Online (:class:`OnlineSweep`): the offline workload's requests, in order, arriving as a Poisson
process at each rate r: the first at time 0, then after gaps ``g_i / r`` where the
``g_i = Random(seed).expovariate(1.0)`` are one unit-rate stream, the same at every rate (the
runs differ in their rate only). A run takes the requests that arrive before ``max_arrival_s``,
at most ``max_requests``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from decodelab.core.validate import ConfigError, check_float, check_int

TOKEN_HIGH = 10000  # nano-vllm's prompt token ids: randint(0, 10000)


@dataclass(frozen=True, slots=True)
class ServeRequest:
    """One request of a run: its prompt, how many tokens it asks for, when it arrives (s)."""

    prompt: tuple[int, ...]
    output_len: int
    arrival_s: float = 0.0


def _check_range(owner: str, name: str, value, low: int) -> None:
    if (not isinstance(value, tuple) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"{owner}.{name}={value!r}: must be a pair (low, high) of integers")
    lo, hi = value
    if lo < low or hi < lo:
        raise ConfigError(f"{owner}.{name}={value!r}: must satisfy {low} <= low <= high")


@dataclass(frozen=True, slots=True)
class OfflineWorkload:
    """Requests all submitted at once; lengths uniform integers in the closed ranges."""

    name: str
    num_requests: int
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    seed: int = 0
    temperature: float = 0.6

    def __post_init__(self) -> None:
        own = f"OfflineWorkload[{self.name!r}]"
        check_int(own, "num_requests", self.num_requests, 1, 100_000)
        _check_range(own, "prompt_len", self.prompt_len, 1)
        _check_range(own, "output_len", self.output_len, 1)
        check_int(own, "seed", self.seed, 0)
        check_float(own, "temperature", self.temperature, 0.0, 100.0)

    @property
    def max_context(self) -> int:
        """The longest prompt + output a request of this workload can have."""
        return self.prompt_len[1] + self.output_len[1]

    def requests(self, vocab_size: int) -> list[ServeRequest]:
        """The requests (module docstring), token ids below ``vocab_size``."""
        check_int("OfflineWorkload.requests", "vocab_size", vocab_size, 2)
        rng = random.Random(self.seed)
        prompts = [[rng.randint(0, TOKEN_HIGH) for _ in range(rng.randint(*self.prompt_len))]
                   for _ in range(self.num_requests)]
        outputs = [rng.randint(*self.output_len) for _ in range(self.num_requests)]
        wrap = vocab_size <= TOKEN_HIGH
        return [ServeRequest(tuple(t % vocab_size for t in p) if wrap else tuple(p), n)
                for p, n in zip(prompts, outputs, strict=True)]


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times (s) at ``rate`` requests/s: 0, then the seeded unit-rate gaps / rate."""
    check_int("poisson_arrivals", "n", n, 1)
    check_float("poisson_arrivals", "rate", rate, 0.0, float("inf"), low_open=True,
                high_open=True)
    rng, t, out = random.Random(seed), 0.0, [0.0]
    for _ in range(n - 1):
        t += rng.expovariate(1.0) / rate
        out.append(t)
    return out


@dataclass(frozen=True, slots=True)
class OnlineSweep:
    """Open-loop runs at ``rate_fractions`` x the offline request rate measured in the same
    bench, each capped at ``max_requests`` requests arriving within ``max_arrival_s``."""

    rate_fractions: tuple[float, ...]
    max_requests: int
    max_arrival_s: float
    seed: int = 1

    def __post_init__(self) -> None:
        own = "OnlineSweep"
        if not isinstance(self.rate_fractions, tuple) or not self.rate_fractions:
            raise ConfigError(f"{own}.rate_fractions={self.rate_fractions!r}: must be a "
                              "non-empty tuple of numbers in (0, 100]")
        for f in self.rate_fractions:
            check_float(own, "rate_fractions[]", f, 0.0, 100.0, low_open=True)
        check_int(own, "max_requests", self.max_requests, 1, 100_000)
        check_float(own, "max_arrival_s", self.max_arrival_s, 0.0, 3600.0, low_open=True)
        check_int(own, "seed", self.seed, 0)

    def requests(self, base: list[ServeRequest], rate: float) -> list[ServeRequest]:
        """``base``'s first requests with their arrival times at ``rate`` requests/s."""
        if not base:
            raise ConfigError("OnlineSweep.requests: base workload has no requests; must "
                              "have at least 1")
        arrivals = poisson_arrivals(min(self.max_requests, len(base)), rate, self.seed)
        return [ServeRequest(r.prompt, r.output_len, t)
                for r, t in zip(base, arrivals, strict=False) if t < self.max_arrival_s]


def warmup_requests(n: int, prompt_len: int, vocab_size: int, *, longest: int = 0,
                    seed: int = 2) -> list[ServeRequest]:
    """``n`` requests of ``prompt_len`` to ``prompt_len + 16`` random tokens (kernels that
    specialise on a length's divisibility meet every residue here) asking for 2, 2, 3, 3, ...
    tokens (request i: 2 + i // 2): the decode batch shrinks from ``n`` rows to 1 through every
    size, so each graph bucket's step graphs are captured here, not in a measured run. With
    ``longest``, one more request of that many prompt tokens asking for 2 (the longest
    prefill to come)."""
    check_int("warmup_requests", "n", n, 1)
    check_int("warmup_requests", "prompt_len", prompt_len, 1)
    check_int("warmup_requests", "longest", longest, 0)
    rng = random.Random(seed)
    shapes = [(prompt_len + i % 17, 2 + i // 2) for i in range(n)]  # (prompt, output) lengths
    if longest:
        shapes.append((longest, 2))
    return [ServeRequest(tuple(rng.randrange(vocab_size) for _ in range(m)), out)
            for m, out in shapes]
