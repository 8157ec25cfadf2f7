"""Explorers (ipywidgets controls over a figure) that draw one point at a time.

JupyterLab 4.6 with ipykernel 7 may run one slider's callbacks in two threads at once: the
kernel's main shell and a subshell take turns with a widget's messages. matplotlib is not
thread-safe (its mathtext parser is one object shared by every figure: two tick labels parsed
at once fail with ``ValueError: ... ParseException``), so every explorer's update, from clearing
its output to showing its figure, holds one lock of the process, :data:`DRAWING`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Reentrant: a point drawn under it may call helpers that take it too.
DRAWING = threading.RLock()


def interact(f: Callable[..., object], /, **controls):
    """``ipywidgets.interact(f, **controls)`` whose every update holds :data:`DRAWING`.
    Displays the explorer and returns its widget."""
    import ipywidgets as widgets
    from IPython.display import display

    class SerialInteractive(widgets.interactive):
        def update(self, *args):
            with DRAWING:
                super().update(*args)

    explorer = SerialInteractive(f, **controls)
    display(explorer)
    return explorer
