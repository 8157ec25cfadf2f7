"""Notebook parameters: ``python -m decodelab params`` lists what the dataclasses check, each
parameters cell matches its dataclass (names, defaults, one comment each), and a bad value in a
notebook run straight through papermill ends in the command line's one-line message."""

import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest

from decodelab import notebooks
from decodelab.cli import main
from decodelab.core.params import Allowed, NotebookParams, ParameterError
from decodelab.core.validate import ConfigError

NAMES = notebooks.available()
CELL_LINE = re.compile(r"^(\w+) = (.+?)  # (.+)$")


def _fields(name):
    return dataclasses.fields(notebooks.params_class(name))


def _cell_lines(name):
    text = notebooks.source_path(name).read_text()
    cell = re.search(r'^# %% tags=\["parameters"\]\n((?:(?!# %%).*\n)*)', text, re.M).group(1)
    return [line for line in cell.splitlines() if line.strip()]


def test_params_lists_every_notebook_and_parameter(capsys):
    assert main(["params"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert f"{name}  (python -m decodelab run {name} -p NAME VALUE)" in out
        for field in _fields(name):
            assert re.search(rf"^  {field.name} +{type(field.default).__name__} +default "
                             rf"{re.escape(repr(field.default))} ", out, re.M), field.name


def test_params_of_one_notebook_names_the_reference_folders_on_disk(capsys):
    from decodelab.core import paths

    assert main(["params", "05"]) == 0
    out = capsys.readouterr().out
    assert "00_environment" not in out
    line = next(s for s in out.splitlines() if s.lstrip().startswith("reference "))
    assert "a folder of data/reference/" in line
    for folder in (p for p in paths.reference_dir().iterdir() if p.is_dir()):
        assert repr(folder.name) in line


def _probes(allowed: Allowed, default):
    """(accepted values, refused values) that follow from what the listing says."""
    options = allowed.options()
    if options is not None:
        return list(options), ["no_such_choice", 1, None]
    if isinstance(default, bool):
        return [True, False], [0, 1, "yes", None]
    step = 1 if isinstance(default, int) else 1e-9
    inside = [default, allowed.high] + ([] if allowed.low_open else [allowed.low])
    outside = [allowed.low - step if not allowed.low_open else allowed.low, "1", None]
    if allowed.high is not None:
        outside.append(allowed.high + step)
    if isinstance(default, int):
        outside += [float(default) + 0.5, True]
    else:
        outside.append(math.nan)
    return [v for v in inside if v is not None], outside


@pytest.mark.parametrize("name", NAMES)
def test_the_listing_and_the_check_agree(name, monkeypatch):
    """Every value the listing allows is accepted, and values just outside it are refused with
    a message that repeats the listing's words. (CUDA pretended: ``gpu`` on a machine without
    it is refused by the hardware check, core.profiles.measured_device, not by the listing;
    tests/test_profiles.py checks that refusal; an sm_90 GPU pretended, which allows every dtype:
    tests/test_precision.py checks the dtype's refusal below sm_80.)"""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    cls = notebooks.params_class(name)
    info = {i.name: i for i in cls.describe()}
    for field in dataclasses.fields(cls):
        accepted, refused = _probes(field.metadata["allowed"], field.default)
        for value in accepted:
            cls(**{field.name: value})
        for value in refused:
            with pytest.raises(ConfigError) as exc:
                cls(**{field.name: value})
            assert f"{cls.NOTEBOOK}.{field.name}={value!r}" in str(exc.value)
            assert info[field.name].allowed in str(exc.value)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_cell_matches_its_dataclass(name):
    """Same names, same order, same defaults, and one comment per parameter that says what
    the dataclass says: the cell and the check cannot drift apart."""
    fields = _fields(name)
    assert notebooks.parameter_defaults(name) == {f.name: f.default for f in fields}
    lines = _cell_lines(name)
    assert len(lines) == len(fields), f"{name}: one line per parameter"
    for line, field in zip(lines, fields, strict=True):
        match = CELL_LINE.match(line)
        assert match, f"{name}: {line!r} lacks its one-line comment"
        assert match.group(1) == field.name
        assert match.group(3) == field.metadata["doc"]


@pytest.mark.parametrize("name", NAMES)
def test_the_cell_after_the_parameters_builds_them_with_from_cell(name):
    text = notebooks.source_path(name).read_text()
    after = text.split('# %% tags=["parameters"]', 1)[1].split("# %%", 2)[1]
    assert "params = NotebookParams.from_cell(globals())" in after


def test_profile_defaults_to_auto_and_resolves_to_the_hardware():
    import torch

    field = next(f for f in dataclasses.fields(NotebookParams) if f.name == "profile")
    assert field.default == "auto"
    assert NotebookParams().profile == ("gpu" if torch.cuda.is_available() else "cpu")
    assert NotebookParams(profile="smoke").profile == "smoke"


def test_from_cell_raises_one_line(capsys):
    cls = notebooks.params_class("02_replay")
    good = {f.name: f.default for f in dataclasses.fields(cls)}
    assert cls.from_cell({**good, "seed": 3, "unrelated": object()}).seed == 3
    with pytest.raises(ParameterError) as exc:
        cls.from_cell({**good, "p_stop": 2.0})
    assert exc.value._render_traceback_() == \
        ["error: 02_replay.p_stop=2.0: must be a number in (0.0, 1.0]"]
    missing = dict(good)
    del missing["seed"]
    with pytest.raises(ParameterError, match="the parameters cell lacks 'seed'"):
        cls.from_cell(missing)


def test_papermill_run_with_a_bad_value_shows_the_cli_message_as_one_line(capsys, tmp_path):
    """papermill straight on the notebook (no CLI in front): the error cell's traceback is
    the one line the CLI prints for the same value."""
    pm = pytest.importorskip("papermill")
    import nbformat

    assert main(["run", "03", "-p", "profile", "turbo", "--out", str(tmp_path / "x")]) == 2
    cli_line = capsys.readouterr().err.strip()
    assert cli_line.startswith("error: 03_persistent.profile='turbo'")
    src, out = tmp_path / "03.ipynb", tmp_path / "03.out.ipynb"
    nbformat.write(notebooks.read_notebook("03_persistent"), src)
    with pytest.raises(pm.PapermillExecutionError) as exc:
        pm.execute_notebook(str(src), str(out), parameters={"profile": "turbo"},
                            kernel_name="python3", cwd=str(notebooks.paths.notebooks_dir()),
                            progress_bar=False, execution_timeout=300)
    assert exc.value.traceback == [cli_line]
    assert str(exc.value).rstrip().endswith(f'":\n{cli_line}')
    errors = [o for c in nbformat.read(out, as_version=4).cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert [e["traceback"] for e in errors] == [[cli_line]]


SMALL_CELLS = ['profile = "smoke"  # the profile\ninteractive = True  # sliders',
               "from decodelab.core.params import NotebookParams\n"
               "params = NotebookParams.from_cell(globals())\n"
               "print('interactive', params.interactive)"]


def _small_notebook(path):
    """The smallest notebook of this project's shape: a parameters cell, then from_cell."""
    import nbformat

    cells = [nbformat.v4.new_code_cell(SMALL_CELLS[0], metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell(SMALL_CELLS[1])]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, path)
    return path


def _papermill(tmp_path, *params: str) -> subprocess.CompletedProcess:
    """The papermill command line on the small notebook, as a user runs it."""
    src = _small_notebook(tmp_path / "small.ipynb")
    return subprocess.run([sys.executable, "-m", "papermill", str(src),
                           str(tmp_path / "small.out.ipynb"), "--no-progress-bar", *params],
                          capture_output=True, text=True, timeout=300, check=False)


def _printed(path) -> str:
    import nbformat

    return "".join(o.get("text", "") for c in nbformat.read(path, as_version=4).cells
                   if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.output_type == "stream")


@pytest.mark.parametrize("params", [(), ("-p", "interactive", "True")])
def test_interactive_is_false_under_plain_papermill(tmp_path, params):
    pytest.importorskip("papermill")
    run = _papermill(tmp_path, *params)
    assert run.returncode == 0, run.stderr[-2000:]
    assert _printed(tmp_path / "small.out.ipynb") == "interactive False\n"


def test_interactive_stays_true_where_a_person_runs_the_notebook():
    """A kernel asked as JupyterLab, Colab or VS Code ask it (``allow_stdin=True``)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        printed = []
        for source in SMALL_CELLS:
            msg_id = kc.execute(source, allow_stdin=True)
            while True:
                msg = kc.get_iopub_msg(timeout=120)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])
                if msg["msg_type"] == "error":
                    pytest.fail("\n".join(msg["content"]["traceback"]))
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        assert "".join(printed) == "interactive True\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.slow
def test_decodelab_run_shows_static_figures(tmp_path, monkeypatch):
    """``decodelab run`` injects every parameter (``interactive=True`` by default): the kernel
    still draws no widget, neither the explorer's sliders nor the measurement's progress bar."""
    pytest.importorskip("papermill")
    monkeypatch.setenv("DECODELAB_LOCAL", str(tmp_path / "local"))
    out = tmp_path / "executed"
    assert main(["run", "01", "--profile", "smoke", "--out", str(out)]) == 0
    executed = json.loads((out / "01_dispatch.ipynb").read_text())
    kinds = {k for c in executed["cells"] for o in c.get("outputs", []) for k in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" not in kinds
    assert "image/png" in kinds  # the explorer's static figure (or the named config's) is there


def test_plain_papermill_with_a_bad_value_ends_with_the_one_line(tmp_path):
    """papermill's own command line prints its traceback (its frames only, none of the
    library's) and ends with the line the CLI prints; the exit status says it failed."""
    pytest.importorskip("papermill")
    run = _papermill(tmp_path, "-p", "profile", "turbo")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last == ("error: notebook.profile='turbo': must be one of 'auto', 'smoke', 'cpu', "
                    "'gpu'")
    assert "lib/decodelab" not in run.stderr and "ParameterError" not in run.stderr
