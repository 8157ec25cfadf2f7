"""Export executed notebooks as one self-contained HTML report (figures embedded, code hidden).

The report reads as a document: a title, the summary (the cells of notebook 05 tagged
``report-summary``: headline figure, regime table, findings), where its numbers come from (this
run's device and commit, what this machine measured live, which shipped references were read),
the chapters, and the conclusions (05's cells tagged ``report-conclusions``) at the end.

Nothing meant for the notebook leaks into it: stderr, library log lines (``[bench] ...``),
progress widgets and absolute paths of this checkout are left out. It opens offline: every script
or stylesheet the template would fetch from the network is removed (figures are static PNGs
embedded as data URIs; interactive widgets are a notebook feature, the report shows their static
fallbacks).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
from pathlib import Path

from decodelab.core import paths
from decodelab.core.device import collect_info
from decodelab.core.results import _atomic_write

SUMMARY_TAG, CONCLUSIONS_TAG = "report-summary", "report-conclusions"
_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>", re.I)
_REMOTE_LINK = re.compile(r"<link[^>]*\bhref=\"https?://[^\"]*\"[^>]*>", re.I)
# Inline scripts that would import from the network (the template's MathJax/mermaid loaders).
_FETCHING_SCRIPT = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://(?:(?!</script>).)*</script>",
                              re.I | re.S)
# Lines a library writes for whoever watches a run: "[bench] ...", "[tp rank 0 ...]", profiler
# and kernel-transport notices.
_LOG_LINE = re.compile(r"^\s*(\[[\w .:/-]+\]|USDT:|\[IPKernelApp\])|without encryption", re.M)
_WIDGET = "application/vnd.jupyter.widget-view+json"
# Tables and figures never wider than the page: long cells wrap instead.
_PAGE_CSS = """<style>
.jp-RenderedHTMLCommon table { max-width: 100%; table-layout: auto; }
.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th { white-space: normal;
  overflow-wrap: break-word; }
.jp-RenderedImage img, .jp-RenderedHTMLCommon img { max-width: 100%; height: auto; }
</style>"""


def _reference_line(folder: Path) -> str | None:
    metas = [json.loads(m.read_text()) for m in sorted(folder.glob("*.meta.json"))]
    if not metas:
        return None
    dev = metas[0].get("device", {})
    dates = sorted(m.get("created_utc", "") for m in metas)
    commits = sorted({str(m.get("device", {}).get("git_commit", "?")) for m in metas})
    hardware = html.escape(str(dev.get("gpu_name") or dev.get("cpu_model", "?")))
    return (f"- `data/reference/{folder.name}/` ({len(metas)} tables: "
            f"{', '.join(m.get('table', '?') for m in metas)}): {hardware}, "
            f"torch {dev.get('torch_version', '?')}, CUDA {dev.get('cuda_version') or 'none'}, "
            f"driver {dev.get('driver') or 'none'}, commit{'s' if len(commits) > 1 else ''} "
            f"{', '.join(commits)}, measured {dates[0][:16]} to {dates[-1][:16]} UTC")


def reference_markdown() -> str:
    """One line per shipped reference folder: the device and software its tables were measured
    on (from the tables' metadata), so the report says what the reference rows are."""
    folders = sorted(p for p in paths.reference_dir().glob("*") if p.is_dir())
    lines = [line for line in map(_reference_line, folders) if line]
    if not lines:
        return "No shipped reference results: every figure shows this machine's runs only.\n"
    return ("**Shipped reference results** (labelled by origin in every figure and table):\n\n"
            + "\n".join(lines) + "\n")


def live_markdown() -> str:
    """What this machine measured (the tables in ``data/local/``), each with its device and
    when it was written."""
    metas = [json.loads(m.read_text()) for m in sorted(paths.local_dir().glob("*.meta.json"))]
    if not metas:
        return "**Measured live on this machine:** nothing (every number is from a reference).\n"
    lines = [f"- `{m.get('table', '?')}` ({m.get('rows', '?')} rows, profile "
             f"{m.get('profile', '?')}, {m.get('device', {}).get('label', '?')}, "
             f"{m.get('created_utc', '')[:16]} UTC)" for m in metas]
    return ("**Measured live on this machine** (labelled \"this machine\" in every figure and "
            "table):\n\n" + "\n".join(lines) + "\n")


def title_markdown() -> str:
    return ("# decodelab report\n\nWhere the time of iterative LLM decode goes, layer by layer: "
            "dispatch, graph replay, kernel boundaries, orchestration, compute and, across GPUs, "
            "communication, each measured in its own chapter and put together in chapter 05. "
            "The summary comes first; the conclusions close the report.\n")


def provenance_markdown(profile: str, names: list[str]) -> str:
    """This run (device, software, commit), what it measured live and which references it
    read, and the contents."""
    info = collect_info()
    device = info.gpu_name or f"CPU: {info.cpu_model}"
    rows = [("profile", profile), ("device", device), ("torch", info.torch_version),
            ("CUDA", info.cuda_version or "none"), ("driver", info.driver or "none"),
            ("python", info.python_version), ("commit", info.git_commit),
            ("generated (UTC)", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"))]
    table = "\n".join(f"| {k} | {html.escape(str(v))} |" for k, v in rows)
    toc = "\n".join(f"{i + 1}. [{n}](#{n})" for i, n in enumerate(names))
    return (f'<a id="this-run"></a>\n\n## Where the numbers come from\n\nThis run:\n\n'
            f"| | |\n|---|---|\n{table}\n\n{live_markdown()}\n{reference_markdown()}\n"
            f"## Contents\n\n1. [Summary](#summary)\n{toc}\n"
            f"{len(names) + 2}. [Conclusions](#conclusions)\n")


def _relative(text: str) -> str:
    """This checkout's absolute paths written relative to it."""
    root = str(paths.repo_root())
    return text.replace(root + "/", "").replace(root, ".")


def clean_output(output) -> object | None:
    """An output as the report shows it, or None when it is for the notebook only (stderr,
    progress widgets, log lines)."""
    if output.get("output_type") == "stream":
        if output.get("name") == "stderr":
            return None
        kept = [line for line in output["text"].splitlines(keepends=True)
                if not _LOG_LINE.search(line)]
        output["text"] = _relative("".join(kept))
        return output if output["text"].strip() else None
    data = output.get("data", {})
    if _WIDGET in data:
        return None
    for mime in ("text/markdown", "text/html", "text/plain"):
        if isinstance(data.get(mime), str):
            data[mime] = _relative(data[mime])
    return output


def _clean(cell):
    if cell.cell_type == "code":
        cell.outputs = [o for o in map(clean_output, cell.get("outputs", [])) if o is not None]
    return cell


def merge(executed: list[Path], profile: str):
    """One notebook: title, summary, provenance, the chapters, conclusions."""
    import nbformat

    v4 = nbformat.v4
    names = [p.stem for p in executed]
    chapters, summary, closing = [], [], []
    for path, name in zip(executed, names, strict=True):
        nb = nbformat.read(path, as_version=4)
        chapters.append(v4.new_markdown_cell(f'<a id="{name}"></a>\n\n---'))
        for cell in nb.cells:
            tags = cell.metadata.get("tags", [])
            if "parameters" in tags or "injected-parameters" in tags:
                continue
            target = (summary if SUMMARY_TAG in tags else closing if CONCLUSIONS_TAG in tags
                      else chapters)
            target.append(_clean(cell))
    merged = v4.new_notebook()
    merged.cells = [v4.new_markdown_cell(title_markdown()),
                    v4.new_markdown_cell('<a id="summary"></a>'), *summary,
                    v4.new_markdown_cell(provenance_markdown(profile, names)), *chapters,
                    v4.new_markdown_cell('---\n\n<a id="conclusions"></a>'), *closing]
    merged.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
    return merged


def to_offline_html(notebook) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True, embed_images=True)
    body, _ = exporter.from_notebook_node(notebook)
    for pattern in (_REMOTE_SCRIPT, _FETCHING_SCRIPT, _REMOTE_LINK):
        body = pattern.sub("", body)
    return body.replace("</head>", _PAGE_CSS + "\n</head>", 1)


def export(executed: list[Path], out_file: Path, profile: str) -> Path:
    """Write the report atomically and return its path."""
    text = to_offline_html(merge(executed, profile))
    _atomic_write(out_file, text.encode())
    out_file.chmod(0o644)  # a page for anyone on the machine to open, not a private temp file
    return out_file
