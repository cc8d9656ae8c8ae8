"""CONTRIBUTING.md's architecture table is the import graph: each module imports only from its own
layer or an earlier one, the first layer never imports torch, and every module has a row."""

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


def imports(path: Path, at_import: bool = False) -> set[str]:
    """The top-level modules a file imports: gpt2.x / gpt2.x.y -> x; torch; relative imports resolved.
    at_import: only the imports that run when the module is imported (not those inside functions)."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in (tree.body if at_import else ast.walk(tree)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x, inside a package of gpt2: its own module
                names.add("gpt2." + path.relative_to(PACKAGE).parts[0])
            elif node.module:
                names.add(node.module)
                if node.module == "gpt2":
                    names.update(f"gpt2.{alias.name}" for alias in node.names)
    return {name.split(".")[1] if name.startswith("gpt2.") else name.split(".")[0] for name in names if name != "gpt2"}


def test_every_module_has_a_row():
    table = layers()
    missing = {key.split(":")[0] for key in modules()} - set(table) - ENTRY_POINTS
    assert not missing, f"add these modules to CONTRIBUTING.md's architecture table: {sorted(missing)}"
    stale = set(table) - {key.split(":")[0] for key in modules()}
    assert not stale, f"CONTRIBUTING.md's table names modules that do not exist: {sorted(stale)}"


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
    heavy = [key for key, path in modules().items()
             if table.get(key.split(":")[0]) == 1 and "torch" in imports(path, at_import=True)]
    assert not heavy, f"the torch-free base imports torch: {heavy}"


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a source line importing from a later layer is found."""
    source = tmp_path / "x.py"
    source.write_text("from gpt2.serve import create_app\nimport torch.nn as nn\nfrom gpt2 import model\n")
    assert imports(source) == {"serve", "torch", "model"}
    source.write_text("def f():\n    import torch\n")
    assert imports(source) == {"torch"} and imports(source, at_import=True) == set()
