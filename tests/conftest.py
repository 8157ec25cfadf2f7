"""Shared test setup: GPU-marked tests skip without CUDA; results go to a temporary folder."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _figures_to_tmp(tmp_path_factory):
    """Figures exported during tests go to a temporary folder, never into figures/."""
    import os

    os.environ["DECODELAB_FIGURES"] = str(tmp_path_factory.mktemp("figures"))


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
