"""Notebook 04_model's numbers from synthetic paged-model tables with chosen values: the HBM
floor, the peer comparison, the bytes each kernel must move (checked against the weights the
model really holds), attention's rate at long context, the capture cost, and the prose."""

import json
import math

import pandas as pd
import pytest

from decodelab.model import analysis, floors
from decodelab.model import notebook as nb
from decodelab.model.config import named_config

COPY_GB_S = 100.0
GB = 1e9


def _pm() -> pd.DataFrame:
    """Tiny-model rows: bytes chosen so the floor is 10 ms at context 64 and 14 ms at 256."""
    rows = []
    for mode, batch, context, ms, span in (
            ("graph", 1, 64, 20.0, 19.0), ("graph", 1, 256, 24.0, 23.0),
            ("graph", 8, 64, 40.0, 39.0), ("graph", 8, 256, 60.0, 58.0),
            ("eager", 1, 64, 80.0, 79.0), ("eager", 1, 256, 90.0, 89.0),
            ("hf_dynamic", 1, 64, 50.0, math.nan), ("hf_static", 1, 64, 100.0, math.nan)):
        nbytes = (1.0 + 0.4 * (context == 256)) * GB * (1 + (batch == 8))
        rows.append(dict(origin="reference/h200", model="tiny", dtype="float32", mode=mode,
                         batch=batch, context=context, ms_per_step=ms,
                         device_ms_per_step=span, tokens_per_s=batch / ms * 1e3,
                         bytes_per_step=nbytes, copy_gb_s=COPY_GB_S,
                         roofline_fraction=nbytes / (COPY_GB_S * GB) / (ms * 1e-3),
                         achieved_gb_s=nbytes / (ms * 1e-3) / GB,
                         capture_s=2.5 if mode == "graph" else math.nan,
                         graph_mem_mib=64.0 if mode == "graph" else math.nan,
                         bucket=float(batch) if mode == "graph" else math.nan))
    return pd.DataFrame(rows)


def _linear() -> pd.DataFrame:
    """Each tiny matmul shape once (the bench times a shape once, however many weights share
    it: here gate_up and the tied head), two candidates each; cuBLAS chosen for o only."""
    rows = []
    shapes = analysis.linear_shapes(named_config("tiny"))
    for r in shapes.drop_duplicates(["n", "k", "swiglu"]).itertuples():
        pick = "cublas" if r.weight == "o" else "gemv_8x512w4"
        for cand in ("cublas", "gemv_8x512w4"):
            rows.append(dict(origin="reference/h200", n=r.n, k=r.k, swiglu=r.swiglu,
                             candidate=cand, us=1.0, weight_gb_s=1.0, chosen=cand == pick))
    return pd.DataFrame(rows)


def _kernels(gemv_calls: float = 10.0) -> pd.DataFrame:
    names = (("_gemv_kernel", gemv_calls, 300.0), ("nvjet_sm90_tst_x_TNT", 3.0, 100.0),
             ("_attn_split_kernel", 3.0, 50.0), ("_add_rms_norm_kernel", 7.0, 20.0),
             ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, lo",
              1.0, 2.0))
    total = sum(us for _, _, us in names)
    return pd.DataFrame([dict(origin="reference/h200", kernel=k, calls_per_step=c, us_per_step=us,
                              batch=1, context=64, share=us / total) for k, c, us in names])


def test_step_view_splits_the_step_at_the_floor():
    view = analysis.step_view(_pm()).set_index(["mode", "batch", "context"])
    assert set(view.index.get_level_values("mode")) == {"eager", "graph"}
    row = view.loc[("graph", 1, 64)]
    assert row["floor_ms"] == pytest.approx(10.0)
    assert row["above_floor_ms"] == pytest.approx(10.0)
    assert view.loc[("graph", 8, 256), "floor_ms"] == pytest.approx(28.0)


def test_vs_transformers_takes_the_faster_peer_and_our_best_mode():
    vs = analysis.vs_transformers(_pm()).iloc[0]
    assert vs["best_peer"] == "hf_dynamic" and vs["ours"] == "graph"
    assert vs["speedup"] == pytest.approx(50.0 / 20.0)
    eager_only = analysis.vs_transformers(_pm().query("mode != 'graph'")).iloc[0]
    assert eager_only["ours"] == "eager" and eager_only["speedup"] == pytest.approx(50 / 80)
    assert analysis.vs_transformers(_pm().query("mode == 'graph'")).empty


def test_kernel_bytes_match_the_weights_the_model_holds():
    from decodelab.model.weights import random_weights

    cfg = named_config("tiny")
    w = random_weights(cfg, 0)
    elt = w.embed.element_size()
    layer_mm = sum(t.numel() for lw in w.layers for t in (lw.qkv, lw.o, lw.gate_up, lw.down))
    head = w.lm_head.numel()
    o = sum(lw.o.numel() for lw in w.layers)
    profile = analysis.kernel_profile(_kernels(), _linear(), _pm()).set_index("role")
    gemv, cublas = profile.loc["matmul (Triton gemv)"], profile.loc["matmul (cuBLAS)"]
    d, f, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    gemv_rows = cfg.num_layers * ((q + 2 * kv + d) + (2 * f + d) + (d + f)) + cfg.vocab_size + d
    assert gemv["bytes_per_step"] == (layer_mm - o + head + gemv_rows) * elt  # batch 1: in + out
    assert cublas["bytes_per_step"] == (o + cfg.num_layers * (d + q)) * elt
    assert gemv["tb_s"] == pytest.approx(gemv["bytes_per_step"] / 300e-6 / 1e12)
    assert gemv["of_ceiling"] == pytest.approx(gemv["tb_s"] * 1e3 / COPY_GB_S)
    attn = profile.loc["attention"]
    assert attn["bytes_per_step"] == 64 * cfg.kv_bytes_per_token(elt)
    assert math.isnan(profile.loc["norm + residual", "bytes_per_step"])
    assert profile.loc["embedding gather", "name"] == "at::native::indexSelectSmallIndex"


def test_kernel_bytes_left_out_when_the_calls_disagree():
    profile = analysis.kernel_profile(_kernels(gemv_calls=9.0), _linear(), _pm())
    gemv = profile.set_index("role").loc["matmul (Triton gemv)"]
    assert math.isnan(gemv["bytes_per_step"]) and "9 calls profiled, 10 expected" in gemv["note"]
    no_linear = analysis.kernel_profile(_kernels(), None, _pm()).set_index("role")
    assert no_linear.loc["matmul (cuBLAS)", "note"] == "no paged_model_linear table"
    assert not math.isnan(no_linear.loc["attention", "bytes_per_step"])


def test_linear_choices_compare_the_chosen_candidate_with_cublas():
    lin = _linear().assign(us=lambda f: f["candidate"].map({"cublas": 2.0, "gemv_8x512w4": 1.0}))
    choices = analysis.linear_choices(lin).set_index("candidate")
    assert choices.loc["cublas", "vs_cublas"] == 1.0  # o: cuBLAS chosen
    gemv = choices.loc["gemv_8x512w4"]
    assert len(gemv) == 3 and (gemv["vs_cublas"] == 2.0).all()


def test_attention_marginal_rate_and_capture_cost():
    m = analysis.attention_marginal(_pm()).set_index("batch")
    assert m.loc[1, "extra_kv_bytes"] == pytest.approx(0.4 * GB)
    assert m.loc[1, "kv_tb_s"] == pytest.approx(0.4 * GB / 4e-3 / 1e12)  # 4 ms of device time
    assert m.loc[8, "kv_tb_s"] == pytest.approx(0.8 * GB / 19e-3 / 1e12)
    assert m.loc[8, "of_ceiling"] == pytest.approx(m.loc[8, "kv_tb_s"] * 1e3 / COPY_GB_S)
    assert m.loc[8, "kv_share_long"] == pytest.approx(0.8 / 2.8)
    cap = analysis.capture_cost(_pm()).iloc[0]
    assert (cap["capture_s"], cap["graph_mem_mib"], cap["buckets"]) == (2.5, 64.0, "1, 8")


def test_prose_is_built_from_the_tables():
    pm = _pm()
    text = nb.step_prose(pm, 1, 64)
    assert "20 ms" in text and "10 ms" in text and "4.0x the graph" in text
    assert "50% of the roofline" in text
    moved = nb.step_prose(pm, 2, 64)
    assert "batch 1, context 64 (batch 2 at context 64 not measured here)" in moved
    assert "**2.5x**" in nb.peers_prose(analysis.vs_transformers(pm))
    kern = nb.kernel_prose(analysis.kernel_profile(_kernels(), _linear(), pm))
    assert "5 distinct kernels, 24 launches" in kern and "Attention takes 11%" in kern
    assert "4096" not in nb.attention_prose(analysis.attention_marginal(pm))
    assert "2.50 s" in nb.capture_prose(analysis.capture_cost(pm))
    for prose in (text, kern):
        assert "nan" not in prose


def test_figures_render():
    import matplotlib.pyplot as plt

    from decodelab.plots import model as figs

    pm = _pm()
    for fig in (figs.step_vs_batch(analysis.step_view(pm)),
                figs.tokens_vs_transformers(analysis.vs_transformers(pm)),
                figs.kernel_profile(analysis.kernel_profile(_kernels(), _linear(), pm)),
                figs.attention_bandwidth(analysis.attention_marginal(pm))):
        assert isinstance(fig, plt.Figure)
        plt.close(fig)


def test_notebook_params():
    from decodelab.core.validate import ConfigError

    assert nb.NotebookParams(profile="smoke", interactive=False).profile == "smoke"
    with pytest.raises(ConfigError, match="context"):
        nb.NotebookParams(profile="smoke", context=0)


def _with_modes() -> pd.DataFrame:
    """_pm plus a step without PDL at two points (one faster, one slower than the graph) and
    compile_static at one point."""
    pm = _pm()
    extra = []
    for mode, batch, context, ms in (("graph_no_pdl", 1, 64, 25.0), ("graph_no_pdl", 8, 256, 55.0),
                                     ("compile_static", 8, 64, 50.0)):
        row = pm[(pm["mode"] == "graph") & (pm["batch"] == batch)
                 & (pm["context"] == context)].iloc[0].copy()
        row["mode"], row["ms_per_step"] = mode, ms
        row["compile_s"] = 60.0 if mode == "compile_static" else math.nan
        extra.append(row)
    return pd.concat([pm, pd.DataFrame(extra)], ignore_index=True)


def test_boundary_effect_pairs_each_point_with_its_serial_step():
    effect = analysis.boundary_effect(_with_modes())
    assert list(zip(effect["batch"], effect["context"], strict=True)) == [(1, 64), (8, 256)]
    first, second = effect.iloc[0], effect.iloc[1]
    assert first["saved_us"] == pytest.approx(5000.0)  # 25 ms -> 20 ms
    assert first["roofline_before"] == pytest.approx(10 / 25)
    assert first["roofline_after"] == pytest.approx(10 / 20)
    assert second["saved_us"] == pytest.approx(-5000.0)  # PDL slower here
    text = nb.boundary_prose(effect)
    assert "**5000 µs saved**" in text and "-5000 µs (batch 8, context 256)" in text
    assert "costs time instead" in text
    assert "not separated" in nb.boundary_prose(analysis.boundary_effect(_pm()))


def test_boundary_effect_reads_a_step_beyond_the_pdl_rows_as_spread():
    """Above pdl_policy.MAX_ROWS both timings launch serially: their difference is run-to-run
    spread, said so, and kept out of the range of what PDL saved."""
    from decodelab.model.pdl_policy import MAX_ROWS

    pm = _with_modes()
    big = pm[(pm["batch"] == 8) & (pm["context"] == 256)
             & pm["mode"].isin(["graph", "graph_no_pdl"])].copy()
    big["batch"], big["ms_per_step"] = MAX_ROWS + 1, [70.0, 70.03]
    effect = analysis.boundary_effect(pd.concat([pm, big], ignore_index=True))
    assert list(effect["pdl"]) == [True, True, False]
    text = nb.boundary_prose(effect)
    assert f"At batch {MAX_ROWS + 1} the step launches its kernels serially" in text
    assert "differ by 30-30 µs" in text
    assert "ranges from -5000 µs (batch 8, context 256) to 5000 µs" in text


def test_matmul_headroom_is_each_weights_time_above_its_floor_per_step():
    """Every chosen kernel takes 1 µs a call here; a tiny fp32 weight of n x k needs
    n * k * 4 B at 100 GB/s: the headroom per step is calls x (1 µs - that floor)."""
    config = named_config("tiny")
    head = analysis.matmul_headroom(_linear(), _pm())
    assert list(head["weight"]) == list(analysis.linear_shapes(config)["weight"])
    for r in head.itertuples():
        floor = r.n * r.k * 4 / (COPY_GB_S * 1e9) * 1e6
        assert r.floor_us == pytest.approx(floor)
        assert r.above_us == pytest.approx(r.calls_per_step * (1.0 - floor))
    assert head.loc[head["weight"] == "o", "candidate"].item() == "cublas"
    text = nb.headroom_prose(head)
    took = (head["calls_per_step"] * head["us"]).sum()
    assert f"take {took:,.0f} µs per step" in text
    assert "most of it in" in text
    lin = _linear()  # the head's shape (shared with gate_up here) timed under its floor
    head_shape = analysis.linear_shapes(config).set_index("weight").loc["lm_head"]
    lin.loc[(lin["n"] == head_shape["n"]) & (lin["k"] == head_shape["k"]), "us"] = 1e-6
    text = nb.headroom_prose(analysis.matmul_headroom(lin, _pm()))
    assert "`lm_head` runs" in text and "can outrun the copy" in text


def test_vs_compiled_gives_its_step_over_ours():
    vs = analysis.vs_compiled(_with_modes())
    assert len(vs) == 1 and vs.iloc[0]["batch"] == 8 and vs.iloc[0]["context"] == 64
    assert vs.iloc[0]["speedup"] == pytest.approx(50.0 / 40.0)
    assert "**1.25x**" in nb.compiled_prose(vs) and "60 s of compilation" in nb.compiled_prose(vs)
    empty = nb.compiled_prose(analysis.vs_compiled(_pm()), ["H200: rows removed"])
    assert "was not timed" in empty and "- H200: rows removed" in empty


def test_table_edits_read_the_metadata_edited_field(tmp_path, monkeypatch):
    from decodelab.core.results import write_table

    ref = tmp_path / "reference"
    monkeypatch.setenv("DECODELAB_REFERENCE", str(ref))
    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    (tmp_path / "local").mkdir()
    for name, edited in (("a", "rows removed: why"), ("b", None)):
        folder = ref / name
        folder.mkdir(parents=True)
        csv = write_table("paged_model", pd.DataFrame([{"x": 1}]), out_dir=folder)
        if edited:
            meta = csv.with_name("paged_model.meta.json")
            data = json.loads(meta.read_text()) | {"edited": edited}
            meta.write_text(json.dumps(data))
    edits = nb.table_edits("paged_model")
    assert len(edits) == 1 and edits[0].endswith("rows removed: why")


def test_gemm_choices_are_per_shape_and_row_count():
    rows = []
    for m, pick, fast in ((8, "skinny_16x256w4s4", 2.0), (32, "cublas", 4.0)):
        for cand, us in (("cublas", 4.0), ("skinny_16x256w4s4", fast)):
            rows.append(dict(origin="reference/h200", n=2048, k=2048, swiglu=False, rows=m,
                             candidate=cand, us=us, weight_gb_s=1.0, chosen=cand == pick))
    choices = analysis.linear_choices(pd.DataFrame(rows)).set_index("rows")
    assert choices.loc[8, "candidate"] == "skinny_16x256w4s4"
    assert choices.loc[8, "vs_cublas"] == pytest.approx(2.0)
    assert choices.loc[32, "candidate"] == "cublas" and choices.loc[32, "vs_cublas"] == 1.0


def test_floors_at_the_read_ceiling_where_measured_else_the_copy_with_its_caveat():
    pm = _pm().assign(device="h200")
    copy = floors.with_ceiling(pm, None)
    assert (copy["floor_gb_s"] == COPY_GB_S).all() and set(copy["ceiling"]) == {"copy bandwidth"}
    line = " ".join(floors.ceiling_lines(copy))
    assert "no read ceiling measured for reference/h200" in line and "can beat it" in line
    env = pd.DataFrame([{"origin": "reference/h200", "quantity": "read_bandwidth",
                         "value": 2 * COPY_GB_S, "unit": "GB/s", "backend": "cuda"}])
    read = floors.with_ceiling(pm, env)
    assert set(read["ceiling"]) == {"read ceiling"} and not read["ceiling_caveat"].any()
    view = analysis.step_view(read).set_index(["mode", "batch", "context"])
    assert view.loc[("graph", 1, 64), "floor_ms"] == pytest.approx(5.0)  # 1 GB at 200 GB/s
    assert view.loc[("graph", 1, 64), "roofline_fraction"] == pytest.approx(5.0 / 20.0)
    assert "at the read ceiling (200 GB/s)" in nb.step_prose(read, 1, 64)
    profile = analysis.kernel_profile(_kernels(), _linear(), read)
    assert set(profile["ceiling"]) == {"read ceiling"}


def test_the_plan_and_the_profile_are_two_measurements_of_the_matmuls():
    """The headroom prose quotes the plan's batch-1 matmul time and the profiled step's, and
    says what each includes (they differ by the kernels' starts, launched without PDL)."""
    pm = _pm()
    headroom = analysis.matmul_headroom(_linear(), pm)
    profile = analysis.kernel_profile(_kernels(), _linear(), pm)
    text = nb.headroom_prose(headroom, profile)
    took = (headroom["calls_per_step"] * headroom["us"]).sum()
    in_step = profile[profile["role"].str.startswith("matmul")]["us_per_step"].sum()
    assert f"take {took:,.0f} µs per step" in text and f"take {in_step:,.0f} µs" in text
    assert "without PDL" in text and "plan's timings" in text
    assert "plan's timings" not in nb.headroom_prose(headroom)
