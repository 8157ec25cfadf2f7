"""What the engine needs from the model it serves and from the forward graphs it replays.

``PagedLlama`` (and ``TensorParallelLlama``), ``DecodeGraphs`` of phase 4a and
``PrefillGraphs`` provide these; so do the CPU stand-ins of the tests
(``tests/fake_runtime_model.py``), which is how the engine is tested without a real model.
Structural (``typing.Protocol``): nothing subclasses them. Imports no torch at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from decodelab.model.block_pool import BlockPool


@runtime_checkable
class ModelShape(Protocol):
    """The two numbers of a model's config the engine reads."""

    vocab_size: int
    max_position_embeddings: int


@runtime_checkable
class RuntimeCache(Protocol):
    """The paged KV cache as the engine sees it: its allocator and its geometry."""

    pool: BlockPool
    block_size: int

    @property
    def scratch_block(self) -> int:
        """A block no sequence owns: padding rows attend to it."""
        ...

    @property
    def capacity_tokens(self) -> int: ...


@runtime_checkable
class RuntimeModel(Protocol):
    """A decoder over a paged KV cache: prefill of prompt chunks, one decode step of a batch."""

    config: ModelShape
    cache: RuntimeCache
    device: torch.device | str

    def prefill(self, token_ids: Sequence[Sequence[int]], block_tables: Sequence[Sequence[int]],
                starts: Sequence[int] | None = None) -> torch.Tensor:
        """Chunks (each with its block table) -> logits at each chunk's last position
        (N, vocab) float32. ``token_ids[i]`` are the new tokens of sequence i at positions
        ``starts[i] .. starts[i] + len - 1`` (``starts`` None: all 0, whole prompts); the
        positions before ``starts[i]`` are already in the cache, the chunk's are written to
        the slots its block table gives, and each chunk token attends to every position of its
        sequence up to its own. Bad inputs raise ValueError before any device work."""
        ...

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor,
               slot_mapping: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor) -> torch.Tensor:
        """(B,) each, block tables (B, m) int32 -> logits (B, vocab) float32."""
        ...


@runtime_checkable
class Prefill(Protocol):
    """What runs a step's prefill chunks in place of ``RuntimeModel.prefill``, with its
    contract (``PrefillGraphs``: a CUDA graph per token bucket, eager past them)."""

    def prefill(self, token_ids: Sequence[Sequence[int]], block_tables: Sequence[Sequence[int]],
                starts: Sequence[int] | None = None) -> torch.Tensor: ...


class Replayable(Protocol):
    def replay(self) -> None: ...


@runtime_checkable
class ForwardGraphs(Protocol):
    """Decode captured per batch bucket over static input buffers (``DecodeGraphs``).

    ``run`` pads a batch to its bucket and replays; the engine's step graphs instead write the
    static buffers themselves and replay ``graphs[bucket]``, reading ``outputs[bucket]``, or
    ``narrow[bucket]`` (graph, output: over the table's first columns) where ``fits_narrow``."""

    input_ids: torch.Tensor  # (max bucket,) int64
    positions: torch.Tensor  # (max bucket,) int64
    slot_mapping: torch.Tensor  # (max bucket,) int64, -1 = padding
    block_tables: torch.Tensor  # (max bucket, max_blocks_per_seq) int32
    context_lens: torch.Tensor  # (max bucket,) int32
    max_blocks_per_seq: int
    outputs: Mapping[int, torch.Tensor]  # bucket -> (bucket, vocab) float32
    graphs: Mapping[int, Replayable]  # bucket -> its captured decode
    narrow: Mapping[int, tuple[Replayable, torch.Tensor]]  # bucket -> (graph, output)

    def bucket_for(self, batch: int) -> int: ...

    def fits_narrow(self, bucket: int, longest: int) -> bool:
        """Whether a batch whose longest row holds ``longest`` positions replays
        ``narrow[bucket]``."""

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            slot_mapping: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor) -> torch.Tensor: ...
