"""The standalone check (``kernels/persistent_check.cu``) under the CUDA tools: compute-sanitizer
(memcheck, racecheck) over every variant, and Nsight Compute (``ncu``: warp-state stall
reasons, shared-memory wavefronts and bank conflicts) over the candidate launches.

Each tool is optional: where it is missing or fails, the bench says so and writes no rows for
it. Parsing is separate from running (``parse_*``), so it is tested on CPU.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROFILE_STEPS = 2000  # steps per profiled launch (persistent_check profile)
SWEEP_STEPS = 6  # steps per launch under the sanitizer (persistent_check sweep)
_EXCHANGE = {"BlockX": "block", "GridX": "grid", "ClusterX": "cluster"}
_SPLIT = {"SplitFixed": "fixed", "SplitWide": "wide", "SplitNarrow": "narrow"}


@dataclass(frozen=True, slots=True)
class SanitizerRow:
    tool: str  # memcheck, racecheck
    launches: int  # checked launches (every variant on the sweep's shapes)
    errors: int  # errors (memcheck) or hazards (racecheck) reported; -1: no summary found
    results_ok: bool  # the check's own verdict on the tokens (ALL OK)
    returncode: int
    summary: str


@dataclass(frozen=True, slots=True)
class NcuRow:
    config: str  # ultra-light, h256
    variant: str
    threads: int
    group: int
    metric: str  # e.g. stall_short_scoreboard (cycles per issued instruction), shared_wavefronts_per_step
    value: float


def find_tool(name: str) -> str | None:
    for path in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if path and Path(path).exists():
            return path
    return None


def variant_of(kernel_name: str) -> tuple[str, int]:
    """(variant, threads) from a demangled ``toy_kernel<Split, X, T, Shape, fold, clocked>``."""
    m = re.search(r"toy_kernel<(\w+), (\w+), (\d+), .*, (true|false|[01]), (true|false|[01])>",
                  kernel_name)
    if not m:
        return "", 0
    fold = "_fold" if m.group(4) in ("true", "1") else ""
    return f"{_EXCHANGE[m.group(2)]}_{_SPLIT[m.group(1)]}{fold}", int(m.group(3))


def parse_sanitizer(tool: str, output: str, returncode: int) -> SanitizerRow:
    launches = len(re.findall(r"^\S+\s+T=\d+ H=.*: (?:ok|MISMATCH)$", output, re.M))
    m = (re.search(r"ERROR SUMMARY: (\d+) error", output) if tool == "memcheck" else
         re.search(r"RACECHECK SUMMARY: (\d+) hazard", output))
    summary = next((ln for ln in output.splitlines() if "SUMMARY" in ln), "no summary")
    return SanitizerRow(tool, launches, int(m.group(1)) if m else -1, "ALL OK" in output,
                        returncode, summary.strip("= "))


def run_sanitizer(check: Path, timeout_s: float) -> list[SanitizerRow]:
    tool = find_tool("compute-sanitizer")
    if tool is None:
        print("[persistent] compute-sanitizer not found: not run", flush=True)
        return []
    rows = []
    for name in ("memcheck", "racecheck"):
        cmd = [tool, "--tool", name, "--print-limit", "20", str(check), "sweep", str(SWEEP_STEPS)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"[persistent] compute-sanitizer {name}: timed out", flush=True)
            continue
        rows.append(parse_sanitizer(name, done.stdout + done.stderr, done.returncode))
        print(f"[persistent] compute-sanitizer {name}: {rows[-1].summary}", flush=True)
    return rows


def _launches(stdout: str) -> list[tuple[str, int]]:
    """(config, group) of each launch the profile mode ran, in order."""
    return [(m.group(1), int(m.group(2))) for m in
            re.finditer(r"^PROFILED (\S+) \S+ T=\d+ G=(\d+): ran$", stdout, re.M)]


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def parse_raw(raw_csv: str, launches: list[tuple[str, int]], steps: int) -> list[NcuRow]:
    """Stall reasons (cycles per issued instruction), warp cycles per issued instruction and
    shared-memory wavefronts and bank conflicts per step, from ``ncu --page raw --csv``."""
    lines = [ln for ln in raw_csv.splitlines() if ln.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(table) < 3:
        return []
    header, rows = table[0], table[2:]  # the second line holds the units
    wanted = {}
    for i, name in enumerate(header):
        m = re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", name)
        if m:
            wanted[i] = (f"stall_{m.group(1)}", 1.0)
        elif name == "smsp__average_warp_latency_per_inst_issued.ratio":
            wanted[i] = ("warp_cycles_per_issued_instruction", 1.0)
        elif name == "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum":
            wanted[i] = ("shared_wavefronts_per_step", 1.0 / steps)
        elif name == "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum":
            wanted[i] = ("shared_bank_conflicts_per_step", 1.0 / steps)
        elif name == "smsp__inst_executed.sum":
            wanted[i] = ("warp_instructions_per_step", 1.0 / steps)
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    out = []
    for row, (config, group) in zip(rows, launches, strict=False):
        variant, threads = variant_of(row[name_col]) if name_col is not None else ("", 0)
        for i, (metric, scale) in wanted.items():
            out.append(NcuRow(config, variant, threads, group, metric, _number(row[i]) * scale))
    return out


def run_ncu(check: Path, timeout_s: float) -> list[NcuRow]:
    ncu = find_tool("ncu")
    if ncu is None:
        print("[persistent] ncu not found: no profile", flush=True)
        return []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "prof"
        cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:toy_kernel",
               "--section", "WarpStateStats", "--section", "MemoryWorkloadAnalysis_Tables",
               "-o", str(report), str(check), "profile",
               str(PROFILE_STEPS)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print("[persistent] ncu: timed out, no profile", flush=True)
            return []
        rep = report.with_suffix(".ncu-rep")
        if not rep.exists():
            print(f"[persistent] ncu: no report ({done.stderr[-500:]})", flush=True)
            return []
        raw = subprocess.run([ncu, "--import", str(rep), "--page", "raw", "--csv"],
                             capture_output=True, text=True, timeout=timeout_s).stdout
        return parse_raw(raw, _launches(done.stdout), PROFILE_STEPS)
