"""``python -m decodelab``: env, bench, params, run, report.

Bad input (unknown phase, notebook, profile or parameter; a value of the wrong type or out of
range) exits with code 2 and a message naming the value and what is allowed, before any
measurement starts and before any file is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from decodelab.core import paths, precision
from decodelab.core.profiles import CHOICES, measured_device, resolve_profile
from decodelab.core.validate import ConfigError

REPORT_FILE = "decodelab-report.html"
PROFILE_HELP = f"one of {', '.join(CHOICES)} (default auto: gpu with a CUDA device, else cpu)"
DTYPE_HELP = (f"the model's dtype: one of {', '.join(precision.CHOICES)} (default auto: "
              "bfloat16 from sm_80, float16 on older GPUs, float32 on the CPU)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: exit 2 with the usage line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _check_profile(value: str | None) -> str:
    """The profile to run (None and "auto": the hardware decides); one this machine cannot
    measure (``gpu`` without CUDA) is refused here, before any phase or notebook starts."""
    profile = resolve_profile(value)
    measured_device(profile)
    return profile


def _check_dtype(value: str | None, profile: str) -> str:
    """``value`` as given (None: ``auto``), refused here when the device the profile measures
    cannot run it (bfloat16 below sm_80); each phase and notebook resolves ``auto`` itself."""
    from decodelab.core.device import run_dtype

    value = value or precision.AUTO
    run_dtype(value, measured_device(profile), "--dtype")
    return value


def _cmd_env(args: argparse.Namespace) -> int:
    import pandas as pd

    from decodelab.core.device import collect_info
    from decodelab.core.results import to_frame
    from decodelab.env.calibrate import CalibrationConfig, calibrate

    profile = _check_profile(args.profile)
    info = to_frame([collect_info()]).T.rename(columns={0: "value"})
    print(info.to_string())
    if args.no_calibrate:
        return 0
    cal = to_frame(calibrate(CalibrationConfig.for_profile(profile)))
    with pd.option_context("display.width", 160):
        print(cal[["quantity", "value", "unit", "q1", "q3", "detail"]].to_string(index=False))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from decodelab.bench import (
        DTYPE_PHASES,
        PHASES,
        TORCHRUN_PHASES,
        run_all,
        run_phase_quietly,
    )

    profile = _check_profile(args.profile)
    dtype = _check_dtype(args.dtype, profile)
    if args.phase == "all":
        phases = [p for p in PHASES if p not in TORCHRUN_PHASES]
        print(f"[bench] all: leaves out {', '.join(TORCHRUN_PHASES)} (one process per GPU: "
              "make bench-gpu-tp)")
    else:
        phases = [args.phase]
    for phase in phases:
        if phase not in PHASES:
            raise ConfigError(f"unknown phase {phase!r}; allowed: all, {', '.join(PHASES)}")
    if args.phase != "all" and args.phase not in DTYPE_PHASES and dtype != precision.AUTO:
        raise ConfigError(f"--dtype {dtype!r}: phase {args.phase} has no model dtype; it "
                          f"applies to {', '.join(DTYPE_PHASES)}")
    out = Path(args.out) if args.out else paths.local_dir()
    if args.quiet:  # one phase inside `bench all`: the parent reports start and end
        return run_phase_quietly(phases[0], profile, out, dtype)
    return run_all(phases, profile, out, dtype=dtype)


def _cmd_params(args: argparse.Namespace) -> int:
    from decodelab import notebooks

    names = [notebooks.resolve(args.notebook)] if args.notebook else notebooks.available()
    print("\n\n".join(notebooks.describe_parameters(name) for name in names))
    return 0


def _parse_params(pairs: list[list[str]] | None) -> dict[str, str]:
    return {name: value for name, value in (pairs or [])}


def _cmd_run(args: argparse.Namespace) -> int:
    from decodelab import notebooks

    name = notebooks.resolve(args.notebook)
    overrides = _parse_params(args.param)
    if args.profile is not None:
        overrides["profile"] = _check_profile(args.profile)
    if args.dtype is not None:
        overrides["dtype"] = _check_dtype(args.dtype, _check_profile(args.profile))
    notebooks.validate_parameters(name, overrides)  # exit 2 before anything runs
    out = Path(args.out) if args.out else paths.local_dir() / "executed"
    print(f"executed notebook: {notebooks.run(name, overrides, out)}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from decodelab import notebooks, report

    profile = _check_profile(args.profile)
    dtype = _check_dtype(args.dtype, profile)
    names = notebooks.available()
    params = {}
    for name in names:  # validate every notebook's parameters before running any
        fields = {f.name for f in dataclasses.fields(notebooks.params_class(name))}
        params[name] = {"profile": profile, "interactive": False,
                        **({"dtype": dtype} if "dtype" in fields else {})}  # the model's
        notebooks.validate_parameters(name, params[name])
    out_dir = Path(args.out) if args.out else paths.local_dir() / "report"
    t0 = time.perf_counter()
    executed = []
    for name in tqdm(names, desc="notebooks", unit="nb"):
        t_nb = time.perf_counter()
        executed.append(notebooks.run(name, params[name], out_dir / "executed", progress=False))
        tqdm.write(f"{name}: {time.perf_counter() - t_nb:.0f} s")
    path = report.export(executed, out_dir / REPORT_FILE, profile)
    print(f"report ({profile}, {time.perf_counter() - t0:.0f} s): {path.resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # the docstring's first line without its reST markup: --help is read in a terminal
    parser = _Parser(prog="python -m decodelab",
                     description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("env", help="print device info and calibrations")
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--no-calibrate", action="store_true", help="only the device table")
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("bench", help="run a phase's measurements and write its result tables")
    p.add_argument("phase", help="a phase name or 'all'")
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--dtype", help=DTYPE_HELP)
    p.add_argument("--out", help="output folder (default: data/local)")
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("params", help="list the notebooks' parameters (type, default, allowed)")
    p.add_argument("notebook", nargs="?", help="one notebook (default: every notebook)")
    p.set_defaults(func=_cmd_params)
    p = sub.add_parser("run", help="run one notebook through papermill")
    p.add_argument("notebook", help="e.g. 00_environment, 00 or environment")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--dtype", help=DTYPE_HELP)
    p.add_argument("--out", help="folder for the executed notebook")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("report", help="run every notebook and export one HTML report")
    p.add_argument("--profile", help=PROFILE_HELP)
    p.add_argument("--dtype", help=DTYPE_HELP)
    p.add_argument("--out", help="report folder (default: data/local/report)")
    p.set_defaults(func=_cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
