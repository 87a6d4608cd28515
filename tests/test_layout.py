"""The package's layers, from the bottom: ``inputs`` and ``env`` (base modules); ``kernels``; ``registry`` (every
kernel by name); ``measure``; ``train`` (the model trained with them: it times itself with ``measure``, which never
imports it); ``results``; ``site`` (what the pages need); then the root package, ``cli`` and ``__main__`` on top.
A module imports only its own part and the parts below it.

Read from the source (every ``import`` statement, also those inside functions, and the modules the package imports by
name), so a lazy import that runs upward is caught as well. Importing the root package loads none of them: its names
load on first use, and it leaves the process's signal handlers alone (the command line installs its own, for its run).
Tests mirror the layout: ``tests/<layer>/test_<module>.py`` tests ``attention_tutorial/<layer>/<module>.py``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention_tutorial"
LAYERS = ("kernels", "measure", "train", "results", "site")
# Each part of the package (a folder, or a module at the top named by its stem) and its height: a module may import
# its own part and parts of a lower height. Parts of one height (inputs and env) import neither each other.
RANK = {
    "inputs": 0,
    "env": 0,
    "kernels": 1,
    "registry": 2,
    "measure": 3,
    "train": 4,
    "results": 5,
    "site": 6,
    "__init__": 7,  # the root: re-exports the most used names of the layers below
    "cli": 8,
    "__main__": 9,
}


def _part(module: str) -> str:
    """'attention_tutorial.kernels.fused' -> 'kernels'; 'attention_tutorial.registry' -> 'registry';
    'attention_tutorial' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def imports_of(path: Path) -> set[str]:
    """The package modules that ``path`` imports, as absolute dotted names: by ``import`` statements, and by name
    through ``importlib.import_module("attention_tutorial....")`` or the registry's ``_lazy("<module>", ...)``."""
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
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            target = node.args[0].value
            if not isinstance(target, str):
                continue
            if _called(node) == "import_module" and target.startswith("attention_tutorial"):
                found.add(target)
            elif _called(node) == "_lazy":  # registry.py: a module of the package, named from the package
                found.add(f"attention_tutorial.{target}")
    return found


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def upward_imports(path: Path) -> list[str]:
    """The imports of ``path`` that reach a part of its height or above (other than its own part)."""
    part = _part_of(path)
    return sorted(m for m in imports_of(path) if _part(m) != part and RANK[_part(m)] >= RANK[part])


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_upward(path):
    part = _part_of(path)
    up, below = upward_imports(path), sorted(p for p in RANK if RANK[p] < RANK[part])
    assert not up, f"{path.relative_to(PACKAGE)} ({part}) imports {up}; {part} may import only {below} and itself"


def test_the_import_reader_sees_relative_lazy_and_named_imports():
    fused = PACKAGE / "kernels" / "fused.py"
    assert "attention_tutorial.inputs" in imports_of(fused)
    record = PACKAGE / "results" / "record.py"
    seen = imports_of(record)
    assert "attention_tutorial.measure.fp8" in seen  # imported inside a function
    assert "attention_tutorial.results.store" in seen  # `from . import store`
    assert "attention_tutorial.kernels.te" in imports_of(PACKAGE / "registry.py")  # _lazy("kernels.te", ...)
    assert "attention_tutorial.cli" in imports_of(PACKAGE / "__main__.py")


def test_an_upward_import_inside_a_function_fails_the_layering(tmp_path, monkeypatch):
    fake = tmp_path / "attention_tutorial"
    (fake / "kernels").mkdir(parents=True)
    bad = fake / "kernels" / "bad.py"
    bad.write_text("def f():\n    from ..measure.timing import time_fn\n    import attention_tutorial.cli\n")
    named = fake / "measure.py"
    named.write_text("import importlib\nimportlib.import_module('attention_tutorial.site.report')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert upward_imports(bad) == ["attention_tutorial.cli", "attention_tutorial.measure.timing"]
    assert upward_imports(named) == ["attention_tutorial.site.report"]


def test_every_module_sits_in_a_layer_or_the_top():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "cli", "env", "inputs", "registry"}, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")} == set(LAYERS)
    assert set(RANK) == top | set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_tests_mirror_the_layout(layer):
    for test in (ROOT / "tests" / layer).glob("test_*.py"):
        module = PACKAGE / layer / f"{test.stem.removeprefix('test_')}.py"
        assert module.exists(), f"{test.relative_to(ROOT)} has no module {module.relative_to(ROOT)}"


# Python's own Ctrl-C handler first, whatever this process inherited (a parent that ignores SIGINT passes that on).
IMPORT_ALONE = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import attention_tutorial
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)
loaded = sorted(m for m in sys.modules if m.startswith(("attention_tutorial.", "jax")))
assert not loaded, loaded
from attention_tutorial import make_qkv
assert "jax" in sys.modules and "attention_tutorial.cli" not in sys.modules
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)
print("ok")
"""


def test_importing_the_package_installs_no_signal_handler_and_loads_neither_jax_nor_the_cli():
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALONE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_every_name_the_root_exports_is_its_module_s_own():
    import attention_tutorial as at

    assert set(at.__all__) == set(at._EXPORTS) | {"__version__"}
    for name, module in at._EXPORTS.items():
        assert getattr(at, name) is getattr(importlib.import_module(f"attention_tutorial.{module}"), name), name
    assert set(at.__all__) <= set(dir(at))
    with pytest.raises(AttributeError, match="has no attribute 'make_qvk'"):
        at.make_qvk  # noqa: B018
