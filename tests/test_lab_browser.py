"""The interactive path as a person meets it, in JupyterLab started as ``make lab`` starts it
(tests/lab_server.py) and driven by headless Chromium:

- notebook 01 (its explorer has ipywidgets sliders when ``interactive=True``): run every cell,
  move a slider, and the explorer's figure changes;
- a notebook of the repository with its paired ``.py`` (``notebooks/jupytext.toml``): edit a
  cell, run it, save; the edit reaches the ``.py`` and the ``.ipynb`` keeps no outputs.

Skips when Chromium, Playwright or JupyterLab is missing."""

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")
pytest.importorskip("ipywidgets")
playwright = pytest.importorskip("playwright.sync_api")

from lab_server import running_lab  # noqa: E402

from decodelab import notebooks  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (`make test` installs "
    "Debian's chromium when apt-get is available and it runs as root)")]

# Playwright adds --headless itself.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = "01_dispatch"
# The explorer reads the stored results only (no measurement: the test is about the widgets).
OVERRIDES = {"profile": "smoke", "interactive": True, "measure_live": False}
RUN_TIMEOUT_MS = 300_000
# Checks in the page poll on a timer: Playwright's default (requestAnimationFrame) may stall in a
# headless page that draws nothing, and the check would then never run again.
POLL_MS = 250
UPDATE_TIMEOUT_MS = 60_000  # one explorer update, once its first figure is there
FIGURE = ".widget-interact img"  # the explorer's figure, in the output of widgets.interact
EDITED = "00_environment"  # the notebook the edit test changes (a copy of it)


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


@contextmanager
def _lab(tmp: Path, fill=_write_notebook):
    """JupyterLab on a folder that ``fill(root)`` fills; yields (server, root)."""
    root = tmp / "root"
    root.mkdir()
    fill(root)
    with running_lab(root, tmp) as lab:
        yield lab, root


@contextmanager
def _browser(tmp: Path):
    with playwright.sync_playwright() as pw:
        # A fresh profile folder (Playwright passes it as --user-data-dir).
        browser = pw.chromium.launch_persistent_context(
            tmp / "profile", executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _open(page, lab, name: str) -> None:
    """Open notebook ``name`` in JupyterLab and wait for its kernel."""
    page.goto(lab.url(f"lab/tree/{name}?token={lab.token}"), timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=RUN_TIMEOUT_MS)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell"
                           ".currentWidget && window.jupyterapp.shell.currentWidget"
                           ".sessionContext.session?.kernel", timeout=RUN_TIMEOUT_MS,
                           polling=POLL_MS)


def _figure_src(page) -> str | None:
    imgs = page.locator(FIGURE)
    return imgs.last.get_attribute("src") if imgs.count() else None


def test_explorer_slider_changes_the_figure(tmp_path):
    with _lab(tmp_path) as (lab, _), _browser(tmp_path) as page:
        _open(page, lab, f"{NOTEBOOK}.ipynb")
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
        try:
            page.wait_for_function(
                "([sel, old]) => { const i = document.querySelectorAll(sel);"
                " return i.length && i[i.length - 1].src !== old; }",
                arg=[FIGURE, before], timeout=UPDATE_TIMEOUT_MS, polling=POLL_MS)
        except playwright.TimeoutError:
            kernel = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext"
                                   ".session?.kernel?.status")
            pytest.fail(f"the figure did not change: the slider reads {readout.inner_text()} "
                        f"(was {old_value}), kernel {kernel}, the explorer shows "
                        f"{page.locator('.widget-interact').last.inner_text()[:800]!r}")
        after = _figure_src(page)
        assert readout.inner_text() != old_value, "the slider did not move"
        assert before.startswith("data:image/png") and after.startswith("data:image/png")
        assert after != before, "the explorer's figure did not change"
        said = page.locator(".widget-interact").last.inner_text()
        assert f"H={readout.inner_text()}," in said and "easured" in said, \
            "the explorer does not say which configuration it shows"
        errors = page.locator(".jp-OutputArea-output[data-mime-type="
                              "'application/vnd.jupyter.stderr'] >> text=Traceback")
        assert errors.count() == 0


def _copy_pair(root: Path) -> None:
    """The repository's pairing config and one notebook's pair, as they are in notebooks/."""
    folder = notebooks.paths.notebooks_dir()
    for name in ("jupytext.toml", f"{EDITED}.py", f"{EDITED}.ipynb"):
        shutil.copy2(folder / name, root / name)


def _wait_for(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return predicate()


def test_an_edit_saved_in_jupyterlab_reaches_the_py_and_leaves_no_outputs(tmp_path):
    """Type into the parameters cell, run it (an output shows), save with Ctrl+S: the ``.py``
    holds the edit, the ``.ipynb`` the same sources and no outputs, and the page keeps the
    output it showed."""
    marker = "print('edited in JupyterLab')"
    with _lab(tmp_path, fill=_copy_pair) as (lab, root), _browser(tmp_path) as page:
        py, ipynb = root / f"{EDITED}.py", root / f"{EDITED}.ipynb"
        _open(page, lab, ipynb.name)
        editor = page.locator(".jp-CodeCell .cm-content").first  # the parameters cell
        editor.click()
        page.keyboard.press("Control+End")
        page.keyboard.type(f"\n{marker}")
        page.keyboard.press("Shift+Enter")  # run it: its output appears below it
        page.wait_for_selector(".jp-OutputArea-output >> text=edited in JupyterLab",
                               timeout=RUN_TIMEOUT_MS)
        page.keyboard.press("Control+s")
        assert _wait_for(lambda: marker in py.read_text()), "the edit did not reach the .py"
        assert _wait_for(lambda: marker in ipynb.read_text())
        saved = json.loads(ipynb.read_text())
        assert all(not c.get("outputs") and c.get("execution_count") is None
                   for c in saved["cells"] if c["cell_type"] == "code"), \
            "the saved .ipynb holds outputs"
        assert saved["metadata"] == json.loads(
            (notebooks.paths.notebooks_dir() / ipynb.name).read_text())["metadata"]
        import jupytext

        assert [c.source for c in jupytext.read(py).cells] == \
            [c.source for c in jupytext.read(ipynb).cells]
        assert page.locator(".jp-OutputArea-output >> text=edited in JupyterLab").count() == 1
