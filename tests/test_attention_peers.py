"""The attention bench's peers (model.bench.attention_peers): an installed FlashInfer whose
kernels cannot be built here is left out with its reason said once, not a failed bench."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from decodelab.model.bench import attention_peers


class _BrokenWrapper:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("ninja: build stopped: subcommand failed")


@pytest.fixture
def broken_flashinfer(monkeypatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _BrokenWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(attention_peers.importlib.util, "find_spec",
                        lambda name: object() if name == "flashinfer" else None)
    monkeypatch.setattr(attention_peers, "_UNAVAILABLE", {})
    return fake


def _inputs(batch=2, hkv=2, group=2, d=16, bs=16, width=4):
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn((batch * width, hkv, bs, d), generator=gen)
    layer = SimpleNamespace(k_pool=pool, v_pool=pool.clone(),
                            block_tables=torch.arange(batch * width).view(batch, width).int())
    q = torch.randn((batch, hkv * group, d), generator=gen)
    return q, torch.tensor([5, 40], dtype=torch.int32), layer


def test_a_flashinfer_that_cannot_build_is_left_out_after_one_try(broken_flashinfer):
    q, lens, layer = _inputs()
    found = attention_peers.candidates(q, lens, 0.25, [layer], uniform=False)
    assert set(found) == {"paged", "paged_uncapped", "flashinfer"}  # 2 rows: split, unsorted
    for fn in found["flashinfer"].values():
        with pytest.raises(attention_peers.PeerUnavailable, match="ninja: build stopped"):
            fn(layer)
    again = attention_peers.candidates(q, lens, 0.25, [layer], uniform=True)
    assert set(again) == {"paged", "sdpa_contiguous"}  # not built again at the next point
