"""What the phase-3 bench measures: the shapes of each sweep and the launches per shape."""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.core.profiles import PROFILES
from decodelab.core.validate import check_choice
from decodelab.persistent.kernel import VARIANTS, KernelConfig, exchange_of
from decodelab.toy import step as toy

V = 256  # vocabulary of every sweep (the seed's ultra-light and h256 configs)
NAMED = ("ultra-light", "h256")
# Outside the named shapes, the launches worth a row: the one-round split with and without the
# fold per exchange, and the first design as the baseline the others are read against.
SWEEP_VARIANTS = ("block_fixed", "block_wide", "block_wide_fold", "grid_wide", "grid_wide_fold",
                  "cluster_fixed", "cluster_wide", "cluster_wide_fold")


@dataclass(frozen=True, slots=True)
class PersistentBenchConfig:
    shapes: tuple[tuple[str, toy.ToyConfig], ...]  # (sweep name, shape)
    n_validate: int
    graph_ks: tuple[int, ...]
    target_launch_s: float  # device time aimed for per timed launch
    repeats: int
    budget_s: float  # shapes left when this much time has passed are skipped

    @classmethod
    def for_profile(cls, profile: str) -> PersistentBenchConfig:
        """The sweeps of ``profile``, all on the GPU (the kernels are CUDA): ``gpu`` every
        sweep, ``cpu`` and ``smoke`` two small shapes."""
        check_choice("PersistentBenchConfig", "profile", profile, PROFILES)

        def cfg(h: int, n_layers: int, b: int) -> toy.ToyConfig:
            return toy.ToyConfig(hidden=h, layers=n_layers, batch=b, vocab=V)

        if profile != "gpu":
            return cls(shapes=(("named", cfg(64, 4, 1)), ("batch", cfg(64, 2, 2))),
                       n_validate=200, graph_ks=(8,), target_launch_s=2e-3, repeats=3,
                       budget_s=60.0)
        # The named shapes first (every variant, and the tuning alternatives), so a budget cut
        # never loses them.
        shapes = [("named", toy.named(name)) for name in NAMED]
        shapes += [("hidden", cfg(h, 4, 1)) for h in (16, 32, 128, 512, 1024)]
        shapes += [("layers", cfg(h, n, 1)) for h in (64, 256) for n in (1, 2, 8)]
        shapes += [("batch", cfg(h, 4, b)) for h in (64, 256) for b in (8, 32)]
        return cls(shapes=tuple(shapes), n_validate=1000, graph_ks=(16, 64),
                   target_launch_s=5e-3, repeats=5, budget_s=120.0)


def launch_configs(sweep: str, cfg: toy.ToyConfig, cluster: bool) -> list[KernelConfig]:
    """Every variant at 256 threads on the named shapes, plus 512 threads and other cluster
    sizes for the designs that hold their weights in registers there; elsewhere the sweep's
    variants at 256 threads."""
    names = VARIANTS if sweep == "named" else SWEEP_VARIANTS
    out = [KernelConfig(v, 256) for v in names if cluster or exchange_of(v) != "cluster"]
    if sweep == "named" and cfg.hidden == 64:
        out += [KernelConfig(v, 512) for v in ("block_fixed", "block_wide", "block_wide_fold")]
    if sweep == "named" and cfg.hidden == 256 and cluster:
        out += [KernelConfig(v, 256, 8) for v in ("cluster_wide", "cluster_wide_fold")]
        out += [KernelConfig(v, 512, 16) for v in ("cluster_wide", "cluster_wide_fold")]
    return out
