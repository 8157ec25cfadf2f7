"""What ``bench tp`` measures, per profile: the models, batches, context and the collective
sweep, validated before any process group starts."""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.core.precision import DTYPES
from decodelab.core.profiles import PROFILES
from decodelab.core.timing import TimingConfig
from decodelab.core.validate import check_choice
from decodelab.model.config import named_config

SWEEP_BYTES = tuple(1 << k for k in range(10, 29))  # 1 KiB .. 256 MiB
@dataclass(frozen=True, slots=True)
class TPBenchConfig:
    profile: str
    models: tuple[str, ...]
    dtype: str
    graph_batches: tuple[int, ...]
    eager_batches: tuple[int, ...]
    context: int
    sweep_bytes: tuple[int, ...]
    sweep_ops: int = 32  # all-reduces per timed sample (one graph of them in graph mode)
    sweep_samples: int = 15
    check_tokens: int = 12
    block_size: int = 16
    warmup: int = 3
    repeats: int = 7
    inner: int = 8

    def __post_init__(self) -> None:
        check_choice("TPBenchConfig", "profile", self.profile, PROFILES)
        check_choice("TPBenchConfig", "dtype", self.dtype, DTYPES)
        for m in self.models:
            named_config(m)

    @classmethod
    def for_profile(cls, profile: str) -> TPBenchConfig:
        """The sizes of ``profile`` on any machine (``bench`` refuses ``gpu`` without CUDA:
        :func:`~decodelab.core.profiles.measured_device`)."""
        if profile == "gpu":
            return cls(profile=profile, models=("llama-3.2-1b", "llama-3.1-8b"),
                       dtype="bfloat16", graph_batches=(1, 2, 4, 8, 16, 32, 64, 128),
                       eager_batches=(1, 8, 32, 128), context=512, sweep_bytes=SWEEP_BYTES)
        if profile == "smoke":
            return cls(profile=profile, models=("tiny",), dtype="float32", graph_batches=(),
                       eager_batches=(1, 4), context=32, sweep_bytes=(1 << 10, 1 << 14),
                       sweep_ops=4, sweep_samples=3, check_tokens=4, warmup=1, repeats=2,
                       inner=2)
        return cls(profile=profile, models=("tiny",), dtype="float32", graph_batches=(),
                   eager_batches=(1, 4, 16), context=64,
                   sweep_bytes=tuple(1 << k for k in range(10, 21, 2)), sweep_ops=8,
                   sweep_samples=5)

    @property
    def timing(self) -> TimingConfig:
        return TimingConfig(self.warmup, self.repeats, self.inner)

    def modes(self, cuda: bool) -> dict[str, tuple[int, ...]]:
        out = {"eager": self.eager_batches}
        if cuda:
            out["graph"] = self.graph_batches
        return out
