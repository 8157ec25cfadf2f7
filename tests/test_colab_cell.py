"""The Colab / Kaggle first cell (``notebooks/colab_setup.py``, shown verbatim in the README):
in a fresh interpreter where ``decodelab`` is not importable it clones, installs the package
with what its notebooks need, and imports in one run, without a restart; run again in the same
interpreter, and in a new one, it still works; then ``python -m decodelab run`` runs a notebook.

The environment stands in for a Colab runtime: torch, the scientific stack and the runtime's
own Jupyter (ipykernel, ipywidgets, JupyterLab) are this test's environment, seen through a
``.pth`` file that leaves out this checkout's own ``decodelab`` and the packages the cell must
install (papermill, nbformat, nbconvert, jupytext). The clone comes from this repository through
a ``file://`` URL; pip installs with no index, those packages from wheels packed here from this
environment's installed copies."""

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from decodelab.core import paths

CELL = paths.notebooks_dir() / "colab_setup.py"
RUNTIME_OWN = {"jupyterlab", "ipykernel", "ipywidgets"}  # as in the cell


def _to_install() -> list[str]:
    """The distributions of the ``notebooks`` extra the cell installs (the runtime has the rest)."""
    extra = tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["notebooks"]
    names = [re.match(r"[\w.-]+", r)[0].lower() for r in extra]
    return [n for n in names if n not in RUNTIME_OWN]


def test_readme_shows_the_cell_verbatim():
    readme = (paths.repo_root() / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert CELL.read_text() in blocks, \
        "README's Colab cell differs from notebooks/colab_setup.py: paste the file"


def _top_level_entries(name: str) -> set[str]:
    """The entries of site-packages that distribution ``name`` installed (packages, dist-info)."""
    return {Path(f).parts[0] for f in metadata.distribution(name).files
            if not str(f).startswith("..")}


def _deps_view(tmp: Path) -> Path:
    """This environment's site-packages (links), without the editable ``decodelab`` and the
    distributions the cell must install."""
    site = Path(sysconfig.get_paths()["purelib"])
    hidden = set().union(*(_top_level_entries(n) for n in _to_install()))
    view = tmp / "deps"
    view.mkdir()
    for entry in site.iterdir():
        if ("decodelab" not in entry.name.lower() and entry.suffix != ".pth"
                and entry.name not in hidden):
            (view / entry.name).symlink_to(entry)
    return view


def _record_line(arcname: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


def _wheel(name: str, into: Path) -> Path:
    """A wheel of installed pure-Python distribution ``name``, packed from its RECORD: its
    files in site-packages, its data files (share/...) under .data/data/, no scripts (pip makes
    them from the entry points) and a new RECORD."""
    dist = metadata.distribution(name)
    site, prefix = Path(dist.locate_file("")), Path(sys.prefix).resolve()
    stem = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}"
    info = next(p for p in map(str, dist.files) if p.endswith(".dist-info/METADATA"))
    info_dir = info.rsplit("/", 1)[0]
    rows = []
    target = into / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as whl:
        for f in dist.files:
            path = (site / f).resolve()
            if not path.is_file() or "__pycache__" in path.parts or f.name in (
                    "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            if str(f).startswith(".."):
                rel = path.relative_to(prefix)
                if rel.parts[0] == "bin":
                    continue
                arcname = f"{stem}.data/data/{rel.as_posix()}"
            else:
                arcname = Path(f).as_posix()
            data = path.read_bytes()
            whl.writestr(arcname, data)
            rows.append(_record_line(arcname, data))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(rows + [[f"{info_dir}/RECORD", "", ""]])
        whl.writestr(f"{info_dir}/RECORD", record.getvalue())
    return target


def _wheelhouse(tmp: Path) -> Path:
    folder = tmp / "wheels"
    folder.mkdir()
    for name in _to_install():
        _wheel(name, folder)
    return folder


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
    Path(site.stdout.strip(), "deps.pth").write_text(f"{_deps_view(tmp)}\n")
    return python


def _run(python: Path, code: str, home: Path, *args: str,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` (or, with ``code=""``, ``python ARGS``) as a Colab cell or a ``!``
    line would run it: home in the sandbox, pip with no index but the packed wheels."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DECODELAB_", "PYTHON", "JUPYTER", "PIP_"))}
    # No build isolation: pip builds decodelab with what the environment already has.
    env.update(HOME=str(home), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",
               PIP_FIND_LINKS=str(home.parent / "wheels"),
               PIP_DISABLE_PIP_VERSION_CHECK="1", GIT_TERMINAL_PROMPT="0")
    command = [python, "-c", code] if code else [python, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd or home,
                          timeout=600, check=False)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    if subprocess.run(["git", "-C", str(paths.repo_root()), "rev-parse", "HEAD"],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout: nothing to clone")
    tmp = tmp_path_factory.mktemp("colab")
    home = tmp / "home"
    home.mkdir()
    _wheelhouse(tmp)
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
    assert _run(python, "import torch, pandas, ipykernel, ipywidgets", home).returncode == 0
    for module in ("papermill", "nbformat", "jupytext"):  # the cell must bring them
        out = _run(python, f"import {module}", home)
        assert out.returncode != 0 and f"No module named '{module}'" in out.stderr


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
    # The cell installed the notebook packages into the runtime and left its Jupyter alone.
    site = Path(_run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     home).stdout.strip())
    entries = {p.name.split("-")[0].lower() for p in site.iterdir()}
    assert set(_to_install()) <= entries and not RUNTIME_OWN & entries
    # A notebook runs from the command line, as `!python -m decodelab run ...` in a cell.
    run = _run(python, "", home, "-m", "decodelab", "run", "00_environment", "--profile",
               "smoke", cwd=checkout / "notebooks")
    assert run.returncode == 0, run.stderr[-3000:]
    executed = checkout / "data" / "local" / "executed" / "00_environment.ipynb"
    assert f"executed notebook: {executed}" in run.stdout
