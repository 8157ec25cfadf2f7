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
