"""Export executed notebooks as one self-contained HTML report (figures embedded, code hidden).

Opens offline: every script or stylesheet the template would fetch from the network is removed
(the figures are static PNGs embedded as data URIs; interactive widgets are a notebook feature,
the report shows their static fallbacks).
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

_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>", re.I)
_REMOTE_LINK = re.compile(r"<link[^>]*\bhref=\"https?://[^\"]*\"[^>]*>", re.I)
# Inline scripts that would import from the network (the template's MathJax/mermaid loaders).
_FETCHING_SCRIPT = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://(?:(?!</script>).)*</script>",
                              re.I | re.S)


def _reference_line(folder: Path) -> str | None:
    metas = [json.loads(m.read_text()) for m in sorted(folder.glob("*.meta.json"))]
    if not metas:
        return None
    dev = metas[0].get("device", {})
    dates = sorted(m.get("created_utc", "") for m in metas)
    hardware = html.escape(str(dev.get("gpu_name") or dev.get("cpu_model", "?")))
    return (f"- `data/reference/{folder.name}/` ({len(metas)} tables: "
            f"{', '.join(m.get('table', '?') for m in metas)}): {hardware}, "
            f"torch {dev.get('torch_version', '?')}, CUDA {dev.get('cuda_version') or 'none'}, "
            f"driver {dev.get('driver') or 'none'}, commit {dev.get('git_commit', '?')}, "
            f"measured {dates[0][:16]} to {dates[-1][:16]} UTC")


def reference_markdown() -> str:
    """One line per shipped reference folder: the device and software its tables were measured
    on (from the tables' metadata), so the title page says what the reference rows are."""
    folders = sorted(p for p in paths.reference_dir().glob("*") if p.is_dir())
    lines = [line for line in map(_reference_line, folders) if line]
    if not lines:
        return "No shipped reference results yet: figures show this machine's runs only.\n"
    return ("Shipped reference results (labelled by origin in every figure):\n\n"
            + "\n".join(lines) + "\n")


def title_markdown(profile: str, names: list[str]) -> str:
    info = collect_info()
    device = info.gpu_name or f"CPU: {info.cpu_model}"
    rows = [("profile", profile), ("device", device), ("torch", info.torch_version),
            ("CUDA", info.cuda_version or "none"), ("driver", info.driver or "none"),
            ("python", info.python_version), ("commit", info.git_commit),
            ("generated (UTC)", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"))]
    table = "\n".join(f"| {k} | {html.escape(str(v))} |" for k, v in rows)
    toc = "\n".join(f"{i + 1}. [{n}](#{n})" for i, n in enumerate(names))
    return (f"# decodelab report\n\nWhere the time of iterative LLM decode goes, layer by layer.\n\n"
            f"This run:\n\n| | |\n|---|---|\n{table}\n\n{reference_markdown()}\n"
            f"## Contents\n\n{toc}\n")


def merge(executed: list[Path], profile: str):
    """One notebook: a title page, then each executed notebook behind an anchor."""
    import nbformat

    names = [p.stem for p in executed]
    merged = nbformat.v4.new_notebook()
    merged.cells.append(nbformat.v4.new_markdown_cell(title_markdown(profile, names)))
    for path, name in zip(executed, names, strict=True):
        nb = nbformat.read(path, as_version=4)
        merged.cells.append(nbformat.v4.new_markdown_cell(f'<a id="{name}"></a>\n\n---'))
        for cell in nb.cells:
            tags = cell.metadata.get("tags", [])
            if "parameters" in tags or "injected-parameters" in tags:
                continue
            if cell.cell_type == "code":  # warnings and library logs are for the notebook, not the report
                cell.outputs = [o for o in cell.get("outputs", [])
                                if not (o.output_type == "stream" and o.name == "stderr")]
            merged.cells.append(cell)
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
    return body


def export(executed: list[Path], out_file: Path, profile: str) -> Path:
    """Write the report atomically and return its path."""
    text = to_offline_html(merge(executed, profile))
    _atomic_write(out_file, lambda fh: fh.write(text))
    out_file.chmod(0o644)  # a page for anyone on the machine to open, not a private temp file
    return out_file
