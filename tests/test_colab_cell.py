"""The Colab / Kaggle first cell (``notebooks/colab_setup.py``, shown verbatim in the README):
in a fresh interpreter where ``decodelab`` is not importable it clones, installs, and imports in
one run, without a restart; run again in the same interpreter, and in a new one, it still works.

The clone comes from this repository through a ``file://`` URL and pip installs with no index:
everything the package needs is already in this test's environment, seen through a ``.pth``
file that leaves this checkout's own ``decodelab`` out."""

import os
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from decodelab.core import paths

CELL = paths.notebooks_dir() / "colab_setup.py"


def test_readme_shows_the_cell_verbatim():
    readme = (paths.repo_root() / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert CELL.read_text() in blocks, \
        "README's Colab cell differs from notebooks/colab_setup.py: paste the file"


def _deps_without_decodelab(tmp: Path) -> Path:
    """This environment's site-packages, without the editable ``decodelab`` (links)."""
    site = Path(sysconfig.get_paths()["purelib"])
    view = tmp / "deps"
    view.mkdir()
    for entry in site.iterdir():
        if "decodelab" not in entry.name.lower() and entry.suffix != ".pth":
            (view / entry.name).symlink_to(entry)
    return view


def _fresh_python(tmp: Path) -> Path:
    """A new virtual environment (with pip) that sees the dependencies but not decodelab."""
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The venv's own old setuptools would shadow the environment's newer one (which builds
    # editable wheels without the `wheel` package).
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"],
                   capture_output=True, check=False)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    # A plain path line: .pth files inside the view are not processed, so nothing of the
    # checkout's editable install leaks in.
    Path(site.stdout.strip(), "deps.pth").write_text(f"{_deps_without_decodelab(tmp)}\n")
    return python


def _run(python: Path, code: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECODELAB_", "PYTHON"))}
    # No index and no build isolation: pip resolves from what the environment already has.
    env.update(HOME=str(home), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1", GIT_TERMINAL_PROMPT="0")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          cwd=home, timeout=600, check=False)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    if subprocess.run(["git", "-C", str(paths.repo_root()), "rev-parse", "HEAD"],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout: nothing to clone")
    tmp = tmp_path_factory.mktemp("colab")
    home = tmp / "home"
    home.mkdir()
    return _fresh_python(tmp), home


def _cell_with_url(url: str) -> str:
    source, n = re.subn(r'^REPO_URL = "[^"]*"', f"REPO_URL = {url!r}", CELL.read_text(),
                        count=1, flags=re.M)
    assert n == 1, "the cell must set REPO_URL on a line of its own"
    return source


def test_decodelab_is_not_importable_before_the_cell(sandbox):
    python, home = sandbox
    out = _run(python, "import decodelab", home)
    assert out.returncode != 0 and "No module named 'decodelab'" in out.stderr
    assert _run(python, "import torch, pandas", home).returncode == 0


def test_cell_refuses_the_placeholder_url(sandbox, tmp_path):
    python, _ = sandbox
    out = _run(python, CELL.read_text(), tmp_path)
    assert out.returncode != 0
    assert "set REPO_URL (top of this cell)" in out.stderr
    assert not (tmp_path / "decodelab").exists()


def test_cell_installs_and_imports_in_one_run_and_reruns(sandbox):
    python, home = sandbox
    source = _cell_with_url(paths.repo_root().resolve().as_uri())
    checkout = home / "decodelab"
    # Two runs in one interpreter, as a notebook re-runs a cell; the current folder differs.
    twice = (f"src = {source!r}\n"
             "exec(compile(src, 'cell', 'exec'), {})\n"
             "import os; print('cwd', os.getcwd())\n"
             "exec(compile(src, 'cell', 'exec'), {})\n")
    first = _run(python, twice, home)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    loaded = [s for s in lines if s.startswith("decodelab from ")]
    assert len(loaded) == 2
    assert first.stderr.count("Cloning into") == 1  # the second run reuses the clone
    assert all(s.startswith(f"decodelab from {checkout / 'lib' / 'decodelab'};") for s in loaded)
    assert f"cwd {checkout / 'notebooks'}" in lines
    assert (checkout / ".git").is_dir() and (checkout / "notebooks" / "05_report.py").exists()
    # A new interpreter (a restarted runtime) finds pip's editable install and the clone.
    again = _run(python, source + "\nfrom decodelab.core import paths\n"
                 "print('root', paths.repo_root())\n", home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"root {checkout}" in again.stdout
    assert "Cloning" not in again.stderr
    show = _run(python, "import importlib.metadata as m; print(m.distribution('decodelab')"
                ".read_text('direct_url.json'))", home)
    assert '"editable": true' in show.stdout and checkout.as_uri() in show.stdout
