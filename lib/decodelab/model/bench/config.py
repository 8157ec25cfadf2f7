"""The paged-model bench's configuration per profile."""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.core.profiles import PROFILES
from decodelab.core.timing import TimingConfig
from decodelab.core.validate import ConfigError, check_choice

# Blocks beyond the timed batches' own: the validation's greedy runs before timing (up to 8
# prompts of check.PROMPT_LENS plus 16 new tokens, 44 blocks of 16) must fit even where the
# timed batches are small (the CPU profiles).
VALIDATION_BLOCKS = 64


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
        check_choice("PagedModelBenchConfig", "dtype", self.dtype, ("bfloat16", "float32"))
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
