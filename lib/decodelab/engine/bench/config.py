"""The runtime bench's configuration per profile, its sizes on a given GPU (``on_device``:
the dtype resolved there, the batches fitted to its free memory, ``core.sizing``), and the
decode graphs' buckets it captures."""

from __future__ import annotations

from dataclasses import dataclass, replace

from decodelab.core.precision import BYTES, DTYPES, resolve_dtype
from decodelab.core.profiles import PROFILES
from decodelab.core.sizing import Device, Fitted, Option, fit
from decodelab.core.validate import check_choice
from decodelab.model import memory
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.graphs import DEFAULT_BUCKETS

# Blocks beyond the computed need (the largest batch's rows at max_model_len tokens each): no
# measured run ever waits for or preempts a block.
SPARE_BLOCKS = 16


@dataclass(frozen=True, slots=True)
class RuntimeBenchConfig:
    profile: str
    model: str
    dtype: str
    batch: int  # steady-decode batch of the main comparison
    batches: tuple[int, ...]  # host overhead vs batch
    prompt_len: int
    warmup_steps: int
    chunk_steps: int  # steps between two synchronisations when timing
    chunks: int
    workload_requests: int
    workload_rate: float  # Poisson arrivals per second
    workload_prompt: tuple[int, int]
    workload_output: tuple[int, int]
    block_size: int = 16

    def __post_init__(self) -> None:
        check_choice("RuntimeBenchConfig", "profile", self.profile, PROFILES)
        check_choice("RuntimeBenchConfig", "dtype", self.dtype, DTYPES)

    @classmethod
    def for_profile(cls, profile: str) -> RuntimeBenchConfig:
        """The sizes of ``profile`` on any machine; where it runs is
        :func:`~decodelab.core.profiles.on_bench_device`'s (``gpu`` without CUDA: refused)."""
        if profile == "gpu":
            return cls(profile=profile, model="llama-3.2-1b", dtype="bfloat16", batch=32,
                       batches=(1, 8, 32), prompt_len=512, warmup_steps=20, chunk_steps=40,
                       chunks=5, workload_requests=160, workload_rate=80.0,
                       workload_prompt=(64, 512), workload_output=(32, 192))
        if profile == "smoke":
            return cls(profile=profile, model="tiny", dtype="float32", batch=4, batches=(1, 4),
                       prompt_len=16, warmup_steps=2, chunk_steps=4, chunks=2,
                       workload_requests=8, workload_rate=200.0, workload_prompt=(4, 16),
                       workload_output=(2, 8), block_size=8)
        return cls(profile=profile, model="tiny", dtype="float32", batch=8, batches=(1, 4, 8),
                   prompt_len=64, warmup_steps=5, chunk_steps=20, chunks=3, workload_requests=48,
                   workload_rate=100.0, workload_prompt=(8, 64), workload_output=(8, 32),
                   block_size=8)

    @property
    def steady_steps(self) -> int:
        return self.warmup_steps + self.chunk_steps * self.chunks

    @property
    def max_model_len(self) -> int:
        return max(self.prompt_len + self.steady_steps + 48,
                   self.workload_prompt[1] + self.workload_output[1] + 8)

    @property
    def num_blocks(self) -> int:
        """The KV pool: the largest batch's rows at ``max_model_len`` tokens, and spares."""
        return max(self.batches) * blocks_needed(self.max_model_len, self.block_size) + SPARE_BLOCKS

    def on_device(self, dtype: str, device: Device | None) -> Fitted[RuntimeBenchConfig]:
        """This config on ``device`` (None: the CPU): ``dtype`` resolved there, the batches
        fitted to its free memory (the largest dropped first; the main batch at most the
        largest left), then the tiny model at the profile's batches."""
        capability = device.capability if device is not None else None
        cfg = replace(self, dtype=resolve_dtype(dtype, capability, "runtime.dtype"))
        sizes = [(cfg.model, cfg.batches[:n]) for n in range(len(cfg.batches), 0, -1)]
        options = []
        for model, batches in sizes + ([("tiny", cfg.batches)] if cfg.model != "tiny" else []):
            sized = replace(cfg, model=model, batches=batches, batch=min(cfg.batch, max(batches)))
            options.append(Option(sized, sized.peak_bytes(), f"{sized.model} {sized.dtype}, "
                                  f"batch {sized.batch}, batches {', '.join(map(str, batches))}"))
        return fit("runtime", options, device)

    def peak_bytes(self) -> int:
        """Estimated device bytes at the peak: building the weights, or the weights with the
        KV pool, the decode graphs' outputs, the sampler's penalty tables (int32 counts and
        a bool per slot and token) and the bench logits."""
        mcfg, e = named_config(self.model), BYTES[self.dtype]
        weights = memory.weight_bytes(mcfg, e)
        steady = (weights + memory.kv_pool_bytes(mcfg, self.num_blocks, self.block_size, e)
                  + memory.logits_bytes(mcfg, graph_buckets(self.batches))
                  + (max(self.batches) + 1) * mcfg.vocab_size * 5
                  + memory.logits_bytes(mcfg, [self.batch]))
        return max(weights + memory.build_extra_bytes(mcfg, e), steady)


def graph_buckets(batches: tuple[int, ...]) -> tuple[int, ...]:
    """The decode graphs' buckets: the default ones up to the largest batch (the engine's
    ``max_num_seqs``: no larger bucket is ever used), and every measured batch."""
    top = max(batches)
    return tuple(sorted({*(b for b in DEFAULT_BUCKETS if b <= top), *batches}))
