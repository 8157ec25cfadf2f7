"""The report's conclusions, computed from the tables: what agrees with the seed study and what
does not (by the seed table's rule), and the next layer each last regime shows."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from decodelab.analysis.findings import _by_name, _model_row, _term
from decodelab.analysis.layers import Headline, MissingData, Regime, Tables, fmt_us


def conclusions(regimes: Sequence[Regime], seeds: pd.DataFrame, tables: Tables,
                h: Headline | None = None) -> list[str]:
    """What agrees with the seed study and what does not (by the seed table's rule), and the
    next layer: what the last single-GPU regime's runner-up and its distance from the HBM
    floor say comes next."""
    h = h or Headline()
    lines = []
    checked = seeds[seeds["agrees?"] != "n/a"]
    for verdict, words in (("yes", "Agrees with the seed study"),
                           ("no", "Does not agree with the seed study")):
        rows = checked[checked["agrees?"] == verdict]
        if not rows.empty:
            lines.append(f"**{words}** ({len(rows)} of {len(checked)} checked): " + "; ".join(
                f"{r['claim']}: seed {r['seed reported']}, ours {r['we measured']}"
                for _, r in rows.iterrows()) + ".")
    lines += _next_layer(regimes, tables, h)
    return lines


def _next_layer(regimes: Sequence[Regime], tables: Tables, h: Headline) -> list[str]:
    r = _by_name(regimes)
    lines = []
    if "transformer decode" in r:
        lines.append(_transformer_next(r["transformer decode"], tables, h))
    if "tensor parallel" in r:
        tp = r["tensor parallel"]
        lead = ("and dominates it" if tp.dominant.layer == "comm"
                else f"while {tp.dominant.layer} still leads")
        from decodelab.analysis.tp_regime import one_gpu_note, tp_speedup_line

        versus = tp_speedup_line(tables, tp, h)
        lines.append(f"**Across GPUs** the layer that appears is communication: comm is "
                     f"{_term(tp, 'comm') / tp.step_us:.0%} of the TP step ({tp.config}), {lead}"
                     + (f"; {versus}" if versus else "") + ". " + one_gpu_note(tables, h))
    return lines


def _transformer_next(t: Regime, tables: Tables, h: Headline) -> str:
    """The graph-captured transformer step's largest layer and what sits above its floor."""
    text = (f"**The next layer.** In the graph-captured transformer step {t.dominant.layer} is "
            f"{t.dominant.us / t.step_us:.0%} of {fmt_us(t.step_us)} µs")
    ranked = sorted(t.layers, key=lambda x: x.us, reverse=True)
    floor = next((x.us for x in t.parts if x.layer == "floor"), None)
    if floor is not None:  # the split names what sits above the floor
        above = [x for x in ranked if x.layer != "floor" and x.us > 0][:3]
        return (text + f"; the {fmt_us(t.step_us - floor)} µs ({1 - floor / t.step_us:.0%}) "
                "above the floor are, largest first, "
                + ", ".join(f"{x.layer} ({fmt_us(x.us)} µs)" for x in above) + ".")
    try:
        from decodelab.model.analysis import floor_ms

        floor = float(floor_ms(_model_row(tables, "graph", h))) * 1e3
        text += (f", and the HBM floor is {fmt_us(floor)} µs of it: "
                 f"{fmt_us(t.step_us - floor)} µs ({1 - floor / t.step_us:.0%}) sit above "
                 "memory bandwidth (not split further: no kernel profile at this point)")
    except (MissingData, KeyError):
        pass
    if len(ranked) > 1:
        text += f"; after {ranked[0].layer}, {ranked[1].layer} is the largest layer"
    return text + "."
