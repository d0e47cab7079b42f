"""The package's tree shows its architecture: layers, imports only downwards, no cycle (issue 40).

Every module of ``ooc_spectral`` belongs to one layer (:data:`LAYERS`, by the longest
matching prefix of its dotted name; ``docs/architecture.md`` draws them). Every import
of the package's own modules, at any level of the code (functions, ``if`` blocks and
``TYPE_CHECKING`` included: an import made late for start-up speed is still an
import), must go to a module of the same layer or of a lower one, and the modules'
imports must form no cycle. No module is longer than :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ooc_spectral"
MAX_LINES = 600

#: Layers, bottom (0) to top, by module prefix. A module takes the layer of its
#: longest matching prefix.
LAYERS = {
    # 0: the base: the error hierarchy, generic checks, estimator parameters
    "ooc_spectral.exceptions": 0,
    "ooc_spectral._validation": 0,
    "ooc_spectral._params": 0,
    "ooc_spectral._version": 0,
    # 1: compiled and BLAS helpers (NumPy, ctypes, numba)
    "ooc_spectral._accel": 1,
    # 2: the numerical core (NumPy and SciPy on in-memory blocks)
    "ooc_spectral.core": 2,
    # 3: storage and integrity (zarr, fsspec, files)
    "ooc_spectral.io": 3,
    # 4: where the passes run (dask's schedulers, the embedded cluster)
    "ooc_spectral.runtime": 4,
    # 5: the fit's stages over a source, as dask graphs
    "ooc_spectral.pipeline": 5,
    # 6: the estimators and the baselines beside them
    "ooc_spectral.estimators": 6,
    "ooc_spectral.baselines": 6,
    # 7: evaluations and the papers' reproductions
    "ooc_spectral.experiments": 7,
    # 8: the batch job and its front ends (jobs, workflow files, the command line)
    "ooc_spectral.batch": 8,
    # 9: the public surface: the package itself and its public paths
    "ooc_spectral": 9,
    "ooc_spectral.__main__": 9,
    "ooc_spectral.cli": 9,
    "ooc_spectral.manifold": 9,
    "ooc_spectral.datasets": 9,
    "ooc_spectral.clustering": 9,
}

#: Modules of layer 2 may not import these (the core works on blocks in memory).
CORE_FORBIDDEN = ("dask", "distributed", "zarr", "fsspec")


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _resolve(name: str) -> str:
    """The module ``name`` is, or the module that defines it (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> list[tuple[str, int, str]]:
    """``(imported module, line, statement)`` for every import of the package's own modules."""
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ooc_spectral" or alias.name.startswith("ooc_spectral."):
                    found.append((_resolve(alias.name), node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == "ooc_spectral" or source.startswith("ooc_spectral.")):
                continue
            text = f"from {'.' * node.level}{node.module or ''} import "
            for alias in node.names:
                full = f"{source}.{alias.name}"
                target = full if full in MODULES else _resolve(source)
                found.append((target, node.lineno, text + alias.name))
    return [f for f in found if f[0] != module]


def external_imports_of(module: str) -> list[tuple[str, int]]:
    path, _ = MODULES[module]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.module, node.lineno))
    return out


def test_every_module_has_a_layer():
    assert MODULES, PACKAGE
    for module in MODULES:
        assert layer_of(module) >= 0


def test_imports_only_go_down_the_layers():
    upward = []
    for module in MODULES:
        mine = layer_of(module)
        for target, line, text in imports_of(module):
            if layer_of(target) > mine:
                upward.append(f"{MODULES[module][0].relative_to(PACKAGE.parent)}:{line}: {text!r} "
                              f"(layer {mine}) imports {target} (layer {layer_of(target)})")
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycle():
    graph = {m: sorted({t for t, _, _ in imports_of(m)}) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str):
        state[m] = 1
        path.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycle = path[path.index(t):] + [t]
                line = next(f"{MODULES[a][0].relative_to(PACKAGE.parent)}:{n}: {s!r}"
                            for a, b in zip(cycle, cycle[1:]) for x, n, s in imports_of(a) if x == b)
                pytest.fail("import cycle: " + " -> ".join(cycle) + f" (first import: {line})")
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_the_core_imports_no_dask_zarr_or_file_systems():
    found = [f"{MODULES[m][0].relative_to(PACKAGE.parent)}:{line}: imports {name}"
             for m in MODULES if layer_of(m) == LAYERS["ooc_spectral.core"]
             for name, line in external_imports_of(m) if name.split(".")[0] in CORE_FORBIDDEN]
    assert not found, "\n".join(found)


def test_no_module_is_longer_than_600_lines():
    long = {str(path.relative_to(PACKAGE.parent)): n for path, _ in MODULES.values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_sub_package_says_what_it_holds_and_may_import():
    for module, (path, is_package) in MODULES.items():
        if is_package and module != "ooc_spectral":
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "import" in doc.lower(), f"{module}: its docstring does not say what it may import"
