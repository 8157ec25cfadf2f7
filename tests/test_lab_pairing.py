"""JupyterLab's saves (``make lab``): every ``.ipynb`` is paired with its ``.py``
(``notebooks/jupytext.toml``), a save writes the edit into the ``.py`` and the ``.ipynb`` without
outputs, and a save that changes no source leaves both tracked files as git has them.

Through the REST contents API of a real server (started as ``make lab`` starts it, on a copy of
``notebooks/``); ``decodelab.lab.sources_only`` and ``without_version`` on their own too."""

import copy
import json
import shutil
import subprocess
import tomllib

import nbformat
import pytest

pytest.importorskip("jupyterlab")
jupytext = pytest.importorskip("jupytext")

from lab_server import CONTENTS_MANAGER, running_lab  # noqa: E402

from decodelab import notebooks  # noqa: E402
from decodelab.lab import sources_only, without_version  # noqa: E402

FOLDER = notebooks.paths.notebooks_dir()
NAMES = notebooks.available()


def _with_session_state(nb: dict) -> dict:
    """``nb`` as JupyterLab holds it after a run: outputs, execution counts, the runtime's
    metadata, widget state and this machine's kernelspec display name."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"run {i}\n"}]
        cell["execution_count"] = i + 1
        cell["metadata"].update(trusted=True, scrolled=True)
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    return nb


def test_jupytext_toml_pairs_every_notebook_with_its_py():
    config = tomllib.loads((FOLDER / "jupytext.toml").read_text())
    assert config["formats"] == "ipynb,py:percent"


def test_make_lab_starts_jupyterlab_with_the_contents_manager():
    out = subprocess.run(["make", "-n", "lab"], cwd=notebooks.paths.repo_root(),
                         capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
    lab = next(line for line in out.splitlines() if "-m jupyterlab" in line)
    assert CONTENTS_MANAGER in lab and "--ServerApp.root_dir=notebooks" in lab
    assert "token=..." not in out, "make lab must not print a placeholder URL"


@pytest.mark.parametrize("name", NAMES)
def test_sources_only_is_the_committed_ipynb(name):
    """A notebook with a session's outputs and metadata comes back as the committed file."""
    committed = (FOLDER / f"{name}.ipynb").read_text()
    nb = nbformat.reads(json.dumps(_with_session_state(json.loads(committed))), as_version=4)
    nb.metadata["kernelspec"]["display_name"] = "Python 3"  # save() keeps the file's one
    clean = sources_only(nb)
    assert nbformat.writes(clean) + "\n" == committed
    assert [c["id"] for c in clean.cells] == [c["id"] for c in json.loads(committed)["cells"]]


@pytest.mark.parametrize("name", NAMES)
def test_every_py_is_as_jupytext_writes_it(name):
    """Otherwise the first save in JupyterLab rewrites it (e.g. a second blank line after the
    header goes) although no source changed."""
    text = notebooks.source_path(name).read_text()
    nb = jupytext.reads(text, fmt="py:percent")
    assert without_version(jupytext.writes(nb, fmt="py:percent")) == text, \
        f"{name}.py is not in jupytext's form: `jupytext --to py:percent` rewrites it"


def test_without_version_drops_the_header_line_only():
    text = ("# ---\n# jupyter:\n#   jupytext:\n#     text_representation:\n"
            "#       format_version: '1.3'\n#       jupytext_version: 1.19.6\n# ---\n\n"
            "# %%\n#       jupytext_version: 9 (a comment in a cell stays)\n")
    assert without_version(text) == text.replace("#       jupytext_version: 1.19.6\n", "")
    plain = "# %%\nx = 1\n"
    assert without_version(plain) == plain


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    root.mkdir()
    for name in ["jupytext.toml"] + [f"{n}.{ext}" for n in NAMES for ext in ("py", "ipynb")]:
        shutil.copy2(FOLDER / name, root / name)
    with running_lab(root, tmp) as server:
        yield server, root


def _save(server, path: str, content: dict) -> None:
    server.api("PUT", f"contents/{path}",
               {"type": "notebook", "format": "json", "content": content})


@pytest.mark.parametrize("name", NAMES)
def test_a_save_that_changes_no_source_leaves_both_files_as_committed(lab, name):
    server, root = lab
    model = server.api("GET", f"contents/{name}.ipynb?content=1&type=notebook")
    _save(server, f"{name}.ipynb", _with_session_state(model["content"]))
    for ext in ("py", "ipynb"):
        assert (root / f"{name}.{ext}").read_bytes() == (FOLDER / f"{name}.{ext}").read_bytes(), \
            f"{name}.{ext} changed although no source did"


def test_an_edit_reaches_the_py_and_the_ipynb_keeps_no_outputs(lab):
    server, root = lab
    name = NAMES[-1]
    nb = server.api("GET", f"contents/{name}.ipynb?content=1&type=notebook")["content"]
    cell = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    cell["source"] += "\nprint('edited through the contents API')"
    _save(server, f"{name}.ipynb", _with_session_state(nb))
    py, ipynb = root / f"{name}.py", root / f"{name}.ipynb"
    assert "print('edited through the contents API')" in py.read_text()
    saved = json.loads(ipynb.read_text())
    assert not any(c.get("outputs") or c.get("execution_count") is not None
                   for c in saved["cells"] if c["cell_type"] == "code")
    assert saved["metadata"] == json.loads((FOLDER / ipynb.name).read_text())["metadata"]
    assert [c.source for c in jupytext.read(py).cells] == \
        [c.source for c in jupytext.read(ipynb).cells]
    # Opened again, the notebook has the edit (read from the .py) and no outputs.
    again = server.api("GET", f"contents/{name}.ipynb?content=1&type=notebook")["content"]
    assert again["cells"][nb["cells"].index(cell)]["source"] == cell["source"]
    assert not any(c.get("outputs") for c in again["cells"] if c["cell_type"] == "code")
