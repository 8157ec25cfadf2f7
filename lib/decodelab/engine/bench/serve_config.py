"""The serving bench's configuration per profile, and the engine variants it serves with.

A variant is one line of :data:`VARIANTS`: a name and the ``EngineConfig`` fields it sets on
top of the bench's base engine (:func:`engine_config`: ``max_num_seqs``, ``max_model_len``,
graphs where there are any, the token budget of a step, whole-prompt prefill as the runtime
bench runs it, no pacing); a field set to :data:`SMALL` takes ``ServeBenchConfig.small_budget``.
A variant whose fields this ``EngineConfig`` does not have is left out of the profiles
(:func:`available_variants`) and refused when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from decodelab.core.profiles import PROFILES
from decodelab.core.validate import ConfigError, check_choice, check_float, check_int
from decodelab.engine.bench.serve_workload import OfflineWorkload, OnlineSweep
from decodelab.model.config import named_config

SMALL = "small_budget"  # a variant's field set to ServeBenchConfig.small_budget
VARIANTS: dict[str, dict[str, Any]] = {
    "engine": {},  # whole prompts (plus output, on recompute) under the token budget
    "chunked": {"chunked_prefill": True},  # prompts split to fill the budget the decode leaves
    # chunked under ServeBenchConfig.small_budget: a step prefills at most that less its decode
    # rows, so a mixed step stays near a decode step (inter-token latency against time to
    # first token: the budget vLLM and Sarathi-Serve lower for latency)
    "chunked_small": {"chunked_prefill": True, "max_num_batched_tokens": SMALL},
    # chunked under the full budget, paced to small_budget prefill tokens a step while rows
    # decode and the prompts waiting fit in one step (EngineConfig.steady_prefill_tokens):
    # chunked_small's short mixed steps while the server keeps up, the whole budget under a
    # backlog
    "paced": {"chunked_prefill": True, "steady_prefill_tokens": SMALL},
    # chunked, on a batch-invariant model (PagedLlama(..., batch_invariant=True)): its cost
    "invariant": {"chunked_prefill": True, "batch_invariant": True},
}
GPU_ONLY_VARIANTS = ("invariant",)  # the switch needs Triton on CUDA
# Variants that serve the offline workload and the online sweep but not the long prompts: the
# invariant prefill attends through the decode kernel's rows, whose K/V reads grow with the
# square of the prompt (a 2k-8k prompt reads its prefix once per 16 tokens, not once per
# 128-token tile as the default prefill does), hours for that workload's 647k prompt tokens.
SHORT_PROMPTS_ONLY = ("invariant",)
DTYPES = ("float32", "bfloat16", "float16")
CONTEXT_SPARE = 8  # positions beyond the longest prompt + output of any workload


def _engine_fields() -> set[str]:
    from decodelab.engine.config import EngineConfig

    return {f.name for f in fields(EngineConfig)}


def available_variants() -> tuple[str, ...]:
    """The variants whose fields ``EngineConfig`` has, in :data:`VARIANTS`' order."""
    have = _engine_fields()
    return tuple(name for name, sets in VARIANTS.items() if set(sets) <= have)


def cpu_variants() -> tuple[str, ...]:
    """The variants a CPU profile serves (the CPU profiles run on a CPU, even on a GPU machine)."""
    return tuple(v for v in available_variants() if v not in GPU_ONLY_VARIANTS)


def engine_config(variant: str, token_budget: int, small_budget: int, **sizes: Any):
    """The ``EngineConfig`` of ``variant``: ``sizes``, the base engine's budget, whole-prompt
    prefill and no pacing where ``EngineConfig`` has those fields (before it did, its only
    way), then the variant's own fields (:data:`SMALL`: ``small_budget``)."""
    from decodelab.engine.config import EngineConfig

    check_choice("engine_config", "variant", variant, available_variants())
    have = _engine_fields()
    base = {"max_num_batched_tokens": token_budget, "chunked_prefill": False,
            "steady_prefill_tokens": None}
    own = {k: small_budget if v == SMALL else v for k, v in VARIANTS[variant].items()}
    return EngineConfig(**sizes, **{**{k: v for k, v in base.items() if k in have}, **own})


@dataclass(frozen=True, slots=True)
class ServeBenchConfig:
    profile: str
    model: str
    dtype: str
    max_num_seqs: int  # the engine's rows; decode graphs are captured up to this batch
    offline: OfflineWorkload  # nano-vllm's benchmark (scaled down on a CPU)
    long_prompts: OfflineWorkload
    online: OnlineSweep  # rates relative to the offline run's request rate
    warmup_prompt: int  # prompt length of the warm-up requests (serve_workload.warmup_requests)
    graph_batches: tuple[int, ...] = ()  # buckets captured beyond graph_buckets' defaults
    kv_margin_gib: float = 8.0  # GPU: memory left free beside the weights and the KV cache
    token_budget: int = 4096  # tokens one step computes (EngineConfig.max_num_batched_tokens)
    small_budget: int = 512  # what a variant's SMALL fields take: a budget, a pace
    block_size: int = 16
    variants: tuple[str, ...] = ("engine",)

    def __post_init__(self) -> None:
        own = "ServeBenchConfig"
        check_choice(own, "profile", self.profile, PROFILES)
        check_choice(own, "dtype", self.dtype, DTYPES)
        check_int(own, "max_num_seqs", self.max_num_seqs, 1, 4096)
        check_int(own, "warmup_prompt", self.warmup_prompt, 1)
        for b in self.graph_batches:
            check_int(own, "graph_batches[]", b, 1, self.max_num_seqs)
        check_float(own, "kv_margin_gib", self.kv_margin_gib, 0.0, 1024.0)
        check_int(own, "token_budget", self.token_budget, self.max_num_seqs)  # a token a row
        check_int(own, "small_budget", self.small_budget, self.max_num_seqs, self.token_budget)
        check_int(own, "block_size", self.block_size, 1, 1024)
        if not isinstance(self.variants, tuple) or not self.variants:
            raise ConfigError(f"{own}.variants={self.variants!r}: must be a non-empty tuple of "
                              f"{', '.join(available_variants())}")
        for v in self.variants:
            check_choice(own, "variants[]", v, available_variants())
        positions = named_config(self.model).max_position_embeddings
        if self.max_model_len > positions:
            raise ConfigError(f"{own}: the workloads need contexts of {self.max_model_len} "
                              f"tokens; model {self.model!r} has positions for {positions}: "
                              "prompt_len + output_len must stay within it")

    @classmethod
    def for_profile(cls, profile: str) -> ServeBenchConfig:
        """The sizes of ``profile`` on any machine; where it runs is
        :func:`~decodelab.core.profiles.on_bench_device`'s (``gpu`` without CUDA: refused)."""
        if profile == "gpu":
            return cls(profile=profile, model="llama-3.2-1b", dtype="bfloat16", max_num_seqs=256,
                       offline=OfflineWorkload("offline", num_requests=256,
                                               prompt_len=(100, 1024), output_len=(100, 1024)),
                       long_prompts=OfflineWorkload("long_prompts", num_requests=128,
                                                    prompt_len=(2048, 8192),
                                                    output_len=(128, 512), seed=1),
                       online=OnlineSweep(rate_fractions=(0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
                                          max_requests=256, max_arrival_s=15.0),
                       warmup_prompt=32, graph_batches=(160, 192, 224, 256),
                       variants=available_variants())
        if profile == "smoke":
            return cls(profile=profile, model="tiny", dtype="float32", max_num_seqs=4,
                       offline=OfflineWorkload("offline", num_requests=6, prompt_len=(4, 16),
                                               output_len=(2, 8)),
                       long_prompts=OfflineWorkload("long_prompts", num_requests=2,
                                                    prompt_len=(64, 128), output_len=(2, 4),
                                                    seed=1),
                       online=OnlineSweep(rate_fractions=(0.5, 1.5), max_requests=6,
                                          max_arrival_s=1.0),
                       warmup_prompt=4, token_budget=32, small_budget=8, block_size=8,
                       variants=cpu_variants())
        return cls(profile=profile, model="tiny", dtype="float32", max_num_seqs=16,
                   offline=OfflineWorkload("offline", num_requests=32, prompt_len=(16, 128),
                                           output_len=(16, 128)),
                   long_prompts=OfflineWorkload("long_prompts", num_requests=8,
                                                prompt_len=(256, 768), output_len=(8, 32),
                                                seed=1),
                   online=OnlineSweep(rate_fractions=(0.5, 1.0, 1.5, 2.0, 3.0),
                                      max_requests=32, max_arrival_s=3.0),
                   warmup_prompt=8, token_budget=256, small_budget=64, block_size=8,
                   variants=cpu_variants())

    @property
    def max_model_len(self) -> int:
        """The engine's longest context: the longest request of any workload, and a spare."""
        warmup = self.warmup_prompt + 16 + 2 + self.max_num_seqs // 2
        return max(self.offline.max_context, self.long_prompts.max_context,
                   warmup) + CONTEXT_SPARE
