"""Tensor-parallel decode of the paged Llama over ``torch.distributed`` (NCCL on GPUs, gloo on
CPUs): process groups (``group``), how weights split across ranks (``shard``), the sharded model
(``model``), its correctness checks (``check``), the collectives' own costs (``collectives``),
the ``bench tp`` measurements (``bench``, with ``config``, ``memory``: what fits a GPU,
``rows``, ``profile``, ``progress``) and the tables' analysis for notebook 06 (``analysis``)."""
