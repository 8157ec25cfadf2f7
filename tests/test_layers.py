"""The layered model on synthetic tables with known terms: recovered exactly, computed (not typed)
dominance, missing data reported rather than raised, and the seed comparison's rule."""

import math

import pytest
import synthetic

from decodelab.analysis.decompose import decompose, regime_table, terms_frame
from decodelab.analysis.layers import REGIMES, Headline, Tables, load_tables
from decodelab.analysis.notebook import NotebookParams
from decodelab.analysis.seed_table import agrees, seed_table
from decodelab.core.results import SchemaMismatchError, stored_tables, write_table
from decodelab.core.seed import SEED_CLAIMS, SEED_REGIMES
from decodelab.core.validate import ConfigError
from decodelab.plots.report import decomposition_figure, empty_figure


def _tables(**kwargs) -> Tables:
    return Tables(synthetic.tables(**kwargs), synthetic.ORIGIN)


def test_known_terms_are_recovered_for_every_regime():
    regimes, notes = decompose(_tables())
    assert not notes
    assert [r.name for r in regimes] == list(REGIMES)
    for regime in regimes:
        got = {t.layer: t.us for t in regime.terms}
        assert got == pytest.approx(synthetic.KNOWN[regime.name], rel=1e-6, abs=1e-9), regime.name
        assert sum(t.us for t in regime.terms) == pytest.approx(regime.step_us, rel=1e-9)
        assert regime.config, regime.name
        for t in regime.terms:
            assert t.source and t.how, (regime.name, t.layer)


def test_dominant_layer_is_computed_from_the_data():
    before = regime_table(decompose(_tables())[0]).set_index("regime")
    assert before.loc["eager", "dominant"] == "dispatch"
    assert before.loc["graph", "dominant"] == "compute"
    # Less GPU-busy time in the graph step: the kernel boundaries become the largest layer.
    after = regime_table(decompose(_tables(busy_graph=2.0))[0]).set_index("regime")
    assert after.loc["graph", "dominant"] == "node"
    assert after.loc["multi-step graph", "dominant"] == "node"
    assert not before["dominant"].equals(after["dominant"])


def test_terms_frame_shares_sum_to_one():
    terms = terms_frame(decompose(_tables())[0])
    sums = terms.groupby("regime")["share"].sum()
    assert sums.to_numpy() == pytest.approx([1.0] * len(sums))


def test_missing_tables_become_notes_not_errors():
    frames = synthetic.tables()
    only = Tables({"dispatch": frames["dispatch"]}, synthetic.ORIGIN)
    regimes, notes = decompose(only)
    assert [r.name for r in regimes] == ["eager", "graph"]
    graph = regimes[1]
    assert {t.layer for t in graph.terms} == {"replay", "compute"}  # node not separable yet
    assert "no data yet for table `replay_multistep`" in graph.terms[0].how
    assert any("persistent kernel: no data yet for table `persistent`" in n for n in notes)
    assert len(notes) == len(REGIMES) - 2
    regimes, notes = decompose(Tables({}, synthetic.ORIGIN))
    assert regimes == [] and len(notes) == len(REGIMES)


def test_a_missing_column_is_named():
    frames = synthetic.tables()
    frames["dispatch"] = frames["dispatch"].drop(columns=["device_us_per_step"])
    regimes, notes = decompose(Tables(frames, synthetic.ORIGIN))
    assert "eager" not in [r.name for r in regimes]
    assert any("eager" in n and "device_us_per_step" in n for n in notes)


def test_a_non_finite_measurement_is_a_note():
    frames = synthetic.tables()
    frames["dispatch"]["wall_us_per_step"] = float("nan")
    regimes, notes = decompose(Tables(frames, synthetic.ORIGIN))
    assert "eager" not in [r.name for r in regimes]
    assert any(n.startswith("eager: dispatch[") and "no finite value" in n for n in notes)


def test_rows_of_another_origin_are_not_used():
    frames = synthetic.tables()
    regimes, notes = decompose(Tables(frames, "reference/t4"))
    assert regimes == [] and all("from reference/t4" in n for n in notes)


def test_other_headline_config_reads_other_rows():
    regimes, _ = decompose(_tables(), Headline(toy_config="h256"))
    by_name = {r.name: r for r in regimes}
    assert "eager" not in by_name  # no h256 rows in the synthetic dispatch table
    assert by_name["persistent kernel"].step_us == pytest.approx(1.5)


def test_seed_table_rows_and_rule():
    tables = _tables()
    regimes, _ = decompose(tables)
    seeds = seed_table(tables, regimes).set_index("claim")
    assert len(seeds) == len(SEED_CLAIMS) + len(SEED_REGIMES)
    assert seeds.loc["dominant layer: persistent kernel (h256)", "agrees?"] == "yes"
    cpu = seeds.loc["host CPU per step, eager / CUDA graph"]
    assert cpu["we measured"] == "22x" and cpu["agrees?"] == "yes"
    assert seeds.loc["persistent kernel, hidden=256", "agrees?"] == "no"
    assert seeds.loc["dominant layer: eager", "agrees?"] == "yes"
    assert seeds.loc["dominant layer: graph", "agrees?"] == "no"
    assert set(seeds["our hardware"]) == {"H200"}
    empty = seed_table(Tables({}, synthetic.ORIGIN), [])
    assert set(empty["agrees?"]) == {"n/a"}
    assert (empty["we measured"] == "no data yet").all()


def test_agreement_rule():
    assert agrees(2.8, 2.8)[0] == "yes"
    assert agrees(5.5, 2.8)[0] == "yes"
    assert agrees(6.0, 2.8) == ("no", "ours 2.14x higher than the seed's")
    assert agrees(1.0, 2.8)[0] == "no"
    assert agrees(math.nan, 2.8)[0] == "n/a"


def test_load_tables_reads_a_reference_tree(tmp_path, monkeypatch):
    synthetic.write_reference_tree(tmp_path, names=("dispatch", "replay_multistep"))
    monkeypatch.setenv("DECODELAB_ROOT", str(tmp_path))
    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    # a local run written with another schema must not hide the reference rows
    local = synthetic.tables()["dispatch"].drop(columns=["origin", "device"]).assign(extra=1)
    write_table("dispatch", local, out_dir=tmp_path / "local", info=synthetic.FakeInfo())
    tables = load_tables("reference/h200")
    assert set(tables.frames) == {"dispatch", "replay_multistep"}
    regimes, notes = decompose(tables)
    assert [r.name for r in regimes] == ["eager", "graph", "multi-step graph"]
    node = {t.layer: t.us for t in regimes[1].terms}["node"]
    assert node == pytest.approx(synthetic.KNOWN["graph"]["node"])


def test_stored_tables_leaves_absent_ones_out_and_says_which_it_cannot_read(tmp_path,
                                                                             monkeypatch):
    synthetic.write_reference_tree(tmp_path, names=("dispatch", "replay_multistep"))
    monkeypatch.setenv("DECODELAB_ROOT", str(tmp_path))
    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    local = synthetic.tables()["dispatch"].drop(columns=["origin", "device"]).assign(extra=1)
    write_table("dispatch", local, out_dir=tmp_path / "local", info=synthetic.FakeInfo())
    names = ("replay_multistep", "replay_nodes", "dispatch")
    assert list(stored_tables(names, origins=["reference"])) == ["replay_multistep", "dispatch"]
    assert list(stored_tables(names, origins=["local"])) == ["dispatch"]
    assert stored_tables(names, origins=[]) == {}
    with pytest.raises(SchemaMismatchError):  # both copies of dispatch: their columns differ
        stored_tables(names)
    problems: dict[str, str] = {}
    assert list(stored_tables(names, problems=problems)) == ["replay_multistep"]
    assert list(problems) == ["dispatch"] and problems["dispatch"].startswith("unreadable: ")


def test_notebook_params_validate():
    assert NotebookParams(profile="smoke").origin == "reference/h200"
    assert NotebookParams(profile="smoke", interactive=False).is_headline
    assert not NotebookParams(toy_config="h256").is_headline
    with pytest.raises(ConfigError, match="toy_config"):
        NotebookParams(toy_config="huge")
    with pytest.raises(ConfigError, match="runtime_batch"):
        NotebookParams(runtime_batch=0)
    with pytest.raises(ConfigError, match="reference"):
        NotebookParams(reference="../etc")


def test_figures():
    import matplotlib.pyplot as plt

    regimes, _ = decompose(_tables())
    fig = decomposition_figure(terms_frame(regimes), regime_table(regimes), "synthetic")
    assert len(fig.axes) == 2
    plt.close(fig)
    plt.close(empty_figure("no data yet"))


def test_inconsistent_sources_are_flagged_not_hidden():
    frames = synthetic.tables()
    frames["paged_model_kernels"]["us_per_step"] *= 2  # more kernel time than the device span
    frames["dispatch"].loc[frames["dispatch"]["mode"] == "cuda_graph", "wall_us_per_step"] = 14.0
    regimes, _ = decompose(Tables(frames, synthetic.ORIGIN))
    by_name = {r.name: r for r in regimes}
    transformer = {t.layer: t for t in by_name["transformer decode"].terms}
    assert set(transformer) == {"replay", "compute"}
    assert "exceeds the device span" in transformer["compute"].how
    table = regime_table(regimes).set_index("regime")
    assert table.loc["graph", "check"].startswith("negative remainder: replay")
    assert table.loc["eager", "check"] == "ok"
