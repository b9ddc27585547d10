"""The package's layers hold: no import cycles, no upward imports, no private reach-ins.

The import graph is read from the source (every ``import`` statement, including those
inside functions), for ``patternkit/`` and for the pattern library in ``patterns/``
(imported as ``patternkit.patterns``).  The layers are the ``import-linter`` contract in
``pyproject.toml``, read from there (one list, checked twice): import-linter checks
``patternkit/``; this file also covers the library, cycles, deferred imports and private
names, which the contract does not.  The contract's ``ignore_imports`` are the allowed
exceptions, here as there.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return {"root": config["root_package"], **contract}


CONTRACT = _contract()


def _layers(contract: dict) -> list[tuple[str, ...]]:
    """The contract's layers from the bottom up, as module prefixes; the container itself
    (the façade, which re-exports everything) is the top layer."""
    container = contract["containers"][0]
    layers = [tuple(f"{container}.{name.strip().strip('()')}"
                    for name in layer.replace(":", "|").split("|"))
              for layer in reversed(contract["layers"])]
    return [*layers, (container,)]


#: Layers from the bottom up; a module may import its own layer and the ones below.
LAYERS = _layers(CONTRACT)
RANK = {prefix: rank for rank, names in enumerate(LAYERS) for prefix in names}

#: Imports the contract allows against the layers: ``(importer, imported)``.
ALLOWED = {tuple(part.strip() for part in rule.split("->"))
           for rule in CONTRACT.get("ignore_imports", ())}

#: Only this module may use private or unstable TVM API.
COMPAT = "patternkit.ir.compat"
PRIVATE_TVM = ("_ffi_api", "_begin_dataflow_block", "_begin_binding_block", "_end_block",
               "__chandle__")


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (resolved)
    names: tuple  # names taken with ``from ... import``
    deferred: bool  # inside a function
    line: int


def _module_files() -> dict[str, Path]:
    files = {}
    for path in sorted((ROOT / "patternkit").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "patterns").rglob("*.py")):
        inside = path.relative_to(ROOT / "patterns").with_suffix("").parts
        parts = ("patternkit", "patterns", *inside)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


FILES = _module_files()


def _is_package(module: str) -> bool:
    return FILES[module].name == "__init__.py"


def _imports(module: str) -> list[Import]:
    tree = ast.parse(FILES[module].read_text())
    package = module if _is_package(module) else module.rsplit(".", 1)[0]
    found = []

    def visit(node, deferred):
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(module, alias.name, (), deferred, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module
                names = tuple(a.name for a in child.names)
                submodules = [n for n in names if f"{target}.{n}" in FILES]
                for name in submodules:  # ``from pkg import submodule``: the submodule
                    found.append(Import(module, f"{target}.{name}", (), deferred, child.lineno))
                if len(submodules) < len(names):
                    found.append(Import(module, target, names, deferred, child.lineno))
            visit(child, inner)

    visit(tree, False)
    return found


IMPORTS = [imp for module in FILES for imp in _imports(module)]
INTERNAL = [imp for imp in IMPORTS if (imp.target == "patternkit"
            or imp.target.startswith("patternkit.")) and (imp.source, imp.target) not in ALLOWED]


def _rank(module: str) -> int:
    best = max((p for p in RANK if module == p or module.startswith(p + ".")), key=len)
    return RANK[best]


def _where(imp: Import) -> str:
    return f"{FILES[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def test_the_import_graph_has_no_cycles():
    graph = nx.DiGraph()
    graph.add_nodes_from(FILES)
    for imp in INTERNAL:
        if imp.target in FILES and imp.target != imp.source:
            graph.add_edge(imp.source, imp.target)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles (function-level imports counted): {cycles}"


def test_the_layers_come_from_the_contract_and_place_the_library():
    flat = [prefix for layer in LAYERS for prefix in layer]
    assert len(flat) == len(set(flat)), f"a layer is listed twice: {flat}"
    assert "patternkit.patterns" in RANK, "pyproject's contract has no patterns layer"
    library = RANK["patternkit.patterns"]
    importers = {imp.source.split(".")[1] for imp in INTERNAL
                 if imp.target.startswith("patternkit.patterns")
                 and not imp.source.startswith("patternkit.patterns")
                 and imp.source != "patternkit"}
    assert importers, "nothing imports the library: the graph does not see patterns/"
    assert all(RANK[f"patternkit.{name}"] > library for name in importers), importers


def test_every_allowed_exception_is_a_real_import():
    found = {(imp.source, imp.target) for imp in IMPORTS}
    assert ALLOWED <= found, f"ignore_imports lists imports that do not exist: {ALLOWED - found}"


def test_no_module_imports_a_higher_layer():
    upward = [_where(imp) for imp in INTERNAL
              if imp.target in FILES and _rank(imp.target) > _rank(imp.source)]
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_private_names_do_not_cross_module_boundaries():
    private = [f"{_where(imp)}: {name}" for imp in INTERNAL for name in imp.names
               if name.startswith("_") and not name.startswith("__")
               and imp.target != imp.source]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_the_model_zoo_imports_only_the_ir_and_errors():
    allowed = ("patternkit.models", "patternkit.ir", "patternkit.errors")
    bad = [_where(imp) for imp in INTERNAL if imp.source.startswith("patternkit.models")
           and not any(imp.target == a or imp.target.startswith(a + ".") for a in allowed)]
    assert not bad, "patternkit.models may import only ir/ and errors:\n" + "\n".join(bad)


def test_only_the_compat_module_touches_private_tvm_api():
    offenders = []
    for module, path in FILES.items():
        if module == COMPAT:
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {word}" for word in PRIVATE_TVM if word in text]
    assert not offenders, ("private TVM API outside patternkit/ir/compat.py:\n"
                           + "\n".join(offenders))


def test_no_method_changes_meaning_in_a_subclass():
    """One rule protocol: no override that needs ``type: ignore[override]`` to type-check."""
    marker = "type: ignore" + "[override]"
    found = [f"{path.relative_to(ROOT)}:{i}" for path in FILES.values()
             for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    assert not found, "overrides that change a method's meaning:\n" + "\n".join(found)


def test_the_pattern_library_uses_only_the_public_faces_of_the_layers():
    allowed = {"patternkit.ir", "patternkit.dpl", "patternkit.engine", "patternkit.byoc",
               "patternkit.verification"}
    bad = [_where(imp) for imp in INTERNAL if imp.source.startswith("patternkit.patterns")
           and not imp.target.startswith("patternkit.patterns") and imp.target not in allowed]
    assert not bad, ("pattern rules import layers by their public package, never a module:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("package", [m for m in FILES if _is_package(m)])
def test_no_exported_name_shadows_a_submodule(package):
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    shadowed = sorted(submodules & set(getattr(module, "__all__", ())))
    assert not shadowed, f"{package} exports names that are also its submodules: {shadowed}"


def test_import_linter_layers_contract_holds():
    """Run in a process of its own: import-linter reconfigures logging (it disables the
    loggers that exist), which would silence patternkit's warnings for later tests."""
    import subprocess
    import sys

    pytest.importorskip("importlinter")  # the [test] extra
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, "
            "no_cache=True, no_logo=True))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_patternkit_and_asking_for_help_do_not_load_tvm():
    import subprocess
    import sys

    code = ("import sys, patternkit, patternkit.app.cli as cli\n"
            "assert 'tvm' not in sys.modules, 'import patternkit loaded TVM'\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'tvm' not in sys.modules, 'patternkit --help loaded TVM'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_pattern_method_loads_the_layer_that_implements_it():
    import subprocess
    import sys

    code = ("import sys, patternkit as pk\n"
            "from tvm import relax\n"
            "p = pk.wildcard() + pk.wildcard()\n"
            "assert 'patternkit.engine' not in sys.modules\n"
            "x = relax.Var('x', relax.TensorType((2,), 'float32'))\n"
            "out = p.partition(pk.from_expr(x + x))\n"
            "assert 'PartitionedFromPattern' in out.script()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
