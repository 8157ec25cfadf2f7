"""The paged Llama split across a tensor-parallel group: three collectives per layer pair.

    model = TensorParallelLlama(config, shard_weights(config, full, rank, tp), cache, group)

``config`` is the whole model's shape; ``cache`` holds this rank's KV heads
(``PagedKVCache(local_config(config, tp), ...)``). The forward is ``PagedLlama``'s own, with
three hooks filled in: the embedding looks up the rank's vocabulary rows and all-reduces
(rows of other ranks are zero), the o and down projections' partial sums are all-reduced (two
per layer), and the head's vocabulary slices are all-gathered. So a decode step issues
2 L + 1 all-reduces of (B, d) and one all-gather of (B, V / tp), all on the current stream:
a CUDA graph of ``decode`` captures them with the compute (``DecodeGraphs`` works unchanged).
Every rank gets the full logits. With a group of one it is exactly ``PagedLlama``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from decodelab.core.validate import ConfigError
from decodelab.model.config import ModelConfig
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import Weights
from decodelab.parallel.group import TPGroup
from decodelab.parallel.shard import local_config, vocab_range


class TensorParallelLlama(PagedLlama):
    def __init__(self, config: ModelConfig, weights: Weights, cache: PagedKVCache,
                 group: TPGroup, *, backend: str = "auto") -> None:
        if cache.device != group.device:
            raise ConfigError(f"TensorParallelLlama: cache on {cache.device}, the group's device "
                              f"is {group.device}")
        shard_rows = config.vocab_size // group.size
        if weights.embed.shape[0] != shard_rows:
            raise ConfigError(f"TensorParallelLlama: embedding shard has {weights.embed.shape[0]}"
                              f" rows; tp={group.size} needs {shard_rows} (use shard_weights)")
        super().__init__(local_config(config, group.size), weights, cache, backend=backend)
        self.full_config = config
        self.group = group
        self.vocab_start, self.vocab_end = vocab_range(config, group.rank, group.size)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return super()._embed(ids)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_end - self.vocab_start)
        rows = F.embedding(local.clamp(0, self.vocab_end - self.vocab_start - 1),
                           self.weights.embed)
        return self.group.all_reduce(rows.masked_fill(outside[:, None], 0))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(partial)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        local = self.ops.linear(x, self.weights.lm_head)  # (T, V / tp), gathered in model dtype
        return self.group.all_gather_last(local).float()

    def with_group(self, group: TPGroup) -> TensorParallelLlama:
        """The same weights, cache and kernel choices over another group object (e.g.
        ``group.without_comm()``, to time the step with its collectives left out)."""
        twin = copy.copy(self)
        twin.group = group
        return twin
