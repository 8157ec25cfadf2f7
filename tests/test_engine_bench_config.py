"""The runtime bench's configuration on CPU: the graph buckets come from the model's one list."""

from __future__ import annotations

from decodelab.engine.bench import RuntimeBenchConfig, graph_buckets
from decodelab.model.graphs import DEFAULT_BUCKETS


def test_graph_buckets_are_the_default_ones_up_to_the_largest_batch():
    for batches in ((1, 8, 32), (1, 4), (3, 5, 100), (128,)):
        got = graph_buckets(batches)
        top = max(batches)
        assert set(got) == {b for b in DEFAULT_BUCKETS if b <= top} | set(batches)
        assert list(got) == sorted(got) and max(got) == top


def test_every_profile_gets_buckets_covering_its_batches():
    for profile in ("smoke", "cpu", "gpu"):
        cfg = RuntimeBenchConfig.for_profile(profile)
        buckets = graph_buckets(cfg.batches)
        assert set(cfg.batches) <= set(buckets) and cfg.batch <= max(buckets)
