"""One batched sampler, per-row parameters held in device tensors, no host synchronisation.

Per row (one request): penalties, then greedy (exact argmax, first index on ties) or
temperature -> top-k -> top-p -> min-p -> draw, in transformers' order. Every filter keeps the
tokens whose (penalised) logit reaches a threshold, so a tie group is kept or dropped whole
and the kept set does not depend on how ties happen to be ordered:

    e_j   = exp((z_j - z_max) / T)             1 for the row maximum
    tau_k = the k-th largest z, counted with multiplicity   (every token tied with it kept)
    tau_p = the smallest z whose tokens have, strictly above them in the top-k set, a mass
            < top_p * (mass of the top-k set)               (a whole tie group or none)
    keep  = z_j >= max(tau_k, tau_p)  and  e_j >= min_p     (min-p last: transformers' order)
    token = the first id j with  e_0 + ... + e_j (kept tokens, in token-id order)
            >= u * (their sum)

A token is kept iff transformers keeps it under some order of the tied tokens (its top-k keeps
every token tied with the k-th; its top-p keeps the first of a tie group in its sort order iff
the mass above the group is below top_p, so this keeps the whole group). The draw runs in
token-id order, so neither the sort nor the selection of candidates can change which token a
uniform picks: with the same logits a row samples the same token alone or in any batch.

The uniform ``u`` of a row is a counter-based hash of (request seed, index of the token in the
request's output), computed on the host with the row's other inputs (:func:`row_uniforms`):
a request's random stream is the same whatever else shares its batch. A temperature below
``GREEDY_BELOW`` (``SamplingParams.greedy``, the one test, in float32) is greedy; the device
reads the row's ``greedy`` word.

A batch's rows arrive as :class:`RowParams`: the packed per-row block that
``row_sampling.RowSampling`` declares, with a named view of each field.

This module is the plain-torch reference (CPU and any device); ``fused_sampler`` computes the
same rule in Triton kernels without sorting the vocabulary, selected by ``SamplerMode.fused``.
:func:`sample_step` is the whole step the engine runs (sampling, the last-token scatter, the
penalty counts, one packed output row); it allocates nothing the caller must keep, so the
engine captures it in a CUDA graph per batch bucket and mode (``step_graphs``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from decodelab.core.validate import ConfigError
from decodelab.engine.randomness import key_uniforms, row_uniforms, seed_keys
from decodelab.engine.row_sampling import RowParams

# the engine's inputs read these here
__all__ = ["RowParams", "key_uniforms", "row_uniforms", "seed_keys"]


@dataclass(frozen=True, slots=True)
class SamplerMode:
    """What the host knows about a batch's rows without looking at the device."""

    all_greedy: bool
    penalties: bool
    k_cand: int  # the reference's top values by partial selection; 0 = full sort
    any_greedy: bool = True  # some rows are greedy (their argmax replaces the draw)
    # > 0: partial selection two-stage over chunks of this many tokens (large vocabularies)
    chunk: int = 0
    fused: bool = False  # the Triton kernels of ``fused_sampler`` (CUDA only)
    # some sampling row has a top-k or a top-p / a min-p: the fused sampler launches the
    # kernels that find their thresholds only where one has (True where unknown: all run)
    filters: bool = True
    min_p: bool = True


def choose_mode(greedy: list[bool], top_k: list[int], penalties: list[bool], vocab: int,
                max_partial: int = 1024, *, top_p: list[float] | None = None,
                min_p: list[float] | None = None) -> SamplerMode:
    """``top_p``, ``min_p`` (per row, None: not known) tell which threshold kernels of the fused
    sampler the batch needs."""
    sampling_k = [k for g, k in zip(greedy, top_k, strict=True) if not g]
    filters = min_ps = True
    if top_p is not None and min_p is not None:
        rows = [(k, p, m) for g, k, p, m in zip(greedy, top_k, top_p, min_p, strict=True)
                if not g]
        filters = any(0 < k < vocab or p < 1.0 for k, p, _ in rows)
        min_ps = any(m > 0.0 for _, _, m in rows)
    return mode_of(not sampling_k, any(penalties), min(sampling_k, default=0),
                   max(sampling_k, default=0), vocab, max_partial, any_greedy=any(greedy),
                   filters=filters, min_p=min_ps)


def mode_of(all_greedy: bool, penalties: bool, min_k: int, max_k: int, vocab: int,
            max_partial: int = 1024, *, any_greedy: bool = True, filters: bool = True,
            min_p: bool = True) -> SamplerMode:
    """The mode from the sampling rows' smallest and largest top-k (0 = a row without one)
    and whether any has a top-k or a top-p (``filters``) or a min-p."""
    k_cand = 0
    if not all_greedy and min_k > 0:
        # a few shapes, not one per top-k value; more values than any row's top-k, so a
        # row's top-p boundary lies inside them
        k = 1 << max_k.bit_length()
        k_cand = min(k, vocab) if k <= max_partial else 0
    return SamplerMode(all_greedy, penalties, k_cand, any_greedy or all_greedy,
                       chunk_for(vocab, k_cand), filters=filters and not all_greedy,
                       min_p=min_p and not all_greedy)


@functools.lru_cache(maxsize=256)
def fused(mode: SamplerMode) -> SamplerMode:
    """The same batch on the fused kernels (which need no candidate selection); cached, as
    the engine asks once per step."""
    return replace(mode, k_cand=0, chunk=0, fused=True)


def use_fused(choice: str, device: torch.device) -> bool:
    """``EngineConfig.sampler``: 'fused' (refused without CUDA and Triton), 'torch', or 'auto'
    (fused where it can run)."""
    if choice == "torch":
        return False
    try:
        import triton  # noqa: F401 - only whether it imports
        ok = device.type == "cuda"
    except ImportError:
        ok = False
    if choice == "fused" and not ok:
        raise ConfigError(f"EngineConfig.sampler='fused': needs a CUDA device and Triton "
                          f"(device is {device.type}); use 'auto' or 'torch'")
    return ok


SELECTION_CHUNK = 64  # tokens per chunk of two-stage candidate selection (``top_values``)
MIN_CHUNKED_VOCAB = 32768


def chunk_for(vocab: int, k_cand: int) -> int:
    """Two-stage selection where it reads the vocabulary once and keeps few chunks: a large
    vocabulary that SELECTION_CHUNK divides, with at most a quarter of it in the kept chunks."""
    if (k_cand and vocab >= MIN_CHUNKED_VOCAB and vocab % SELECTION_CHUNK == 0
            and 4 * k_cand * SELECTION_CHUNK <= vocab):
        return SELECTION_CHUNK
    return 0


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
    rep = p.repetition_penalty[:, None]
    z = torch.where(seen, torch.where(z > 0, z / rep, z * rep), z)
    return (z - p.frequency_penalty[:, None] * counts
            - p.presence_penalty[:, None] * (counts > 0).to(z.dtype))


def penalised(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
              penalties: PenaltyState | None) -> torch.Tensor:
    """The float32 logits the filters see, (B, V)."""
    z = logits.float()
    return apply_penalties(z, p, penalties) if mode.penalties and penalties is not None else z


def sample(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
           penalties: PenaltyState | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) -> (tokens (B,) int64, bad (B,) bool: the row's maximum is not finite,
    i.e. it holds a NaN or +inf, or nothing but -inf)."""
    if mode.fused:
        from decodelab.engine import fused_sampler

        out, _ = fused_sampler.sample(logits, p, mode, penalties)
        bad = out < 0
        return out.clamp(min=0), bad
    z = penalised(logits, p, mode, penalties)
    top, greedy_tok = z.max(dim=-1)  # NaN propagates into the maximum; first index on ties
    bad = ~torch.isfinite(top)
    if mode.all_greedy:
        return greedy_tok.masked_fill_(bad, 0), bad
    e = torch.exp((z - top[:, None]) * p.inv_t()[:, None])  # (B, V)
    tokens = draw(z, e, keep_threshold(z, top, e, p, mode), p)
    if mode.any_greedy:
        tokens = torch.where(p.sampling(), tokens, greedy_tok)
    return tokens.masked_fill_(bad, 0), bad


def sample_step(logits: torch.Tensor, p: RowParams, mode: SamplerMode, penalties: PenaltyState,
                last_token: torch.Tensor, out: torch.Tensor) -> None:
    """One step's sampling with its bookkeeping, all on the device (the body the engine runs
    eagerly or captures in a CUDA graph): sample, scatter each row's token into
    ``last_token[slot]`` (the next step's input), count it for the penalties, and write
    ``out`` (B,) int64: the token, or -1 for a row whose logits were not finite (one array
    for the host to copy)."""
    if mode.fused:
        from decodelab.engine import fused_sampler

        fused_sampler.sample_step(logits, p, mode, penalties, last_token, out)
        return
    tokens, bad = sample(logits, p, mode, penalties)
    slot = p.slot.long()
    last_token.index_copy_(0, slot, tokens)
    if mode.penalties:
        penalties.record(slot, tokens)
    out.copy_(tokens).masked_fill_(bad, -1)


def top_values(z: torch.Tensor, k_cand: int, chunk: int = 0) -> torch.Tensor:
    """The K largest values of each row, descending, (B, K); K = V without ``k_cand``.

    Values only: they do not depend on how ``topk`` orders or picks among tied tokens. With
    ``chunk``, selection is two-stage: the maximum of each chunk of ``chunk`` tokens, the K
    chunks with the largest maxima, then the top K of those chunks' K * chunk tokens. Exact:
    a value of the top K outside the K best chunks would have K larger chunk maxima above it."""
    if not k_cand:
        return torch.sort(z, dim=-1, descending=True).values
    b, v = z.shape
    k = min(k_cand, v)
    if chunk:
        best = z.view(b, v // chunk, chunk).amax(dim=-1)  # (B, V / chunk); NaN propagates
        top = torch.topk(best, k, dim=-1, sorted=False).indices  # (B, K) chunk numbers
        pos = (top[:, :, None] * chunk + torch.arange(chunk, device=z.device)).view(b, k * chunk)
        z = z.gather(1, pos)
    return torch.topk(z, k, dim=-1).values


def keep_threshold(z: torch.Tensor, top: torch.Tensor, e: torch.Tensor, p: RowParams,
                   mode: SamplerMode) -> torch.Tensor:
    """max(tau_k, tau_p) per row (B,), float32 (-inf: no top-k and no top-p).

    The top-p mass runs over the sorted top values; a tie group at the k-th value that
    reaches past them is in the total (summed over the vocabulary) and, being at tau_k, is
    kept by top-p whenever its first member is, which lies among the values."""
    vals = top_values(z, mode.k_cand, mode.chunk)  # (B, K) descending
    n = vals.shape[1]
    ninf = torch.full_like(top, float("-inf"))
    has_k = p.top_k < z.shape[1]
    tk = torch.where(has_k, vals.gather(1, p.top_k.long().clamp(max=n)[:, None] - 1).squeeze(1),
                     ninf)
    in_k = z >= tk[:, None]
    total = torch.where(has_k, (e * in_k).sum(dim=-1), e.sum(dim=-1))  # (B,)
    ve = torch.exp((vals - top[:, None]) * p.inv_t()[:, None]) * (vals >= tk[:, None])
    c = ve.cumsum(dim=-1)  # (B, K) mass of the values down to j
    # the last index kept by the prefix rule: position j >= 1 while c_{j-1} < top_p * total
    last = (c[:, :-1] < (p.top_p * total)[:, None]).sum(dim=-1, keepdim=True)
    tp = torch.where(p.top_p < 1, vals.gather(1, last).squeeze(1), ninf)
    return torch.maximum(tk, tp)


def keep_mask(z: torch.Tensor, e: torch.Tensor, tau: torch.Tensor, p: RowParams) -> torch.Tensor:
    """The kept tokens (B, V) bool of a row threshold: the top-k and top-p rule, then min-p."""
    return (z >= tau[:, None]) & (e >= p.min_p[:, None])


def draw(z: torch.Tensor, e: torch.Tensor, tau: torch.Tensor, p: RowParams) -> torch.Tensor:
    """The first token id whose cumulative kept mass (token-id order) reaches u * total."""
    cum = (e * keep_mask(z, e, tau, p)).cumsum(dim=-1)  # (B, V)
    pick = (cum < p.uniform[:, None] * cum[:, -1:]).sum(dim=-1)
    return pick.clamp_(max=z.shape[1] - 1)
