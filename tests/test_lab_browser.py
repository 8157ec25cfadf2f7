"""The interactive path as a person meets it: JupyterLab serves notebook 01 (its explorer has
ipywidgets sliders when ``interactive=True``), headless Chromium opens it, runs every cell, moves
a slider, and the explorer's figure changes.

JupyterLab listens on loopback only, on a free port, with a token of our own; its settings,
runtime files and this run's results live in a temporary folder; the server and its kernels are
killed at the end whatever happens. Skips when Chromium, Playwright or JupyterLab is missing."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")
pytest.importorskip("ipywidgets")
playwright = pytest.importorskip("playwright.sync_api")

from decodelab import notebooks  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Playwright adds --headless itself.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = "01_dispatch"
# The explorer reads the stored results only (no measurement: the test is about the widgets).
OVERRIDES = {"profile": "smoke", "interactive": True, "measure_live": False}
START_TIMEOUT_S = 120
RUN_TIMEOUT_MS = 300_000
FIGURE = ".widget-interact img"  # the explorer's figure, in the output of widgets.interact


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_notebook(root: Path) -> Path:
    """Notebook 01 as papermill would run it: the overrides in a cell after the parameters."""
    import nbformat

    nb = notebooks.read_notebook(NOTEBOOK)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "\n".join(f"{k} = {v!r}" for k, v in OVERRIDES.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    path = root / f"{NOTEBOOK}.ipynb"
    nbformat.write(nb, path)
    return path


def _up(port: int, token: str) -> bool:
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200 and "started" in json.loads(resp.read())
    except OSError:
        return False


def _start_lab(root: Path, tmp: Path, token: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               DECODELAB_LOCAL=str(tmp / "local"), DECODELAB_FIGURES=str(tmp / "figures"))
    log = tmp / "lab.log"
    for _ in range(3):  # a port taken between probe and bind, or a slow first start: retry
        port = _free_port()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
               "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        proc = subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _up(port, token):
                return proc, port
            time.sleep(0.5)
        _stop(proc)
    pytest.fail(f"JupyterLab did not start: {log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """End the server and its kernels (one process group, started by this test)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


@contextmanager
def _lab(tmp: Path):
    root = tmp / "root"
    root.mkdir()
    _write_notebook(root)
    token = secrets.token_hex(16)
    proc, port = _start_lab(root, tmp, token)
    try:
        yield f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}.ipynb?token={token}"
    finally:
        _stop(proc)


def _figure_src(page) -> str | None:
    imgs = page.locator(FIGURE)
    return imgs.last.get_attribute("src") if imgs.count() else None


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (`make test` "
                    "installs Debian's chromium when apt-get is available and it runs as root)")
def test_explorer_slider_changes_the_figure(tmp_path):
    with _lab(tmp_path) as url, playwright.sync_playwright() as pw:
        # A fresh profile folder (Playwright passes it as --user-data-dir).
        browser = pw.chromium.launch_persistent_context(
            tmp_path / "profile", executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(url, timeout=RUN_TIMEOUT_MS)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=RUN_TIMEOUT_MS)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell"
                                   ".currentWidget && window.jupyterapp.shell.currentWidget"
                                   ".sessionContext.session?.kernel", timeout=RUN_TIMEOUT_MS)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            slider = page.locator(".widget-slider").first
            slider.wait_for(timeout=RUN_TIMEOUT_MS)
            page.wait_for_selector(FIGURE, timeout=RUN_TIMEOUT_MS)
            before = _figure_src(page)
            readout = slider.locator(".widget-readout")
            old_value = readout.inner_text()
            handle = slider.locator(".noUi-handle").first
            handle.scroll_into_view_if_needed()
            handle.focus()
            page.keyboard.press("End")  # the slider's last value: another configuration
            page.wait_for_function(
                "([sel, old]) => { const i = document.querySelectorAll(sel);"
                " return i.length && i[i.length - 1].src !== old; }",
                arg=[FIGURE, before], timeout=RUN_TIMEOUT_MS)
            after = _figure_src(page)
            assert readout.inner_text() != old_value, "the slider did not move"
            assert before.startswith("data:image/png") and after.startswith("data:image/png")
            assert after != before, "the explorer's figure did not change"
            errors = page.locator(".jp-OutputArea-output[data-mime-type="
                                  "'application/vnd.jupyter.stderr'] >> text=Traceback")
            assert errors.count() == 0
        finally:
            browser.close()
