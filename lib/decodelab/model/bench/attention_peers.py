"""The decode attention calls the ``paged_attention`` table times, each a function of one layer's
K/V copy (``layer.k_pool``, ``layer.v_pool``, ``layer.block_tables``; ``layer.k``/``layer.v``
the same K/V contiguous, uniform contexts only): ours (rows longest first, as the model's
step takes them), ours without the split cap and ours with the rows in batch order (mixed
contexts), SDPA over a contiguous cache, and FlashInfer's paged decode where it is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F

FLASHINFER_WORKSPACE_BYTES = 128 << 20  # the size FlashInfer's documentation recommends
OPTIONAL = ("flashinfer",)  # peers whose rows are left out where they cannot run
_UNAVAILABLE: dict[bool, str] = {}  # FlashInfer variants (tensor_cores) that failed here, why


def candidates(q: torch.Tensor, lens: torch.Tensor, scale: float, layers: list, *,
               uniform: bool) -> dict[str, dict[str, Callable]]:
    """{impl: {variant: fn(layer) -> (B, H, D)}}; the table keeps each impl's fastest."""
    from decodelab.model.triton import attention_plan
    from decodelab.model.triton.attention import paged_decode_attention

    order = attention_plan.row_order(lens, layers[0].k_pool.shape[1])  # as the model's step

    def ours(launch=None, order=order):
        return lambda layer: paged_decode_attention(q, layer.k_pool, layer.v_pool,
                                                    layer.block_tables, lens, scale, launch,
                                                    row_order=order)

    out = {"paged": {"": ours()}}
    if uniform:
        out["sdpa_contiguous"] = {name: (lambda layer, b=backend: _sdpa(q, layer, scale, b))
                                  for name, backend in _sdpa_backends().items()}
    else:
        kv_row = q.shape[-1] * layers[0].k_pool.element_size()
        _, launch = attention_plan.plan(q.shape[0], layers[0].k_pool.shape[1], q.device, kv_row,
                                        table_positions=layers[0].block_tables.shape[1]
                                        * layers[0].k_pool.shape[2])
        out["paged_uncapped"] = {"": ours(dataclasses.replace(
            launch, max_chunk=attention_plan.UNCAPPED))}
        if order is not None:  # else ours already takes them in batch order
            out["paged_batch_order"] = {"": ours(order=None)}
    if importlib.util.find_spec("flashinfer") is not None:
        variants = {f"tensor_cores={tc}": _flashinfer(q, lens, scale, layers[0], tc)
                    for tc in (False, True) if tc not in _UNAVAILABLE}  # tried once
        if variants:
            out["flashinfer"] = variants
    return out


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def _sdpa(q: torch.Tensor, layer, scale: float, backend) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q[:, :, None], layer.k, layer.v, scale=scale,
                                             enable_gqa=True)  # (B, H, 1, D)
    return out[:, :, 0]


class PeerUnavailable(RuntimeError):
    """An installed peer that cannot run here (e.g. its kernels fail to build): its rows are
    left out, with this message said."""


def _flashinfer(q: torch.Tensor, lens: torch.Tensor, scale: float, layer, tensor_cores: bool
                ) -> Callable:
    """FlashInfer's batch decode over our pool ((blocks, Hkv, block_size, D): its "HND"
    layout), planned at the first call (which builds its kernels) for these lengths and the
    block table every layer copy shares (its plan balances the splits over the actual
    lengths, on the host, before the step)."""
    wrapper = None

    def run(lay) -> torch.Tensor:
        nonlocal wrapper
        if wrapper is None:
            try:
                wrapper = _flashinfer_plan(q, lens, scale, layer, tensor_cores)
            except Exception as exc:  # a build or plan failure of the optional peer
                _UNAVAILABLE[tensor_cores] = (f"flashinfer (tensor_cores={tensor_cores}): "
                                              f"{type(exc).__name__}: {str(exc)[:200]}")
                raise PeerUnavailable(_UNAVAILABLE[tensor_cores]) from exc
        return wrapper.run(q, (lay.k_pool, lay.v_pool))

    return run


def _flashinfer_plan(q: torch.Tensor, lens: torch.Tensor, scale: float, layer,
                     tensor_cores: bool):
    import flashinfer

    bs = layer.k_pool.shape[2]
    pages = (lens + bs - 1) // bs
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(layer.block_tables.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = layer.block_tables[used].int()  # row by row: each row's first pages
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device),
        kv_layout="HND", use_tensor_cores=tensor_cores)
    wrapper.plan(indptr, indices, (lens - 1) % bs + 1, q.shape[1], layer.k_pool.shape[1],
                 q.shape[2], bs, q_data_type=q.dtype, kv_data_type=layer.k_pool.dtype,
                 sm_scale=scale)
    return wrapper
