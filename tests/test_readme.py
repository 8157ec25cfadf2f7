"""The README's regime table is the one notebook 05 computed (no typed copy that can drift)."""

import re

from decodelab.core import paths


def test_readme_regime_table_matches_the_generated_one():
    root = paths.repo_root()
    readme = (root / "README.md").read_text()
    block = re.search(r"<!-- regime-table:start -->\n(.*?)\n<!-- regime-table:end -->", readme, re.S)
    assert block, "README lacks the regime-table markers"
    generated = (root / "figures" / "headline_regimes.md").read_text()
    table = "\n".join(line for line in generated.splitlines() if line.startswith("|"))
    assert block.group(1).strip() == table.strip(), \
        "README's regime table differs from figures/headline_regimes.md: copy the new one"
    assert (root / "figures" / "headline_decomposition.png").exists()


def test_readme_tp_table_matches_the_reference_data():
    from decodelab.core.results import load_table
    from decodelab.parallel.analysis import headline_table

    root = paths.repo_root()
    readme = (root / "README.md").read_text()
    block = re.search(r"<!-- tp-table:start -->\n(.*?)\n<!-- tp-table:end -->", readme, re.S)
    assert block, "README lacks the tp-table markers"
    generated = (root / "figures" / "headline_tp.md").read_text().strip()
    assert block.group(1).strip() == generated, \
        "README's TP table differs from figures/headline_tp.md: copy the new one"
    tp = load_table("tp", origins=["reference"])
    assert headline_table(tp, "reference/h200x2") == generated


def test_readme_formula_names_every_layer_the_report_uses():
    from decodelab.analysis.layers import LAYERS

    readme = (paths.repo_root() / "README.md").read_text()
    formula = re.search(r"^\s+T_step = (.*)$", readme, re.M)
    assert formula, "README lacks the T_step formula"
    named = re.findall(r"T_(\w+)", formula.group(1))
    assert named[:len(LAYERS)] == list(LAYERS)
    assert "comm" in named  # tensor parallelism adds the collectives


def test_readme_shows_every_command_and_make_target():
    from decodelab.cli import build_parser

    readme = (paths.repo_root() / "README.md").read_text()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command in sub.choices:
        assert f"python -m decodelab {command}" in readme, command
    makefile = (paths.repo_root() / "Makefile").read_text()
    for target in ("report", "test", "test-fast", "lab", "test-gpu", "bench-gpu", "bench-gpu-tp"):
        assert f"make {target}" in readme, target
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
    for folder in ("core", "env", "toy", "dispatch", "replay", "persistent", "model", "engine",
                   "parallel", "analysis", "plots"):
        assert (paths.repo_root() / "lib" / "decodelab" / folder).is_dir()
        assert re.search(rf"^\s+{folder}/ ", readme, re.M), f"layout lacks {folder}/"
