"""Shared test setup: GPU-marked tests skip without CUDA; results go to a temporary folder."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def local_results(tmp_path, monkeypatch):
    """Point data/local at a temporary folder so tests never touch real results."""
    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    return tmp_path / "local"
