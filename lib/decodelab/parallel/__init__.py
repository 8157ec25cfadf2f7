"""Tensor-parallel decode of the paged Llama over ``torch.distributed`` (NCCL on GPUs, gloo on
CPUs): process groups (``group``), how weights split across ranks (``shard``), the sharded model
(``model``), the collectives' own costs (``collectives``), the ``bench tp`` measurements
(``bench``) and the tables' analysis for notebook 06 (``analysis``)."""
