"""The consolidated report: notebook 05 built from a (synthetic) reference tree, the whole report
built on CPU from the shipped reference data, and the exported HTML rendered in headless Chromium:
every figure present and loaded, nothing fetched from the network, the summary before the first
chapter, no table with a bare positional index or wider than the page, no log line and no path
outside the repository in the text."""

import html
import json
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import synthetic

pytest.importorskip("papermill")
pytest.importorskip("nbconvert")

from decodelab import cli, notebooks, report  # noqa: E402
from decodelab.core import paths

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (`make test` installs Debian's "
    "chromium when apt-get is available and it runs as root)")

# Appended to a copy of the report: after the load event it records, on <body>, how many images
# there are, how many are data URIs, how many failed to decode, any resource not from the page
# itself (data:/file:/blob:), whether the summary comes before the first chapter, the tables
# whose rows are headed by a bare positional index (0, 1, 2, ...) and the tables that reach
# past the page's right edge.
CHECK_SCRIPT = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  var remote = performance.getEntriesByType('resource').map(function (e) { return e.name; })
    .filter(function (n) { return !/^(data|file|blob):/.test(n); });
  var tables = Array.prototype.slice.call(document.querySelectorAll('table'));
  var positional = tables.filter(function (t) {
    var rows = t.tBodies.length ? Array.prototype.slice.call(t.tBodies[0].rows) : [];
    var heads = rows.map(function (r) { var c = r.cells[0];
      return c && c.tagName === 'TH' ? c.textContent.trim() : null; });
    return heads.length > 0 && heads.every(function (h, i) {
      return h !== null && /^-?[0-9]+$/.test(h) && (i === 0 || +h === +heads[i - 1] + 1); });
  });
  var page = document.documentElement.clientWidth;
  var wide = tables.filter(function (t) { return t.getBoundingClientRect().right > page + 1; });
  var summary = document.getElementById('summary');
  var chapter = document.querySelector('a[id$="_environment"], a[id^="0"]');
  document.body.setAttribute('data-report-check', JSON.stringify({
    images: imgs.length,
    data_images: imgs.filter(function (i) { return i.src.indexOf('data:image/') === 0; }).length,
    broken: broken.length, remote: remote, tables: tables.length,
    positional_index: positional.map(function (t) { return t.innerText.slice(0, 80); }),
    too_wide: wide.map(function (t) { return t.innerText.slice(0, 80); }),
    summary_first: !!(summary && chapter &&
      (summary.compareDocumentPosition(chapter) & Node.DOCUMENT_POSITION_FOLLOWING))}));
});
</script>"""
# An absolute path (two or more segments) not preceded by a word, a dot or a URL scheme.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\\])/(?:[\w.+-]+/)+[\w.+-]*")


@contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def render(report_html: Path, tmp: Path) -> dict:
    """Load the report in headless Chromium; return the in-page check's findings."""
    page = tmp / "checked.html"
    text = report_html.read_text()
    page.write_text(text.replace("</body>", CHECK_SCRIPT + "</body>"))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--window-size=1280,1000",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=10000",
           "--dump-dom", page.resolve().as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    match = re.search(r'data-report-check="([^"]*)"', out.stdout)
    assert match, f"the page's check did not run (rc={out.returncode}): {out.stderr[-2000:]}"
    return json.loads(html.unescape(match.group(1)))


def visible_text(report_html: str) -> str:
    """The report's text as a reader sees it (no scripts, styles, image data or tags)."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", report_html, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", text)
    return html.unescape(text)


def assert_reads_as_a_document(check: dict, report_html: str) -> None:
    assert check["summary_first"], "the summary does not come before the first chapter"
    assert check["positional_index"] == [], check["positional_index"]
    assert check["too_wide"] == [], check["too_wide"]
    text = visible_text(report_html)
    assert "[bench]" not in text
    outside = [m.group(0) for m in ABSOLUTE_PATH.finditer(text)] + re.findall(r"\.\./\S*", text)
    assert outside == [], f"paths outside the repository: {outside[:5]}"


_TABLE = re.compile(r'<table[^>]*data-units="([^"]*)"[^>]*>(.*?)</table>', re.S)
_ROW = re.compile(r"<tr[^>]*>(.*?)</tr>", re.S)
_CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)
_NOT_A_SHARE = ("ns", "us", "ms", "s", "cycles", "count", "bytes", "MiB", "GiB", "GB/s", "TB/s",
                "TFLOP/s", "tokens/s", "steps/s", "req/s")


def unit_problems(report_html: str) -> list[str]:
    """Every table show_table rendered, cell by cell against its column's declared unit: a
    count or a time never written as a percentage or a ratio, a fraction always as a
    percentage, a ratio always with "x", and no numeric column without a declared unit."""
    problems = []
    for units, body in _TABLE.findall(report_html):
        kinds = units.split("|")
        for row in _ROW.findall(body):
            cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in _CELL.findall(row)]
            for kind, cell in zip(kinds, cells, strict=False):
                if cell in ("–", ""):
                    continue
                if kind == "none":
                    problems.append(f"undeclared unit: {cell!r} in {cells[:3]}")
                elif kind in _NOT_A_SHARE and cell.endswith(("%", "x")):
                    problems.append(f"{kind} written as {cell!r} in {cells[:3]}")
                elif kind == "fraction" and not cell.endswith("%"):
                    problems.append(f"fraction written as {cell!r} in {cells[:3]}")
                elif kind == "ratio" and not cell.endswith("x"):
                    problems.append(f"ratio written as {cell!r} in {cells[:3]}")
    return problems


def _png_outputs(executed: Path) -> int:
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))


def _errors(executed: Path) -> list[str]:
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


@pytest.fixture(scope="module")
def synthetic_05(tmp_path_factory):
    """Notebook 05 run against a synthetic H200 reference tree, exported as a report."""
    root = tmp_path_factory.mktemp("root")
    (root / "notebooks").symlink_to(paths.notebooks_dir(), target_is_directory=True)
    synthetic.write_reference_tree(root)
    figures = root / "figures"
    with _env(DECODELAB_ROOT=root, DECODELAB_LOCAL=root / "local", DECODELAB_FIGURES=figures):
        executed = notebooks.run("05_report", {"profile": "smoke", "interactive": False},
                                 root / "executed", progress=False)
        page = report.export([executed], root / "report.html", "smoke")
    return executed, page, figures


def test_report_notebook_shows_the_decomposition_from_reference(synthetic_05):
    executed, page, figures = synthetic_05
    assert not _errors(executed)
    assert _png_outputs(executed) >= 1
    assert (figures / "headline_decomposition.png").stat().st_size > 0
    regimes_md = (figures / "headline_regimes.md").read_text()
    assert "| eager | ultra-light | 60 | dispatch | 80% |" in regimes_md
    text = page.read_text()
    for expected in ("dominant", "seed reported", "agrees?", "Pre-Graph", "persistent kernel",
                     "runtime loop", 'href="#01_dispatch"'):
        assert expected in text, expected
    assert "no data yet" not in text
    assert "data/reference/h200/" in text  # the provenance section names the reference data
    assert "tensor parallel" in text and "comm" in text
    assert text.index('id="summary"') < text.index('id="05_report"') < text.index(
        'id="conclusions"')
    assert text.count("data-units=") >= 3 and unit_problems(text) == []


def test_report_notebook_without_data_says_so(tmp_path):
    (tmp_path / "notebooks").symlink_to(paths.notebooks_dir(), target_is_directory=True)
    # The reference folder exists (a folder that does not is refused up front) but is empty.
    (tmp_path / "data" / "reference" / "h200").mkdir(parents=True)
    with _env(DECODELAB_ROOT=tmp_path, DECODELAB_LOCAL=tmp_path / "local",
              DECODELAB_FIGURES=tmp_path / "figures"):
        executed = notebooks.run("05_report", {"profile": "smoke", "interactive": False},
                                 tmp_path / "executed", progress=False)
    assert not _errors(executed)
    assert "no data yet for table `dispatch`" in executed.read_text()


@needs_chromium
def test_synthetic_report_renders_in_chromium(synthetic_05, tmp_path):
    _, page, _ = synthetic_05
    check = render(page, tmp_path)
    assert check["images"] >= 1 and check["data_images"] == check["images"]
    assert check["broken"] == 0 and check["remote"] == []
    assert check["tables"] >= 3
    assert_reads_as_a_document(check, page.read_text())


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    """`python -m decodelab report --profile smoke` on this checkout (its shipped reference
    data and live CPU measurements), results and figures in temporary folders."""
    tmp = tmp_path_factory.mktemp("report")
    with _env(DECODELAB_LOCAL=tmp / "local"):
        assert cli.main(["report", "--profile", "smoke", "--out", str(tmp / "out")]) == 0
    return tmp / "out"


@pytest.mark.slow
def test_full_report_builds_on_cpu(full_report):
    executed = sorted((full_report / "executed").glob("*.ipynb"))
    assert [p.stem for p in executed] == notebooks.available()
    for path in executed:
        assert not _errors(path), path.name
    text = (full_report / cli.REPORT_FILE).read_text()
    for name in notebooks.available():
        assert f'id="{name}"' in text
    pngs = sum(_png_outputs(p) for p in executed)
    assert text.count("data:image/png;base64,") >= pngs >= 1
    # every table of the report, written by its columns' declared units (issue 25.8)
    assert text.count("data-units=") >= 30
    assert unit_problems(text) == []


@pytest.mark.slow
@needs_chromium
def test_full_report_renders_in_chromium(full_report, tmp_path):
    page = full_report / cli.REPORT_FILE
    check = render(page, tmp_path)
    assert check["images"] == page.read_text().count('src="data:image/')
    assert check["images"] >= 1 and check["broken"] == 0 and check["remote"] == []
    assert_reads_as_a_document(check, page.read_text())
