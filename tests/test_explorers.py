"""The notebooks' explorers: every slider value draws, two updates at once do not break
matplotlib (JupyterLab 4.6 with ipykernel 7 runs a slider's callbacks in two threads), and 01's
explorer says which measured configuration it shows."""

from __future__ import annotations

import threading

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

pytest.importorskip("IPython")

from decodelab.core.interact import DRAWING  # noqa: E402


@pytest.fixture(scope="module")
def trade():
    """Notebook 02's trade-off, from the stored (shipped reference) results as it reads them."""
    from decodelab.replay import notebook as nb
    from decodelab.replay.fit import fit_multistep

    _, multi = nb.load()
    if multi is None:
        pytest.skip("no stored replay_multistep table")
    return nb.tradeoff_of(multi, fit_multistep(multi), 0.01, 2000, 0)


def _draw_all(points, errors: list) -> None:
    from decodelab.plots.replay import explorer_point

    for model, ks, k, p in points:
        try:
            explorer_point(model, ks, k, p)
        except Exception as exc:  # noqa: BLE001 - collected, the test names them
            errors.append(f"K={k}, p={p:g}: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            plt.close("all")


def test_replay_explorer_draws_at_every_slider_value(trade):
    """Every K of the slider, at the notebook's p and at both ends of the p slider."""
    errors: list[str] = []
    points = [(trade.model, trade.k_values, k, p) for k in trade.k_values
              for p in (trade.p_stop, 10 ** -4, 10 ** -0.3)]
    _draw_all(points, errors)
    assert not errors


def test_replay_explorer_points_drawn_from_two_threads_at_once(trade):
    """What JupyterLab does when the K slider moves: without the lock, about 4 in 5 of these
    draws fail in matplotlib's shared mathtext parser (ParseException from tight_layout)."""
    errors: list[str] = []
    points = [(trade.model, trade.k_values, k, trade.p_stop) for k in trade.k_values] * 2
    threads = [threading.Thread(target=_draw_all, args=(points, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def _held_elsewhere() -> bool:
    """Whether another thread would have to wait for DRAWING now."""
    got = []

    def probe():
        got.append(DRAWING.acquire(blocking=False))
        if got[0]:
            DRAWING.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return not got[0]


def test_an_explorer_update_holds_the_drawing_lock():
    widgets = pytest.importorskip("ipywidgets")
    from decodelab.core.interact import interact

    seen = []
    slider = widgets.IntSlider(value=1, min=0, max=5)
    explorer = interact(lambda x: seen.append((x, _held_elsewhere())), x=slider)
    slider.value = 4
    assert seen == [(1, True), (4, True)]  # the first draw and the moved slider's
    assert isinstance(explorer, widgets.interactive)


def _dispatch_rows():
    """A sweep that varies one of H, L, B at a time around H=1024, L=8, B=8, and a named
    config off it; two modes each."""
    import pandas as pd

    points = ([("sweep", h, 8, 8) for h in (16, 1024, 4096)] + [("sweep", 1024, 1, 8)]
              + [("sweep", 1024, 8, b) for b in (1, 64)] + [("heavy", 4096, 8, 32)])
    rows = [{"origin": "reference/h200", "device": "H200", "backend": "cuda", "config": c,
             "hidden": h, "layers": layer, "batch": b, "mode": mode, "wall_us_per_step": 10.0,
             "host_us_per_step": 8.0, "device_us_per_step": 5.0}
            for c, h, layer, b in points for mode in ("eager", "cuda_graph")]
    return pd.DataFrame(rows)


def test_dispatch_explorer_says_when_it_shows_another_configuration():
    from decodelab.dispatch.notebook import explorer_point

    rows = _dispatch_rows()
    point, line = explorer_point(rows, 4096, 1, 8)  # not measured: H=1024, L=1, B=8 stands in
    assert set(point["hidden"]) == {1024} and set(point["layers"]) == {1}
    assert line == ("**Not measured at H=4096, L=1, B=8**: shown is the nearest measured "
                    "configuration (log distance), H=1024, L=1, B=8 (`sweep`). Measured at "
                    "H=4096: L=8, B=8 (`sweep`); L=8, B=32 (`heavy`).")
    point, line = explorer_point(rows, 4096, 8, 32)
    assert line == "Measured: H=4096, L=8, B=32 (`heavy`)." and len(point) == 2


def test_dispatch_explorer_line_names_what_the_figure_draws_at_every_slider_value():
    """For every combination the sliders offer, the line names the (H, L, B) drawn, and says
    'Not measured' exactly where the choice is not a measured one."""
    import itertools

    from decodelab.dispatch.notebook import explorer_point

    rows = _dispatch_rows()
    measured = set(zip(rows["hidden"], rows["layers"], rows["batch"], strict=True))
    for h, layer, b in itertools.product(*(sorted(rows[k].unique())
                                           for k in ("hidden", "layers", "batch"))):
        point, line = explorer_point(rows, h, layer, b)
        drawn = point.drop_duplicates("mode").iloc[0]
        assert f"H={drawn['hidden']}, L={drawn['layers']}, B={drawn['batch']}" in line
        assert line.startswith("**Not measured") == ((h, layer, b) not in measured)


def test_dispatch_explorer_point_is_drawn_under_the_lock():
    from decodelab.dispatch.notebook import show_point
    from decodelab.plots.dispatch import point_figure

    held = []

    def figure(rows):
        held.append(_held_elsewhere())
        return point_figure(rows)

    show_point(_dispatch_rows(), 4096, 1, 8, figure)
    plt.close("all")
    assert held == [True]
