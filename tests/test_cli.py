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
    (["bench", "env", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'; allowed: smoke, cpu, gpu"),
    (["run", "99_nothing", "--out", "{out}"], "unknown notebook '99_nothing'; available: 00_environment"),
    (["run", "00", "-p", "bogus", "1", "--out", "{out}"], "unknown parameter 'bogus'; allowed: profile, interactive, calibrate_live"),
    (["run", "00", "-p", "calibrate_live", "maybe", "--out", "{out}"], "calibrate_live='maybe' must be of type bool"),
    (["run", "00", "-p", "profile", "turbo", "--out", "{out}"], "profile='turbo': must be one of"),
    (["run", "00", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'"),
    (["report", "--profile", "turbo", "--out", "{out}"], "unknown profile 'turbo'"),
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
