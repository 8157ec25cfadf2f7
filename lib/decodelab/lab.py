"""The contents manager ``make lab`` starts JupyterLab with: jupytext's pairing, and every
``.ipynb`` saved as its sources alone.

``notebooks/jupytext.toml`` pairs each ``NN_name.ipynb`` with its ``NN_name.py`` (py:percent).
Opening the ``.ipynb`` reads the cells from the ``.py``; saving (by hand or autosave) writes
both: the ``.py``, which ``make report`` runs, and the ``.ipynb`` as :func:`sources_only` makes
it, with no outputs, no execution counts and no metadata beyond what the ``.py`` keeps, i.e.
what ``make notebooks-sync`` writes; the ``.py`` header without jupytext's version line, as the
repository keeps it, and the kernelspec as the file had it while the kernel is the same one
(JupyterLab renames ``Python 3`` after this machine's kernelspec, e.g. ``Python 3 (ipykernel)``).
A save thus changes the tracked files only where a cell's source changed. Outputs stay in the
browser session: a reopened notebook shows sources only.

Used as ``--ServerApp.contents_manager_class=decodelab.lab.PairedContentsManager``; jupytext's
own server extension then sees a jupytext manager already and leaves it in place.
"""

from __future__ import annotations

import re

import jupytext
import nbformat
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

TEXT_FORMAT = "py:percent"  # the pair's text side, as in notebooks/jupytext.toml
# The version line of a jupytext header ("# ---" ... "# ---" at the top of the .py).
_VERSION_LINE = re.compile(r"\A(# ---\n(?:(?!# ---\n)#.*\n)*?)#\s+jupytext_version: .*\n")


def sources_only(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` as its ``.py`` holds it, back in ``.ipynb`` form: each cell's source and the
    metadata jupytext keeps (tags), no outputs, no execution counts; notebook metadata as
    jupytext writes it (the kernelspec). Cell ids are kept, so JupyterLab's cells keep theirs.
    A notebook in another language only loses its outputs and execution counts."""
    language = nb.metadata.get("kernelspec", {}).get("language", "python")
    if language != "python":
        clean = nbformat.from_dict(nb)
        for cell in clean.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        return clean
    clean = jupytext.reads(jupytext.writes(nb, fmt=TEXT_FORMAT), fmt=TEXT_FORMAT)
    if len(clean.cells) == len(nb.cells):  # one cell per cell: the round trip kept them all
        for new, old in zip(clean.cells, nb.cells, strict=True):
            if "id" in old:
                new["id"] = old["id"]
    return nbformat.reads(jupytext.writes(clean, fmt="ipynb"), as_version=4)


def without_version(text: str) -> str:
    """A jupytext text file without the ``jupytext_version`` line jupytext puts in its header
    (the line would change with every jupytext release; the rest of the header stays)."""
    return _VERSION_LINE.sub(r"\1", text, count=1)


class PairedContentsManager(build_async_jupytext_contents_manager_class(AsyncLargeFileManager)):
    """jupytext's contents manager over jupyter_server's default one; every notebook file it
    writes (the ``.ipynb`` of a pair included) goes through :func:`sources_only`, every text
    file through :func:`without_version`."""

    async def save(self, model, path=""):
        if model.get("type") == "notebook" and model.get("content") is not None:
            content = nbformat.from_dict(model["content"])
            kept = self._kernelspec_on_disk(path)
            if kept and kept.get("name") == content.metadata.get("kernelspec", {}).get("name"):
                content.metadata["kernelspec"] = kept
            model = {**model, "content": content}
        return await super().save(model, path)

    def _kernelspec_on_disk(self, path: str) -> dict | None:
        """The kernelspec of the notebook file at ``path`` as it is now (None: no such file)."""
        os_path = self._get_os_path(path.strip("/"))
        try:
            return dict(jupytext.read(os_path).metadata.get("kernelspec", {})) or None
        except (OSError, ValueError):
            return None

    async def _save_notebook(self, os_path, nb, capture_validation_error=None):
        await super()._save_notebook(os_path, sources_only(nb),
                                     capture_validation_error=capture_validation_error)

    async def _save_file(self, os_path, content, format):
        if format == "text":
            content = without_version(content)
        await super()._save_file(os_path, content, format)
