"""The bench package's shape: no import circle among its modules, counting the imports
made inside functions too (tests/test_layers.py counts those at module level), and
no TensorFlow imported with it, since the CLI imports it to build its parser."""

import ast
import pathlib
import subprocess
import sys

import pytest
from cli_helpers import environment

import launch.bench

BENCH = pathlib.Path(launch.bench.__file__).parent


def module_name(path: pathlib.Path) -> str:
    return "launch.bench" if path.stem == "__init__" else f"launch.bench.{path.stem}"


def is_bench_module(name: str) -> bool:
    return name == "launch.bench" or (name.startswith("launch.bench.")
                                      and (BENCH / f"{name.split('.')[-1]}.py").is_file())


def bench_imports(path: pathlib.Path) -> set[str]:
    """The bench modules `path` imports, wherever in it the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import mod` imports mod; `from pkg import name`, pkg itself.
            found |= {f"{node.module}.{alias.name}"
                      if is_bench_module(f"{node.module}.{alias.name}") else node.module
                      for alias in node.names}
    return {name for name in found if is_bench_module(name)} - {module_name(path)}


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (module -> modules it imports), first module repeated last."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            circle = visit(target, [*path, module])
            if circle:
                return circle
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return None


def test_no_import_circle_in_the_bench_counting_imports_inside_functions():
    graph = {module_name(path): bench_imports(path) for path in BENCH.glob("*.py")}
    assert len(graph) > 10 and graph["launch.bench"]
    assert import_circle(graph) is None


def test_the_circle_check_finds_a_circle():
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b"}, "b": set()}) is None


@pytest.mark.e2e
def test_the_cli_parser_imports_no_tensorflow():
    """The bench's options are the bench package's; building every command's parser
    still imports no TensorFlow, so a bad job file is reported before its seconds."""
    code = ("import sys, launch.cli; launch.cli.build_parser(); "
            "print('tensorflow' in sys.modules, 'launch.bench' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=environment(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
