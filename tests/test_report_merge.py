"""How the report is assembled (no notebook runs): title, summary, where the numbers come from,
chapters, conclusions; and what stays out (stderr, log lines, progress widgets, checkout paths)."""

import pytest

nbformat = pytest.importorskip("nbformat")

from decodelab import report  # noqa: E402
from decodelab.core import paths  # noqa: E402

v4 = nbformat.v4


def _notebook(path, cells):
    nb = v4.new_notebook()
    nb.cells = cells
    nbformat.write(nb, path)
    return path


def _code(*outputs, tags=()):
    cell = v4.new_code_cell("x = 1")
    cell.outputs = list(outputs)
    cell.metadata["tags"] = list(tags)
    return cell


def _markdown(text, tags=()):
    cell = v4.new_markdown_cell(text)
    cell.metadata["tags"] = list(tags)
    return cell


def _display(mime, value):
    return v4.new_output("display_data", data={mime: value})


@pytest.fixture
def executed(tmp_path):
    root = str(paths.repo_root())
    first = _notebook(tmp_path / "00_first.ipynb", [
        _markdown("# 00 · First chapter"),
        _code(v4.new_output("stream", name="stderr", text="USDT: profiler_start\n"),
              v4.new_output("stream", name="stdout",
                            text="[bench] runtime: batch 4\nkept line\n[tp rank 0  2.2 s] done\n"),
              _display("application/vnd.jupyter.widget-view+json", {"model_id": "m"}),
              _display("text/markdown", f"wrote `{root}/data/local/x.csv`"))])
    report_nb = _notebook(tmp_path / "05_report.ipynb", [
        _markdown("# 05 · The report chapter"),
        _markdown("## Summary", tags=[report.SUMMARY_TAG]),
        _code(_display("text/markdown", "headline table"), tags=[report.SUMMARY_TAG]),
        _code(_display("text/markdown", "a detail")),
        _markdown("## Conclusions", tags=[report.CONCLUSIONS_TAG]),
        _code(_display("text/markdown", "what comes next"), tags=[report.CONCLUSIONS_TAG])])
    return [first, report_nb]


def _text(cell) -> str:
    if cell.cell_type == "markdown":
        return cell.source
    return "".join(o.get("text", "") + str(o.get("data", {})) for o in cell.outputs)


def test_summary_first_conclusions_last(executed):
    cells = report.merge(executed, "smoke").cells
    texts = [_text(c) for c in cells]

    def at(snippet: str) -> int:
        return next(i for i, t in enumerate(texts) if snippet in t)

    assert at("# decodelab report") == 0
    assert at('id="summary"') < at("## Summary") < at("headline table") < at(
        "Where the numbers come from") < at('id="00_first"') < at("# 00 · First") < at(
        'id="05_report"') < at("a detail") < at('id="conclusions"') < at("## Conclusions") < at(
        "what comes next") == len(cells) - 1
    assert sum("headline table" in t for t in texts) == 1  # moved, not copied


def test_what_the_notebook_prints_for_its_watcher_stays_out(executed):
    cells = report.merge(executed, "smoke").cells
    first = next(c for c in cells if c.cell_type == "code" and "kept line" in _text(c))
    assert [o.output_type for o in first.outputs] == ["stream", "display_data"]
    assert first.outputs[0].text == "kept line\n"
    assert first.outputs[1].data["text/markdown"] == "wrote `data/local/x.csv`"
    whole = "".join(_text(c) for c in cells)
    for noise in ("[bench]", "[tp rank", "USDT", "widget-view", str(paths.repo_root())):
        assert noise not in whole, noise


def test_provenance_lists_live_tables_and_references(tmp_path, monkeypatch):
    import synthetic

    from decodelab.core.results import write_table

    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    monkeypatch.setenv("DECODELAB_REFERENCE", str(tmp_path / "data" / "reference"))
    assert "nothing" in report.live_markdown()
    assert "No shipped reference" in report.reference_markdown()
    frame = synthetic.tables()["runtime"].drop(columns=["origin", "device"])
    write_table("runtime", frame, out_dir=tmp_path / "local", profile="cpu",
                info=synthetic.FakeInfo(label="cpu"))
    synthetic.write_reference_tree(tmp_path, names=("dispatch", "tp"))
    live, refs = report.live_markdown(), report.reference_markdown()
    assert "`runtime` (3 rows, profile cpu, cpu," in live
    assert "`data/reference/h200/` (1 tables: dispatch)" in refs
    assert "`data/reference/h200x2/` (1 tables: tp)" in refs
    page = report.provenance_markdown("cpu", ["00_environment"])
    assert "| commit |" in page and "[Summary](#summary)" in page and "[Conclusions]" in page
