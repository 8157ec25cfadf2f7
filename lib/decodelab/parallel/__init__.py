"""Tensor-parallel decode of the paged Llama over ``torch.distributed`` (NCCL on GPUs, gloo on
CPUs): process groups (``group``), how weights split across ranks (``shard``), the sharded model
(``model``), its correctness checks (``check``), the collectives' own costs (``collectives``),
the ``bench tp`` measurements (``bench``, with ``config``, ``memory``: what fits a GPU,
``rows``, ``profile``, ``progress``) and the tables' analysis for notebook 06 (``analysis``).

The runtime's classes are importable from here, each module imported on first use
(:mod:`decodelab.core.lazy`), so ``import decodelab.parallel.rows`` stays torch-free."""

from decodelab.core.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "TensorParallelLlama": "model",
    "TPGroup": "group",
    "init_world": "group",
    "sub_group": "group",
    "shutdown": "group",
})
