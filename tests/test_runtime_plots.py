"""The phase-4b figures and notebook helpers, on tables from a real smoke-profile bench."""

from __future__ import annotations

import matplotlib
import pytest

from decodelab.core.validate import ConfigError
from decodelab.engine.notebook import NotebookParams

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    from decodelab.core.results import load_table
    from decodelab.engine.bench import bench

    out = tmp_path_factory.mktemp("runtime")
    paths = bench("smoke", out)
    names = [p.stem for p in paths]
    assert names == ["runtime", "runtime_steps", "runtime_sampler", "runtime_batch",
                     "runtime_requests", "runtime_errors"]
    empty = tmp_path_factory.mktemp("noref")
    return {n: load_table(n, reference=empty, local=out) for n in names}


def test_bench_rows_are_sane(tables):
    rt = tables["runtime"].set_index("variant")
    assert {"bare_forward", "engine", "no_async_output", "no_static_inputs"} <= set(rt.index)
    assert (rt["wall_us"] > 0).all() and (rt["graph_tokens_agree"] == 1.0).all()
    req = tables["runtime_requests"]
    assert set(req["status"]) <= {"finished", "aborted", "failed"}
    assert (req["status"] == "finished").sum() >= len(req) // 2 and req["ttft_ms"].notna().all()
    errors = tables["runtime_errors"].set_index("name")
    assert errors.loc["invalid_request", "count"] == 2
    assert "step_error" not in errors.index  # injected faults stay inside their request


def test_every_figure_renders(tables):
    import matplotlib.pyplot as plt

    from decodelab.plots import runtime as figs

    for fig in (figs.techniques(tables["runtime"]), figs.step_breakdown(tables["runtime_steps"]),
                figs.host_overhead_vs_batch(tables["runtime_batch"]),
                figs.sampler(tables["runtime_sampler"]),
                figs.workload_latency(tables["runtime_requests"])):
        assert fig.axes
        plt.close(fig)


def test_summary_names_targets(tables):
    from decodelab.engine.notebook import summary

    text = summary(tables)
    assert "this machine" in text and "target" in text


def test_notebook_params_validate():
    assert NotebookParams("smoke", False).profile == "smoke"
    with pytest.raises(ConfigError, match="04_runtime.profile"):
        NotebookParams("fast", False)
    with pytest.raises(ConfigError, match="04_runtime.run_bench"):
        NotebookParams("cpu", False, run_bench="yes")


def test_demo_contains_each_failure():
    from decodelab.engine.notebook import demo

    rows, rejected, pool = demo()
    by = rows.set_index("request")
    assert by.loc["callback", "reason"] == "callback_error"
    assert by.loc["nan", "reason"] == "non_finite_logits"
    assert by.loc["aborted", "status"] == "aborted"
    assert (by.drop(index=["callback", "nan", "aborted"])["status"] == "finished").all()
    assert len(rejected) == 4 and pool["free"] == pool["total"]
