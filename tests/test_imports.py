"""The house rules of the library's import graph, checked by parsing every module with ``ast``:
no import circles (imports inside functions count; ``if TYPE_CHECKING:`` blocks do not),
``core/`` imports no phase, and no phase imports another phase's bench or notebook module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from decodelab.core import paths

ROOT = paths.PACKAGE_DIR.parent  # the folder holding ``decodelab/``
PHASES = ("env", "toy", "dispatch", "replay", "persistent", "model", "engine", "parallel",
          "analysis")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((ROOT / "decodelab").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(child) for child in ast.walk(node))
    return skip


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The library modules ``name`` imports (``from a import b`` counts ``a.b`` when it is one)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name and not m.startswith(name + ".")}


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _phase_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PHASES else None


def test_find_cycle_sees_a_circle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_core_imports_no_phase():
    bad = [f"{m} -> {d}" for m, deps in import_graph().items() if m.startswith("decodelab.core")
           for d in deps if _phase_of(d) or d.startswith("decodelab.plots")]
    assert not bad, "core imports a phase: " + "; ".join(bad)


def test_only_the_notebooks_import_plots():
    """``plots/`` holds figure helpers for the notebooks (``notebooks/*.py``): no library module
    outside it imports it, so figures never become a dependency of a phase, core or the report."""
    bad = [f"{m} -> {d}" for m, deps in import_graph().items()
           if not m.startswith("decodelab.plots") for d in deps if d.startswith("decodelab.plots")]
    assert not bad, "imports plots: " + "; ".join(bad)


@pytest.mark.parametrize("face", ["bench", "notebook"])
def test_no_phase_imports_another_phases_bench_or_notebook(face):
    """``bench`` may be a module or a package (``engine/bench/``): anything inside counts."""
    bad = []
    for module, deps in import_graph().items():
        for dep in deps:
            other = _phase_of(dep)
            if other and other != _phase_of(module) and face in dep.split(".")[2:]:
                bad.append(f"{module} -> {dep}")
    assert not bad, f"a phase imports another phase's {face}: " + "; ".join(bad)


def test_every_phase_has_a_registered_bench_of_one_shape():
    """``bench(profile, out_dir)``, and ``dtype="auto"`` after them in the phases that run
    the model (``DTYPE_PHASES``)."""
    from decodelab.bench import DTYPE_PHASES
    from decodelab.bench import PHASES as REGISTRY

    for phase, target in REGISTRY.items():
        # a phase folder's bench room: its bench module or package, or a module inside it
        parts = target.split(".")
        assert (_phase_of(target) and len(parts) >= 3 and parts[2] == "bench"), \
            f"bench {phase} points at {target}, not inside a phase's bench room"
        module = ROOT / target.replace(".", "/")
        source = (module / "__init__.py" if module.is_dir() else module.with_suffix(".py")).read_text()
        tree = ast.parse(source)
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bench"),
                  None)
        assert fn is not None, f"{target} has no bench()"
        args = [a.arg for a in fn.args.args]
        want = ["profile", "out_dir"] + (["dtype"] if phase in DTYPE_PHASES else [])
        assert args == want, f"{target}.bench{tuple(args)}"
        if phase in DTYPE_PHASES:
            assert ast.literal_eval(fn.args.defaults[-1]) == "auto", f"{target}.bench dtype"
        assert ast.unparse(fn.returns) == "list[Path]", f"{target}.bench returns {ast.unparse(fn.returns)}"


def test_no_library_module_over_the_line_budget():
    budget, allowed = 300, {  # module -> why it may be longer
        "decodelab.engine.fused_sampler": "the fused sampler is one design (its Triton passes, "
        "their shared helpers and the launcher): cut in two, one half imported a dozen names "
        "back from the other (issue 22)",
    }
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > budget and name not in allowed}
    assert not long, f"modules over {budget} lines: {long}"
