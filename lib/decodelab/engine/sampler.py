"""One batched sampler, per-row parameters held in device tensors, no host synchronisation.

Per row (one request): penalties, then greedy (exact argmax) or temperature -> top-k -> top-p
-> min-p -> inverse-CDF draw. The filters are all *prefix* masks of the candidates sorted by
logit, so one cumulative sum of ``exp(logit - max)`` serves them all and the draw:

    e_j   = exp((z_j - z_0) / T)              candidates sorted, z_0 the row maximum
    c_j   = e_0 + ... + e_j                   (one cumsum; prefix values do not depend on how
                                               many candidates follow, i.e. on the batch mix)
    keep  = j < top_k  and  c_{j-1} < top_p * c_{k-1}  and  e_j >= min_p   (a prefix)
    token = candidate[#{j < n_keep : c_j < u * c_{n_keep-1}}]

The uniform ``u`` of a row is a counter-based hash of (request seed, index of the token in the
request's output), computed on the host with the row's other inputs (:func:`row_uniforms`):
a request's random stream is the same whatever else shares its batch, and drawing it needs no
generator state on the device and no synchronisation.

Candidates come from partial selection (``torch.topk`` with the batch's largest top-k rounded
up to a power of two) when every sampling row has a top-k, else from a full sort; for a large
vocabulary the selection is two-stage over chunks of it (:func:`candidates`). Without greedy
rows in the batch the row maximum is the first candidate, so no separate pass over the
vocabulary finds it. All are timed by ``bench_engine``.

:func:`sample_step` is the whole step the engine runs (sampling, the last-token scatter, the
penalty counts, one packed output row); it allocates nothing the caller must keep, so the
engine captures it in a CUDA graph per batch bucket and mode (``step_graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_M32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer avalanche hash (uint64 lanes holding 32-bit values)."""
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    x = ((x >> np.uint64(16)) ^ x) * np.uint64(0x45D9F3B) & _M32
    return (x >> np.uint64(16)) ^ x


def seed_keys(seeds: np.ndarray) -> np.ndarray:
    """The per-request half of the hash (computed once, at admission): uint64 lanes."""
    s = seeds.astype(np.uint64)
    return _mix32((s & _M32) ^ _mix32((s >> np.uint64(32)) ^ np.uint64(0x9E3779B9)))


def key_uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, from a seed key and a token counter."""
    c = counters.astype(np.uint64)
    h = _mix32(keys ^ _mix32((c & _M32) ^ np.uint64(0x85EBCA6B)))
    h = _mix32(h ^ (c >> np.uint64(32)))
    return (((h >> np.uint64(8)).astype(np.float64) + 0.5) / 2.0**24).astype(np.float32)


def row_uniforms(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float32, one per row, a pure function of (seed, counter)."""
    return key_uniforms(seed_keys(seeds), counters)


@dataclass(frozen=True, slots=True)
class SamplerMode:
    """What the host knows about a batch's rows without looking at the device."""

    all_greedy: bool
    penalties: bool
    k_cand: int  # candidates by partial selection; 0 = full sort
    # some rows are greedy: their exact argmax needs its own full-vocabulary pass (without
    # greedy rows the first candidate gives the row maximum, one pass fewer)
    any_greedy: bool = True
    # > 0: candidates by two-stage selection over chunks of this many tokens (large vocabularies)
    chunk: int = 0


def choose_mode(greedy: list[bool], top_k: list[int], penalties: list[bool], vocab: int,
                max_partial: int = 1024) -> SamplerMode:
    sampling_k = [k for g, k in zip(greedy, top_k, strict=True) if not g]
    return mode_of(not sampling_k, any(penalties), min(sampling_k, default=0),
                   max(sampling_k, default=0), vocab, max_partial, any_greedy=any(greedy))


def mode_of(all_greedy: bool, penalties: bool, min_k: int, max_k: int, vocab: int,
            max_partial: int = 1024, *, any_greedy: bool = True) -> SamplerMode:
    """The mode from the sampling rows' smallest and largest top-k (0 = a row without one)."""
    k_cand = 0
    if not all_greedy and min_k > 0:
        # a few shapes, not one per top-k value; strictly more candidates than any row keeps,
        # so a tie at a row's k-th candidate is resolved inside the candidate set
        k = 1 << max_k.bit_length()
        k_cand = min(k, vocab) if k <= max_partial else 0
    return SamplerMode(all_greedy, penalties, k_cand, any_greedy or all_greedy,
                       chunk_for(vocab, k_cand))


CHUNK = 64
MIN_CHUNKED_VOCAB = 32768


def chunk_for(vocab: int, k_cand: int) -> int:
    """Two-stage selection where it reads the vocabulary once and keeps few chunks: a large
    vocabulary that CHUNK divides, with at most a quarter of it in the kept chunks."""
    if k_cand and vocab >= MIN_CHUNKED_VOCAB and vocab % CHUNK == 0 and 4 * k_cand * CHUNK <= vocab:
        return CHUNK
    return 0


def inv_temperature(temperature: np.ndarray) -> np.ndarray:
    """float32 1 / T, 1 where T == 0 (greedy): IEEE float32 division, as on the device."""
    t = np.asarray(temperature, dtype=np.float32)
    return np.float32(1.0) / np.where(t > 0, t, np.float32(1.0))


NO_TOP_K = 1 << 31  # the device-side top-k of a row without one: more than any vocabulary


def device_top_k(top_k: int) -> int:
    return top_k if top_k > 0 else NO_TOP_K


@dataclass(slots=True)
class RowParams:
    """Per-row sampling inputs on the device, (B,) each (views of the engine's static buffers)."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_k: torch.Tensor  # int64; rows without a top-k hold NO_TOP_K (clamped to the candidates)
    top_p: torch.Tensor  # float32
    min_p: torch.Tensor  # float32
    repetition: torch.Tensor  # float32
    presence: torch.Tensor  # float32
    frequency: torch.Tensor  # float32
    uniform: torch.Tensor  # float32, from row_uniforms
    slot: torch.Tensor  # int64 row -> slot of the penalty tables
    # float32 1 / temperature (1 for greedy rows), from ``inv_temperature`` on the host:
    # three device ops fewer per step; None: computed on the device
    inv_temperature: torch.Tensor | None = None


@dataclass(slots=True)
class PenaltyState:
    """Token statistics per slot for the penalties: (S, V) each."""

    counts: torch.Tensor  # int32: occurrences in the output
    in_prompt: torch.Tensor  # bool

    @classmethod
    def empty(cls, num_slots: int, vocab: int, device: torch.device) -> PenaltyState:
        return cls(torch.zeros(num_slots, vocab, dtype=torch.int32, device=device),
                   torch.zeros(num_slots, vocab, dtype=torch.bool, device=device))

    def reset_slot(self, slot: int, prompt: torch.Tensor, output: torch.Tensor) -> None:
        """Rebuild one slot from a (re)admitted request's tokens (device int64 tensors)."""
        self.counts[slot].zero_()
        self.in_prompt[slot].zero_()
        self.in_prompt[slot].index_fill_(0, prompt, True)
        if output.numel():
            self.counts[slot].index_add_(0, output, torch.ones_like(output, dtype=torch.int32))

    def record(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """counts[slot_r, token_r] += 1 for every row (padding rows point at a spare slot).
        A flat ``index_add_`` (atomic adds on a GPU): no sort, and capturable in a graph."""
        flat = slots * self.counts.shape[1] + tokens
        self.counts.view(-1).index_add_(0, flat, torch.ones_like(tokens, dtype=torch.int32))


def apply_penalties(z: torch.Tensor, p: RowParams, state: PenaltyState) -> torch.Tensor:
    """z (B, V) float32 -> penalised copy."""
    counts = state.counts.index_select(0, p.slot).to(torch.float32)  # (B, V)
    seen = (counts > 0) | state.in_prompt.index_select(0, p.slot)
    rep = p.repetition[:, None]
    z = torch.where(seen, torch.where(z > 0, z / rep, z * rep), z)
    return z - p.frequency[:, None] * counts - p.presence[:, None] * (counts > 0).to(z.dtype)


def sample(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
           penalties: PenaltyState | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) -> (tokens (B,) int64, bad (B,) bool: the row's maximum is not finite,
    i.e. it holds a NaN or +inf, or nothing but -inf)."""
    z = logits
    if mode.penalties and penalties is not None:
        z = apply_penalties(z.float(), p, penalties)
    if mode.all_greedy or mode.any_greedy:
        top, greedy_tok = z.max(dim=-1)  # NaN propagates into the maximum; first index on ties
        bad = ~torch.isfinite(top)
        if mode.all_greedy:
            return greedy_tok.masked_fill_(bad, 0), bad
    vals, idx = candidates(z, mode.k_cand, mode.chunk)
    if not mode.any_greedy:
        # the first candidate is the row maximum (NaN sorts first in ``topk`` and ``sort``)
        bad = ~torch.isfinite(vals[:, 0])
    tokens = _draw(vals.float(), idx, p)
    if mode.any_greedy:
        tokens = torch.where(p.temperature > 0, tokens, greedy_tok)
    return tokens.masked_fill_(bad, 0), bad


def sample_step(logits: torch.Tensor, p: RowParams, mode: SamplerMode, penalties: PenaltyState,
                last_token: torch.Tensor, out: torch.Tensor) -> None:
    """One step's sampling with its bookkeeping, all on the device (the body the engine runs
    eagerly or captures in a CUDA graph): sample, scatter each row's token into
    ``last_token[slot]`` (the next step's input), count it for the penalties, and write
    ``out`` (B,) int64: the token, or -1 for a row whose logits were not finite (one array
    for the host to copy)."""
    tokens, bad = sample(logits, p, mode, penalties)
    last_token.index_copy_(0, p.slot, tokens)
    if mode.penalties:
        penalties.record(p.slot, tokens)
    out.copy_(tokens).masked_fill_(bad, -1)


def candidates(z: torch.Tensor, k_cand: int, chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, token ids) (B, K) by value descending, ties by token id ascending.

    The tie order is fixed so that partial selection and the full sort yield the same
    candidates in the same order (bf16-rounded logits tie often): the selected ids are sorted,
    then stably by value (``topk``'s own order is unspecified, so it is not asked for).

    With ``chunk``, selection is two-stage: the maximum of each chunk of ``chunk`` tokens
    (one pass over the vocabulary, many outputs: the whole device works), the K chunks with
    the largest maxima, then the top K of those chunks' K * chunk tokens. Exact: a token of
    the top K whose chunk is not among the K best chunks would have K larger chunk maxima,
    i.e. K larger tokens, above it. Both selections are small per-row problems, where one
    block per row is fast, instead of a multi-pass selection over the whole vocabulary."""
    if not k_cand:
        return torch.sort(z, dim=-1, descending=True, stable=True)
    b, v = z.shape
    k = min(k_cand, v)
    if chunk:
        best = z.view(b, v // chunk, chunk).amax(dim=-1)  # (B, V / chunk); NaN propagates
        top = torch.topk(best, k, dim=-1, sorted=False).indices  # (B, K) chunk numbers
        pos = (top[:, :, None] * chunk + torch.arange(chunk, device=z.device)).view(b, k * chunk)
        idx = pos.gather(1, torch.topk(z.gather(1, pos), k, dim=-1, sorted=False).indices)
    else:
        idx = torch.topk(z, k, dim=-1, sorted=False).indices
    idx = idx.sort(dim=-1).values
    vals, perm = z.gather(1, idx).sort(dim=-1, descending=True, stable=True)
    return vals, idx.gather(1, perm)


def _draw(vals: torch.Tensor, idx: torch.Tensor, p: RowParams) -> torch.Tensor:
    """vals/idx (B, K) sorted descending -> one token per row (see the module docstring).

    Every filter keeps a prefix, so each is a count and the kept prefix is their minimum:
    positions past top-k have c_{j-1} >= c_{k-1}, so the top-p count never reaches them,
    and e_0 == 1 keeps at least the first candidate in both counts. Few, fused-friendly ops:
    this runs on the critical path of every step."""
    n_cand = vals.shape[1]
    inv_t = p.inv_temperature
    if inv_t is None:
        inv_t = torch.where(p.temperature > 0, p.temperature, 1.0).reciprocal_()
    inv_t = inv_t[:, None]
    e = torch.exp((vals - vals[:, :1]) * inv_t)  # (B, K), e[:, 0] == 1
    c = e.cumsum(dim=-1)
    total_k = c.gather(1, p.top_k.clamp(max=n_cand)[:, None] - 1)  # (B, 1) mass of the top-k
    # Counts past the first candidate (always kept: c_{-1} = 0 < top_p * total_k and
    # e_0 = 1 >= min_p), so the last kept index is their minimum, in [0, K-1] for any row
    # (a NaN row included): top-p keeps j >= 1 while c_{j-1} < top_p * total_k, min-p while
    # e_j >= min_p.
    n_p = (c[:, :-1] < p.top_p[:, None] * total_k).sum(dim=-1, keepdim=True)
    n_m = (e[:, 1:] >= p.min_p[:, None]).sum(dim=-1, keepdim=True)
    last = torch.minimum(n_p, n_m)  # (B, 1)
    choice = (c < p.uniform[:, None] * c.gather(1, last)).sum(dim=-1, keepdim=True)
    return idx.gather(1, torch.minimum(choice, last)).squeeze(1)
