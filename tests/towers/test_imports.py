"""The towers package's modules import each other in one direction: no circle, even
through an import inside a function or one kept for type checkers alone."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "towers"


def towers_imports(path: pathlib.Path) -> set[str]:
    """Every towers module `path` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("towers"):
            for alias in node.names:  # `from towers import gradients` names a module
                submodule = node.module == "towers" and (PACKAGE / f"{alias.name}.py").is_file()
                found.add(f"towers.{alias.name}" if submodule else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("towers.")}
    return found - {"towers"}


def module_graph() -> dict[str, set[str]]:
    return {f"towers.{p.stem}": towers_imports(p) for p in PACKAGE.glob("*.py")
            if p.stem != "__init__"}


def test_no_towers_module_imports_in_a_circle():
    graph = module_graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, "import circle: " + " -> ".join(
            [*path[path.index(module):], module])
        if module not in done:
            for target in graph.get(module, ()):
                visit(target, [*path, module])
            done.add(module)

    for module in graph:
        visit(module, [])


def test_no_import_is_hidden_from_the_running_code():
    """An import kept under TYPE_CHECKING is how a circle hides; there is none to hide."""
    hiding = [p.name for p in PACKAGE.glob("*.py") if "TYPE_CHECKING" in p.read_text()]
    assert hiding == []
