"""The notebook pipeline: sources paired with their .ipynb, notebook 00 through papermill,
and the report export (self-contained, figures embedded, nothing fetched from the network)."""

import json
import re

import pytest

pytest.importorskip("papermill")
pytest.importorskip("jupytext")

from decodelab import notebooks, report  # noqa: E402


@pytest.mark.parametrize("name", notebooks.available())
def test_ipynb_is_in_sync_and_has_no_outputs(name):
    import jupytext

    paired = notebooks.paths.notebooks_dir() / f"{name}.ipynb"
    assert paired.exists(), f"{paired.name} missing: run `make notebooks-sync`"
    committed = json.loads(paired.read_text())
    for cell in committed["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{name}.ipynb is committed with outputs"
    source = [c.source for c in notebooks.read_notebook(name).cells]
    assert source == [c.source for c in jupytext.read(paired).cells], \
        f"{name}.ipynb differs from {name}.py: run `make notebooks-sync`"


@pytest.mark.parametrize("name", notebooks.available())
def test_every_notebook_has_profile_and_interactive_parameters(name):
    defaults = notebooks.parameter_defaults(name)
    assert {"profile", "interactive"} <= set(defaults)
    notebooks.validate_parameters(name, {"profile": "smoke", "interactive": False})


@pytest.fixture(scope="module")
def executed_00(tmp_path_factory):
    import os

    tmp = tmp_path_factory.mktemp("nb")
    old = os.environ.get("DECODELAB_LOCAL")
    os.environ["DECODELAB_LOCAL"] = str(tmp / "local")
    try:
        yield notebooks.run("00_environment", {"profile": "smoke", "interactive": False},
                            tmp / "executed", progress=False), tmp
    finally:
        if old is None:
            os.environ.pop("DECODELAB_LOCAL")
        else:
            os.environ["DECODELAB_LOCAL"] = old


def test_notebook_00_runs_and_shows_ceilings(executed_00):
    import nbformat

    path, tmp = executed_00
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert pngs, "the calibration figure is missing"
    text = json.dumps([o.get("data", {}).get("text/markdown", "") for o in outputs])
    assert "this machine" in text and "matmul_fp32" in text
    assert (tmp / "local" / "environment.csv").exists()


def test_report_export_is_self_contained(executed_00, tmp_path):
    path, _ = executed_00
    html = report.export([path], tmp_path / "report.html", "smoke").read_text()
    assert html.count("data:image/png;base64,") >= 1
    assert not re.findall(r"<script[^>]+src=\"https?://", html)
    assert not re.findall(r"<link[^>]+href=\"https?://", html)
    assert not re.findall(r"import\(\s*\"https?://", html)
    assert "decodelab report" in html and 'id="00_environment"' in html
    # code is hidden: the notebook's import line must not appear in the report
    assert "from decodelab.core.device import NotebookParams" not in html
