"""The runtime packages' public names (``from decodelab.engine import Engine``): every name of
``__all__`` resolves to the object its module defines, and the lazy exports keep the torch-free
modules torch-free (importing a submodule runs the package's ``__init__`` first)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ("decodelab.engine", "decodelab.model", "decodelab.parallel")
TORCH_FREE = ("decodelab.engine.scheduler", "decodelab.engine.requests", "decodelab.engine.plan",
              "decodelab.model.block_pool", "decodelab.parallel.rows")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves_to_its_modules_object(package):
    pkg = importlib.import_module(package)
    assert pkg.__all__, f"{package} exports nothing"
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        home = importlib.import_module(obj.__module__)
        assert getattr(home, name) is obj and home.__name__.startswith(package + ".")
        assert name in dir(pkg)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


def test_star_import_and_the_notebooks_spelling_work():
    namespace: dict[str, object] = {}
    exec("from decodelab.engine import *", namespace)  # the star import itself
    from decodelab.engine import Engine, EngineConfig, RequestHandle, SamplingParams
    from decodelab.engine.engine import Engine as Defined

    assert namespace["Engine"] is Engine is Defined
    assert (namespace["EngineConfig"], namespace["RequestHandle"], namespace["SamplingParams"]) == (
        EngineConfig, RequestHandle, SamplingParams)


def test_submodules_and_bench_rooms_still_import_through_the_package():
    from decodelab.engine import notebook, scheduler
    from decodelab.model import bench as model_bench
    from decodelab.model.bench import rows

    assert scheduler.__name__ == "decodelab.engine.scheduler" and notebook.NotebookParams
    assert callable(model_bench.bench) and rows.PagedModelRow
    assert callable(importlib.import_module("decodelab.engine.bench").bench)


@pytest.mark.parametrize("module", (*TORCH_FREE, *PACKAGES))
def test_torch_free_modules_and_the_bare_packages_import_no_torch(module):
    code = (f"import sys; import {module}; "
            f"assert 'torch' not in sys.modules, 'import {module} pulled in torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
