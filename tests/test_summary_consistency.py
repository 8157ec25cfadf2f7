"""The report's summary quotes the same numbers as its chapters: on the shipped H200 reference,
each figure the summary's findings and transitions give is recomputed here the way its chapter
computes it (or read from the chapter's own function), and must read the same on the page."""

import re

import matplotlib
import pytest

matplotlib.use("Agg")

from decodelab.analysis.decompose import decompose  # noqa: E402
from decodelab.analysis.findings import findings  # noqa: E402
from decodelab.analysis.layers import Headline, load_tables  # noqa: E402
from decodelab.analysis.notebook import transitions  # noqa: E402
from decodelab.core.results import stored_tables  # noqa: E402


@pytest.fixture(scope="module")
def summary():
    tables = load_tables("reference/h200")
    regimes, _ = decompose(tables)
    text = "\n".join([*(f.text + " " + f.number for f in findings(tables, regimes)),
                      *transitions(regimes, tables, Headline())])
    return tables, regimes, text


def test_persistent_against_the_graph_is_chapter_03s_ratio(summary):
    from decodelab.persistent.analysis import seed_comparison

    _, _, text = summary
    cmp = seed_comparison(stored_tables(["persistent"], origins=["reference/h200"])["persistent"])
    ratio = float(cmp[cmp["config"] == Headline().toy_config]["x_graph_k1"].iloc[0])
    quoted = set(re.findall(r"([\d.]+)x (?:the single-step graph|shorter than the single)",
                            text))
    assert quoted == {f"{ratio:.1f}"}, quoted  # 03's "= 20.4x the single-step graph"


def test_tensor_parallel_is_chapter_06s_tp1(summary):
    from decodelab.parallel.analysis import headline_table

    tables, _, text = summary
    tp = stored_tables(["tp"], origins=["reference/h200x2"])["tp"]
    row = tp[(tp["tp"] == 1) & (tp["mode"] == "graph") & (tp["batch"] == 1)
             & (tp["model"] == "llama-3.2-1b")].iloc[0]
    us = float(row["ms_per_step"]) * 1e3
    assert f"TP=1 of the same run and code path takes {us:,.0f} µs" in text
    assert f"| llama-3.2-1b | 1 | {us / 1e3:.2f} |" in headline_table(tp, "reference/h200x2")
    assert "on one GPU" not in text  # the paged_model step is never the TP baseline


def test_orchestration_quotes_chapter_04bs_host_time(summary):
    from decodelab.engine import notebook as runtime_nb

    _, _, text = summary
    rt = stored_tables(["runtime"], origins=["reference/h200"])["runtime"]
    eng = rt[rt["variant"] == "engine"].iloc[0]
    exposed = float(eng["wall_us"] - rt[rt["variant"] == "bare_forward"]["wall_us"].iloc[0])
    assert f"adds {exposed:.3g} µs of orchestration" in text
    # 04b's "host time outside the forward N µs per step", from the same column
    host = float(eng["orchestration_us"])
    assert f"host time outside the forward {host:.0f} µs" in runtime_nb.summary({"runtime": rt})
    assert f"the host work behind it is {host:,.0f} µs" in text


def test_techniques_bars_and_prose_quote_one_ratio():
    from decodelab.engine.notebook import technique_costs
    from decodelab.plots.runtime import techniques

    rt = stored_tables(["runtime"], origins=["reference/h200"])["runtime"]
    prose = technique_costs(rt)
    fig = techniques(rt)
    labels = [t.get_text() for t in fig.axes[0].texts]
    for variant, ratio in re.findall(r"`(\w+)` ([\d.]+)x", prose):
        assert any(f"{ratio}x the engine" in label for label in labels), (variant, labels)
    matplotlib.pyplot.close(fig)


def test_step_breakdown_parts_add_up_to_the_wall():
    from decodelab.engine.notebook import step_medians

    steps = stored_tables(["runtime_steps"], origins=["reference/h200"])["runtime_steps"]
    med = step_medians(steps).set_index("variant")
    parts = [c for c in med.columns if c.endswith("_us") and c != "wall_us"]
    for variant, row in med.iterrows():
        assert row[parts].sum() <= 1.1 * row["wall_us"], variant
    assert "emit_us" not in med.columns and "emit_excl_wait_us" in med.columns


def test_the_profiled_tp_step_is_not_read_against_the_timed_one():
    from decodelab.parallel.notebook import profile_prose

    t = stored_tables(["tp", "tp_profile"], origins=["reference/h200x2"])
    text = profile_prose(t["tp_profile"], t["tp"])
    eager = next(line for line in text.splitlines() if ", eager," in line)
    assert "One profiled step takes" in eager and "timed without the profiler" in eager
    assert "shares of the profiled step" in eager


def test_matmul_plan_and_profile_are_both_named():
    from decodelab.model import analysis, floors
    from decodelab.model import notebook as nb

    t = stored_tables(["paged_model", "paged_model_kernels", "paged_model_linear",
                       "environment"], origins=["reference/h200"])
    pm = floors.with_ceiling(t["paged_model"], t["environment"])
    profile = analysis.kernel_profile(t["paged_model_kernels"], t["paged_model_linear"], pm)
    text = nb.headroom_prose(analysis.matmul_headroom(t["paged_model_linear"], pm), profile)
    in_step = profile[profile["role"].str.startswith("matmul")]["us_per_step"].sum()
    assert f"the same matmuls take {in_step:,.0f} µs" in text
    assert nb.kernel_prose(profile).count(f"{in_step / profile['us_per_step'].sum():.0%}") == 1
