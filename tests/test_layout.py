"""The package's layers: ``kernels`` never imports ``measure`` or ``results``; ``measure`` never imports ``results``;
``train`` (the model trained with them) never imports ``results``; nothing imports ``site`` (what the pages need).

Read from the source (every ``import`` statement, also those inside functions), so a lazy import that runs upward
is caught as well. Tests mirror the layout: ``tests/<layer>/test_<module>.py`` tests ``attention_tutorial/<layer>/<module>.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention_tutorial"
LAYERS = ("kernels", "measure", "train", "results", "site")
# What each part may import from the package (top-level modules named by their own name).
ALLOWED = {
    "inputs": set(),
    "env": set(),
    "kernels": {"inputs", "kernels"},
    "measure": {"inputs", "env", "registry", "kernels", "measure"},
    "train": {"inputs", "env", "registry", "kernels", "measure", "train"},
    "results": {"inputs", "env", "registry", "kernels", "measure", "train", "results"},
    "site": {"inputs", "env", "registry", "kernels", "measure", "train", "results", "site"},
}


def _part(module: str) -> str:
    """'attention_tutorial.kernels.fused' -> 'kernels'; 'attention_tutorial.registry' -> 'registry'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(path: Path) -> set[str]:
    """The package modules that ``path`` imports, as absolute dotted names."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module.split(".")[:-1]  # the package a relative import starts from (for __init__: its own)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attention_tutorial")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
                # `from . import x` imports a module x of the package
                names = [f"{name}.{a.name}" for a in node.names] if node.module is None else [name]
            else:
                names = [node.module] if node.module and node.module.startswith("attention_tutorial") else []
            found |= set(names)
    return found


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_upward(path):
    rel = path.relative_to(PACKAGE)
    part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    if part not in ALLOWED:
        return  # registry, cli, __init__, __main__: the top ties the layers together
    upward = sorted(m for m in imports_of(path) if _part(m) not in ALLOWED[part])
    assert not upward, f"{rel} ({part}) imports {upward}; {part} may import only {sorted(ALLOWED[part])}"


def test_the_import_reader_sees_relative_and_lazy_imports():
    fused = PACKAGE / "kernels" / "fused.py"
    assert "attention_tutorial.inputs" in imports_of(fused)
    record = PACKAGE / "results" / "record.py"
    seen = imports_of(record)
    assert "attention_tutorial.measure.fp8" in seen  # imported inside a function
    assert "attention_tutorial.results.store" in seen  # `from . import store`


def test_every_module_sits_in_a_layer_or_the_top():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "cli", "env", "inputs", "registry"}, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")} == set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_tests_mirror_the_layout(layer):
    for test in (ROOT / "tests" / layer).glob("test_*.py"):
        module = PACKAGE / layer / f"{test.stem.removeprefix('test_')}.py"
        assert module.exists(), f"{test.relative_to(ROOT)} has no module {module.relative_to(ROOT)}"
