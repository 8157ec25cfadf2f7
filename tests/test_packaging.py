"""Packaging: environment.yml's pip section mirrors the pyproject's dependencies and takes the CPU
build of torch; every setup path brings JupyterLab; the Makefile has its targets."""

import re
import subprocess
import tomllib

from decodelab.core import paths

CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _project() -> dict:
    return tomllib.loads((paths.repo_root() / "pyproject.toml").read_text())["project"]


def _pip_lines() -> list[str]:
    text = (paths.repo_root() / "environment.yml").read_text()
    return re.findall(r'^\s+- "([^"]+)"$', text, re.M)


def test_environment_yml_mirrors_pyproject():
    project = _project()
    wanted = set(project["dependencies"])
    for extra in ("notebooks", "reference", "dev"):
        wanted |= set(project["optional-dependencies"][extra])
    listed = {line for line in _pip_lines() if not line.startswith("-")}
    assert wanted == listed


def test_environment_yml_takes_the_cpu_build_of_torch():
    """One `conda env create` on a CPU machine must not pull a CUDA torch: the CPU index is an
    option of the pip section, before any requirement."""
    lines = _pip_lines()
    assert lines[0] == CPU_INDEX
    assert lines[-1] == "-e .[notebooks,reference,dev]"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_jupyterlab_and_playwright_are_declared():
    project = _project()
    assert "jupyterlab" in _names(project["optional-dependencies"]["notebooks"])
    assert "playwright" in _names(project["optional-dependencies"]["dev"])
    for req in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        assert "<" in req, f"{req}: give it an upper bound"


def _make_dry_run(target: str, **variables: str) -> str:
    args = ["make", "-n", "-C", str(paths.repo_root()), target,
            *(f"{k}={v}" for k, v in variables.items())]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def test_make_targets_exist_and_say_what_they_run():
    fast = _make_dry_run("test-fast", STAMP="Makefile")  # STAMP: skip the set-up step
    assert '-m "not slow"' in fast
    lab = _make_dry_run("lab", STAMP="Makefile")
    assert "-m jupyterlab" in lab
    assert "notebooks" in lab
    assert "chromium" in _make_dry_run("browser")
    # The notebooks' kernels run in notebooks/: the report's lib must be an absolute path.
    report_gpu = _make_dry_run("report-gpu")
    assert f"PYTHONPATH={paths.repo_root() / 'lib'}" in report_gpu
    assert "report --profile gpu" in report_gpu
