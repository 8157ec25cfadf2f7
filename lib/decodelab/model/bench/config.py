"""The paged-model bench's configuration per profile, and its sizes on a given GPU.

``for_profile`` gives the profile's sizes on any machine; ``on_device`` resolves the dtype
for the device that runs it (``core.precision``) and fits the sizes to its free memory
(``core.sizing``): the largest batches go first, then the longest contexts, then the model
(the tiny one, at the profile's batches and contexts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from decodelab.core.precision import BYTES, DTYPES, resolve_dtype
from decodelab.core.profiles import PROFILES
from decodelab.core.sizing import Device, Fitted, Option, fit
from decodelab.core.timing import TimingConfig
from decodelab.core.validate import ConfigError, check_choice
from decodelab.model import memory
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.pdl_policy import for_rows

# Blocks beyond the timed batches' own: the validation's greedy runs before timing (up to 8
# prompts of check.PROMPT_LENS plus 16 new tokens, 44 blocks of 16) must fit even where the
# timed batches are small (the CPU profiles).
VALIDATION_BLOCKS = 64
# Bytes a matmul's candidates are timed over (``triton.matmul_choice.TIMING_BYTES``, whose
# module needs Triton): weight copies made while the model is built.
TIMING_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class PagedModelBenchConfig:
    profile: str
    model: str
    dtype: str
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    hf_batches: tuple[int, ...]
    hf_new_tokens: int
    # (batch, context) points of the compile_static peer (GPU): max-autotune spends about
    # 1.5 min per batch size autotuning its GEMMs on an H200, so it is measured where the
    # comparison matters, not at every point.
    compile_points: tuple[tuple[int, int], ...] = ()
    block_size: int = 16
    warmup: int = 3
    repeats: int = 10
    inner: int = 10

    def __post_init__(self) -> None:
        check_choice("PagedModelBenchConfig", "profile", self.profile, PROFILES)
        check_choice("PagedModelBenchConfig", "dtype", self.dtype, DTYPES)
        for name in ("batches", "contexts"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)):
                raise ConfigError(f"PagedModelBenchConfig.{name}={values!r}: must be a non-empty "
                                  "increasing tuple (sizing drops the largest first)")
        for batch, context in self.compile_points:
            if batch not in self.batches or context not in self.contexts:
                raise ConfigError(f"PagedModelBenchConfig.compile_points: ({batch}, {context}) "
                                  f"is not a measured point; batches {self.batches}, "
                                  f"contexts {self.contexts}")

    @classmethod
    def for_profile(cls, profile: str) -> PagedModelBenchConfig:
        """The sizes of ``profile`` on any machine; where it runs is
        :func:`~decodelab.core.profiles.on_bench_device`'s (``gpu`` without CUDA: refused)."""
        if profile == "gpu":
            return cls(profile=profile, model="llama-3.2-1b", dtype="bfloat16",
                       batches=(1, 8, 32, 128), contexts=(512, 4096), hf_batches=(1, 8),
                       hf_new_tokens=17, compile_points=((1, 512), (32, 512), (128, 4096)))
        if profile == "smoke":
            return cls(profile=profile, model="tiny", dtype="float32", batches=(1, 4),
                       contexts=(32,), hf_batches=(1,), hf_new_tokens=9, warmup=1, repeats=2,
                       inner=2)
        return cls(profile=profile, model="tiny", dtype="float32", batches=(1, 8),
                   contexts=(64, 256), hf_batches=(1,), hf_new_tokens=33, repeats=7, inner=5)

    @property
    def timing(self) -> TimingConfig:
        return TimingConfig(self.warmup, self.repeats, self.inner)

    @property
    def blocks_per_seq(self) -> int:
        """Blocks of one sequence at the longest context (and one to grow into)."""
        return blocks_needed(max(self.contexts), self.block_size) + 1

    @property
    def num_blocks(self) -> int:
        return max(self.batches) * self.blocks_per_seq + VALIDATION_BLOCKS

    def on_device(self, dtype: str, device: Device | None) -> Fitted[PagedModelBenchConfig]:
        """This config on ``device`` (None: the CPU): ``dtype`` resolved there (``auto``: the
        device's), the sizes fitted to its free memory, and the line saying what shrank."""
        capability = device.capability if device is not None else None
        cfg = replace(self, dtype=resolve_dtype(dtype, capability, "paged_model.dtype"))
        return fit("paged_model", cfg.options(device is not None and capability >= (9, 0)),
                   device)

    def options(self, pdl: bool) -> list[Option[PagedModelBenchConfig]]:
        """From these sizes down: the compile_static peer's largest points first (a peer, not
        our own step), then fewer batches, then fewer contexts, then the tiny model.
        ``pdl``: the GPU uses programmatic dependent launch (a second set of graphs)."""
        sizes = [(self.model, self.batches[:nb], self.contexts[:nc])
                 for nc in range(len(self.contexts), 0, -1)
                 for nb in range(len(self.batches), 0, -1)]
        if self.model != "tiny":
            sizes.append(("tiny", self.batches, self.contexts))
        out = []
        for model, batches, contexts in sizes:
            points = sorted((p for p in self.compile_points
                             if p[0] in batches and p[1] in contexts), key=lambda p: p[0] * p[1])
            for keep in range(len(points), -1, -1) if points else (0,):
                cfg = replace(self, model=model, batches=batches, contexts=contexts,
                              compile_points=tuple(points[:keep]))
                out.append(Option(cfg, cfg.peak_bytes(pdl), cfg.describe()))
        return out

    def describe(self) -> str:
        peer = ", ".join(f"{b}x{c}" for b, c in self.compile_points) or "none"
        return (f"{self.model} {self.dtype}, batches {', '.join(map(str, self.batches))} x "
                f"contexts {', '.join(map(str, self.contexts))} (compile_static at {peer})")

    def peak_bytes(self, pdl: bool) -> int:
        """Estimated device bytes at the run's peak: building the weights, or later the state
        dict (kept for transformers), our fused weights, the KV pool, the decode graphs'
        outputs (with ``pdl`` also the serial twin's) and the largest of: the matmul timing
        copies, transformers' model while it is built (float32, then cast; the state dict is
        copied in), the compile_static peer's static cache at its largest point beside it."""
        mcfg, e = named_config(self.model), BYTES[self.dtype]
        weights = memory.weight_bytes(mcfg, e)
        twin = [b for b in self.batches if pdl and for_rows(True, b)]
        resident = (weights + memory.fused_bytes(mcfg, e)
                    + memory.kv_pool_bytes(mcfg, self.num_blocks, self.block_size, e)
                    + memory.logits_bytes(mcfg, self.batches) + memory.logits_bytes(mcfg, twin))
        hf_build = weights * 4 // e + weights
        static = max((b * c * mcfg.kv_bytes_per_token(e) for b, c in self.compile_points),
                     default=0)
        return max(weights + memory.build_extra_bytes(mcfg, e),
                   resident + max(TIMING_BYTES, hf_build, weights + static))
