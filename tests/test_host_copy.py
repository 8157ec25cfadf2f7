"""Host-to-device copies that do not hold the host (``core.host_copy``): on a CUDA device
through pinned memory and asynchronously, so that preparing a prefill (its packed tokens,
block tables and sampling rows) does not wait for the kernels queued before it; elsewhere a
plain copy."""

from __future__ import annotations

import pytest
import torch

from decodelab.core.host_copy import to_device


def test_a_cpu_copy_is_a_plain_one():
    host = torch.arange(6).view(2, 3)
    out = to_device(host, "cpu")
    assert torch.equal(out, host) and out.device.type == "cpu"


def test_to_cuda_the_copy_is_pinned_then_asynchronous():
    """The calls it makes (no GPU here): pin, then a non-blocking copy to the device."""
    calls = []

    class Host:
        def pin_memory(self):
            calls.append("pin_memory")
            return self

        def to(self, device, non_blocking=False):
            calls.append((device.type, non_blocking))
            return "on the device"

    assert to_device(Host(), "cuda") == "on the device"
    assert calls == ["pin_memory", ("cuda", True)]


def _busy_stream() -> torch.cuda.Event:
    """About 0.1 s of work queued on the stream; an event recorded after it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # clock cycles of spinning
    done = torch.cuda.Event()
    done.record()
    return done


@pytest.mark.gpu
def test_prefill_inputs_reach_the_gpu_without_waiting_for_it():
    """A blocking copy returns only once the queued work has run (the check can fail); the
    prefill pack, its block tables and its sampling rows return while it still runs, and hold
    the same values."""
    from decodelab.engine.requests import SamplingParams
    from decodelab.engine.row_sampling import RowParams, RowSampling
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.prefill_pack import pack_prefill

    dev = torch.device("cuda")
    host = torch.arange(1000)
    done = _busy_stream()
    host.to(dev)
    assert done.query(), "the blocking copy returned before the queued work had run"
    done = _busy_stream()
    copied = to_device(host, dev)
    assert not done.query()
    assert torch.equal(copied.cpu(), host)
    empty = to_device(torch.tensor([], dtype=torch.int64), dev)  # a first admission's output
    assert empty.device.type == "cuda" and empty.numel() == 0

    chunks, tables, starts = [[5, 6, 7], [8, 9]], [[3, 1], [2]], [16, 0]
    packs = []
    for cache in (PagedKVCache(named_config("tiny"), 8, 16, device=d) for d in ("cpu", dev)):
        done = _busy_stream()
        packs.append(pack_prefill(cache, chunks, tables, starts, vocab_size=512,
                                  max_positions=1024))
        assert not done.query()
    for name in ("ids", "positions", "slot_mapping", "block_tables", "query_starts", "starts",
                 "last"):
        assert torch.equal(getattr(packs[0], name), getattr(packs[1], name).cpu()), name
    rows = [RowSampling.of(SamplingParams(temperature=0.7, top_p=0.9, seed=1))]
    done = _busy_stream()
    params = RowParams.of(rows, dev)
    assert not done.query()
    assert torch.equal(params.block.cpu(), RowParams.of(rows).block)
