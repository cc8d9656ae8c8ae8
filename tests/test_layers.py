"""CONTRIBUTING.md's architecture table is the import graph: each top-level module or package
imports only from its own layer or an earlier one, the first layer never imports torch, every
module and package has a row, and imports run one way: no cycle among the modules and packages,
nor among the modules of one package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpt2"
ENTRY_POINTS = {"__init__", "__main__"}  # re-export and run everything: above every layer


def layers() -> dict[str, int]:
    """{module: layer number} from the table's rows: | 1. the torch-free base | `errors`, ... | ... |"""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = {}
    for number, modules in re.findall(r"^\| (\d+)\. [^|]*\| ([^|]*) \|", text, re.MULTILINE):
        for name in re.findall(r"`([\w.]+)`", modules):
            table[name] = int(number)
    assert table, "CONTRIBUTING.md has no architecture table"
    return table


def modules() -> dict[str, Path]:
    """{top-level module name: file} for every source file; a package's files go by its name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        found[f"{relative.parts[0].removesuffix('.py')}:{relative}"] = path
    return found


def imported(path: Path, at_import: bool = False) -> set[str]:
    """Every dotted name a file imports: `import a.b` -> a.b; `from a.b import c` -> a.b and a.b.c
    (c a module or a name in it); relative imports resolved from the file's place in gpt2.
    at_import: only the imports that run when the module is imported (not those inside functions)."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in tree.body if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x, from .y import x: inside gpt2, from the file's own package
                parts = ("gpt2", *path.relative_to(PACKAGE).parent.parts)
                module = ".".join(parts[: len(parts) - node.level + 1] + ((module,) if module else ()))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def imports(path: Path, at_import: bool = False) -> set[str]:
    """The top-level modules and packages a file imports: gpt2.x / gpt2.x.y -> x; torch.nn -> torch."""
    names = imported(path, at_import) - {"gpt2"}
    return {name.split(".")[1] if name.startswith("gpt2.") else name.split(".")[0] for name in names}


def package_imports(package: Path) -> dict[str, set[str]]:
    """{module: the modules of the same package it imports}, for one package's files; a name taken
    from the package itself (`from gpt2.data import prepare`) is an import of its `__init__`."""
    prefix = "gpt2." + ".".join(package.relative_to(PACKAGE).parts) + "."
    own = {path.stem for path in package.glob("*.py")}
    graph = {}
    for path in package.glob("*.py"):
        children = {name.removeprefix(prefix).split(".")[0] for name in imported(path) if name.startswith(prefix)}
        graph[path.stem] = {child if child in own else "__init__" for child in children} - {path.stem}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph {node: the nodes it imports}, as the nodes along it, or None."""
    done = set()

    def walk(node: str, stack: list[str]) -> list[str] | None:
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in stack:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in done and (found := walk(nxt, stack)):
                return found
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done and (found := walk(node, [])):
            return found
    return None


def packages() -> list[Path]:
    return sorted(init.parent for init in PACKAGE.rglob("__init__.py") if init.parent != PACKAGE)


def test_every_module_has_a_row():
    table = layers()
    missing = {key.split(":")[0] for key in modules()} - set(table) - ENTRY_POINTS
    assert not missing, f"add these modules to CONTRIBUTING.md's architecture table: {sorted(missing)}"
    stale = set(table) - {key.split(":")[0] for key in modules()}
    assert not stale, f"CONTRIBUTING.md's table names modules that do not exist: {sorted(stale)}"


def test_every_package_has_a_row():
    """Each package of src/gpt2 (a folder with an __init__.py, at the top) is a name in the table."""
    tops = {package.relative_to(PACKAGE).parts[0] for package in packages()}
    assert {
        "tokenizer",
        "serve",
        "checkpoints",
        "generation",
        "model",
        "inspect",
        "data",
        "evaluation",
        "training",
    } <= tops
    assert tops <= set(layers()), (
        f"add these packages to CONTRIBUTING.md's architecture table: {sorted(tops - set(layers()))}"
    )


def test_imports_run_one_way():
    table = layers()
    upward = []
    for key, path in modules().items():
        module = key.split(":")[0]
        if module in ENTRY_POINTS:
            continue
        for imported in imports(path) & set(table):
            if table[imported] > table[module]:
                upward.append(f"{key} (layer {table[module]}) imports {imported} (layer {table[imported]})")
    assert not upward, "\n".join(upward)


def test_the_first_layer_is_torch_free():
    """Importing the base never imports torch (weights imports it inside the function that reads a
    pytorch_model.bin, which needs it)."""
    table = layers()
    heavy = [
        key
        for key, path in modules().items()
        if table.get(key.split(":")[0]) == 1 and "torch" in imports(path, at_import=True)
    ]
    assert not heavy, f"the torch-free base imports torch: {heavy}"


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a source line importing from a later layer is found."""
    source = tmp_path / "x.py"
    source.write_text("from gpt2.serve import create_app\nimport torch.nn as nn\nfrom gpt2 import model\n")
    assert imports(source) == {"serve", "torch", "model"}
    source.write_text("def f():\n    import torch\n")
    assert imports(source) == {"torch"} and imports(source, at_import=True) == set()


def test_no_cycle_among_the_modules_and_packages():
    table = layers()
    graph = {}
    for key, path in modules().items():
        module = key.split(":")[0]
        if module not in ENTRY_POINTS:
            graph.setdefault(module, set()).update((imports(path) & set(table)) - {module})
    assert (found := cycle(graph)) is None, " -> ".join(found)


def test_no_cycle_inside_a_package():
    """Inside each package its modules import one way too (its __init__ included)."""
    found = {package.name: path for package in packages() if (path := cycle(package_imports(package)))}
    assert not found, "\n".join(f"{name}: {' -> '.join(path)}" for name, path in found.items())


def test_the_check_sees_a_cycle_inside_a_package(tmp_path, monkeypatch):
    """The cycle check itself can fail: two modules of a package importing each other (one through
    the package's own name) are found, and the same package without that import is not."""
    package = tmp_path / "gpt2" / "room"
    package.mkdir(parents=True)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "gpt2")  # this test's own gpt2
    (package / "__init__.py").write_text("from gpt2.room.b import g\n")
    (package / "a.py").write_text("from gpt2.room import b\nfrom gpt2.errors import GPT2Error\n")
    (package / "b.py").write_text("import torch\n\ndef g():\n    from .a import f\n")
    assert package_imports(package) == {"__init__": {"b"}, "a": {"b"}, "b": {"a"}}
    assert cycle(package_imports(package)) == ["b", "a", "b"]  # from __init__: to b, to a, back to b
    (package / "b.py").write_text("import torch\n")
    assert cycle(package_imports(package)) is None
    (package / "b.py").write_text("from gpt2.room import g\n")  # a name from the package: its __init__
    assert cycle(package_imports(package)) == ["__init__", "b", "__init__"]
