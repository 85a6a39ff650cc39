"""The layer rule of docs/architecture.md: every import points down, none in a circle.

Imports are read from the source (every `import`/`from` statement, function-level ones included), so a
lower layer that reaches up, even lazily, fails here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "policies", "workloads", "kernels_cost_model")

# Bottom to top. A module may import its own layer and the layers below it; layers on one row are peers
# and may not import one another.
LAYERS: list[tuple[str, ...]] = [
    ("kernels_cost_model",),
    ("sim.core",),
    ("policies", "workloads"),
    ("sim.engine",),
    ("sim.api",),
    ("sim.plots",),
    ("sim.planning", "sim.fidelity", "sim.whatif"),
    ("sim.cli",),
]
FACADES = {"sim"}  # sim/__init__.py re-exports the public names from every layer


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imported_modules(name: str, path: Path) -> set[str]:
    """Project modules imported by `name` (relative imports resolved; its own parent packages, which Python
    initialises before any submodule, left out)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m.split(".")[0] in PACKAGES and m not in ancestors}


def layer_of(module: str) -> int | None:
    """Index of the layer that holds `module`; None for a facade (a package's public __init__)."""
    if module in FACADES:
        return None
    for i, row in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in row):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def group_of(module: str) -> str:
    return next(p for row in LAYERS for p in row if module == p or module.startswith(p + "."))


MODULES = all_modules()
GRAPH = {name: {m for m in imported_modules(name, path) if m in MODULES} for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n not in FACADES))
def test_imports_point_down(name):
    mine = layer_of(name)
    for target in sorted(GRAPH[name]):
        theirs = layer_of(target)
        if theirs is None:
            raise AssertionError(f"{name} imports the facade {target}: import the defining module")
        same_group = group_of(target) == group_of(name)
        assert theirs < mine or same_group, f"{name} (layer {mine}) imports {target} (layer {theirs})"


def test_cost_model_imports_nothing_of_servesim_above_it():
    for name in MODULES:
        if name.startswith("kernels_cost_model"):
            outside = {m for m in GRAPH[name] if not m.startswith("kernels_cost_model")}
            assert not outside, f"{name} imports {sorted(outside)}"


def test_no_import_circles():
    """Depth-first search over module imports (package __init__ files included)."""
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def test_layer_test_catches_an_upward_import(tmp_path):
    """The checker itself: a core module importing the API would be reported."""
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from sim.api.results import Results\n")
    assert "sim.api.results" in imported_modules("sim.core.fake", fake)
    assert layer_of("sim.api.results") > layer_of("sim.core.fake")


@pytest.mark.parametrize("package", ["policies", "workloads", "kernels_cost_model", "sim.core", "sim.engine",
                                     "sim.plots", "sim.cli"])
def test_each_layer_imports_on_its_own(package):
    """A fresh interpreter imports the layer first: the facade (`sim/__init__.py`) must not pull the layers
    above it in while a lower one is still loading."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", f"import {package}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
