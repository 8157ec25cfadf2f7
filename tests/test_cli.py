"""Every CLI error: a clear message naming the bad value and what is allowed, exit code 2,
raised before any measurement starts and with no output file written."""

import pytest

from decodelab.cli import main


def _run(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("argv,needle", [
    (["bench", "warp", "--out", "{out}"], "unknown phase 'warp'; allowed: all, env"),
    (["bench", "env", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'; allowed: auto, smoke, cpu, gpu"),
    (["run", "99_nothing", "--out", "{out}"], "unknown notebook '99_nothing'; available: 00_environment"),
    (["run", "00", "-p", "bogus", "1", "--out", "{out}"], "unknown parameter 'bogus'; allowed: profile, interactive, calibrate_live"),
    (["run", "00", "-p", "calibrate_live", "maybe", "--out", "{out}"], "calibrate_live='maybe' must be of type bool"),
    (["run", "00", "-p", "profile", "turbo", "--out", "{out}"], "profile='turbo': must be one of"),
    (["run", "00", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'"),
    (["report", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'"),
    (["run", "05", "-p", "model_batch", "0", "--out", "{out}"], "model_batch=0: must be an integer in [1, 4096]"),
    (["params", "99"], "unknown notebook '99'; available: 00_environment"),
    (["run", "04", "--out", "{out}"], "notebook '04' is ambiguous: 04_model, 04_runtime"),
])
def test_bad_input_exits_2_and_writes_nothing(capsys, tmp_path, local_results, argv, needle):
    out = tmp_path / "out"
    code, err = _run(capsys, [a.replace("{out}", str(out)) for a in argv])
    assert code == 2
    assert needle in err
    assert not out.exists()
    assert not local_results.exists()


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_env_prints_device_table(capsys):
    assert main(["env", "--no-calibrate"]) == 0
    assert "torch_version" in capsys.readouterr().out


def test_bench_env_smoke_writes_table(tmp_path, capsys):
    assert main(["bench", "env", "--profile", "smoke", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "environment.csv").exists()
    assert (tmp_path / "environment.meta.json").exists()


def test_one_phase_refusing_its_input_exits_2(capsys, tmp_path, monkeypatch):
    """A tensor-parallel size the model cannot split is refused with exit 2, on any machine."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, err = _run(capsys, ["bench", "tp", "--profile", "smoke", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "tp=3: must divide tiny.num_kv_heads=2" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv", [
    ["bench", "dispatch", "--profile", "gpu"], ["bench", "paged_model", "--profile", "gpu"],
    ["bench", "all", "--profile", "gpu"], ["env", "--profile", "gpu"],
    ["run", "04_runtime", "--profile", "gpu"], ["run", "04_model", "-p", "profile", "gpu"],
    ["report", "--profile", "gpu"],
])
def test_gpu_profile_without_cuda_is_refused_in_one_line(capsys, tmp_path, local_results,
                                                         monkeypatch, argv):
    """The one policy (core.profiles.measured_device): ``gpu`` on a machine without CUDA is
    refused, never measured at CPU sizes instead, in every command."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    code = main([*argv, *([] if argv[0] == "env" else ["--out", str(out)])])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "'gpu' needs a CUDA GPU and none is visible; use 'cpu', " \
        "'smoke' or 'auto'" in lines[0], captured.err
    assert captured.out == ""
    assert not out.exists() and not local_results.exists()


def test_unknown_reference_folder_is_refused_with_the_folders_that_exist(capsys, tmp_path,
                                                                         local_results):
    """A reference folder that does not exist used to render '0 of 7 regimes have data'."""
    from decodelab.core import paths

    existing = sorted(p.name for p in paths.reference_dir().iterdir() if p.is_dir())
    assert existing, "the checkout ships reference results"
    out = tmp_path / "out"
    code, err = _run(capsys, ["run", "05_report", "-p", "reference", "no_such_device",
                              "--out", str(out)])
    assert code == 2
    assert "05_report.reference='no_such_device': must be 'local' or a folder of data/reference/" in err
    for name in existing:
        assert repr(name) in err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["run", "00", "--profile", "auto"],
                                  ["run", "00", "-p", "profile", "auto"], ["run", "00"]])
def test_profile_auto_is_resolved_by_the_hardware(monkeypatch, tmp_path, argv):
    """``auto`` (and no profile at all) reaches the notebook as the profile default_profile()
    picks: here, without CUDA, ``cpu``."""
    import torch

    from decodelab import notebooks
    from decodelab.core.params import NotebookParams

    seen = {}

    def fake_run(name, params, out, **_):
        seen.update(params)
        seen["resolved"] = notebooks.params_class(name)(**params).profile
        return out / f"{name}.ipynb"

    monkeypatch.setattr(notebooks, "run", fake_run)
    assert main([*argv, "--out", str(tmp_path)]) == 0
    expected = "gpu" if torch.cuda.is_available() else "cpu"
    assert seen["resolved"] == expected
    assert NotebookParams().profile == expected
