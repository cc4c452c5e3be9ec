"""The package layout holds: every module imports, no cycles, no layer reaches above itself.

Layers of launch/, lowest first (docs/contributing.md, Architecture). A module may import its
own layer's modules and lower layers', never a higher layer's: that keeps, say,
the config loader free of anything that builds graphs or starts servers.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("towers", "models", "launch")

LAUNCH_LAYERS = [
    ("launch.errors", "launch.log", "launch.hard_exit", "launch.tf_process", "launch.startup",
     "launch.cache", "launch.cpu_info"),
    ("launch.config",),
    ("launch.devices",),
    ("launch.data", "launch.metrics", "launch.modelref", "launch.kernels"),
    ("launch.runtime",),
    # distributed/, lowest first: who is who in a cluster; the health of a job of several
    # processes (liveness, stalls, stragglers, stop votes, deadlines, how it ends); the
    # arrangements that run them; local-cluster, which starts a whole job's tasks on
    # ports of its own.
    ("launch.distributed.cluster",),
    ("launch.distributed.health",),
    ("launch.distributed.arrangements",),
    ("launch.distributed.ports",),
    ("launch.distributed.local_cluster",),
    ("launch.bench", "launch.tune", "launch.verify"),
    ("launch.cli", "launch.cli_arrangement", "launch.cli_data", "launch.cli_help",
     "launch.cli_timeline", "launch.__main__"),
]
# The project's own layers: launch builds on models and towers, models on towers.
PACKAGE_LAYERS = {"towers": 0, "models": 1, "launch": 2}


def module_names() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def source_of(module: str) -> str:
    path = ROOT / module.replace(".", "/")
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()


def imports_of(module: str) -> list[tuple[str, bool]]:
    """(imported project module, at module level?) for every import in `module`'s source."""
    tree = ast.parse(source_of(module))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pkg import mod` depends on mod; `from pkg import name` on pkg itself.
            targets = [
                f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}")
                else node.module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES and _is_module(target):
                found.append((target, id(node) in top_level))
    return found


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def layer_of(module: str) -> tuple[int, int]:
    """(package layer, layer within launch) of a module."""
    package = module.split(".")[0]
    if package != "launch" or module == "launch":  # launch/__init__.py is empty
        return PACKAGE_LAYERS[package], 0
    for index, prefixes in enumerate(LAUNCH_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return PACKAGE_LAYERS[package], index
    raise AssertionError(
        f"{module} is in no layer: add it to LAUNCH_LAYERS and docs/contributing.md")


@pytest.mark.parametrize("module", [m for m in module_names() if m != "launch.__main__"])
def test_every_module_imports(module):
    importlib.import_module(module)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module} imports {target}"
        for module in module_names()
        for target, _ in imports_of(module)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (module -> modules it imports), its first module repeated
    last; None when there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            # Importing a package runs its __init__, not its submodules: follow the module.
            cycle = visit(target, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_no_import_cycles_counting_imports_inside_functions():
    """Every import counts, wherever it stands: an import moved into a function, or kept
    under TYPE_CHECKING, hides a cycle from Python but not from a reader."""
    graph = {m: {t for t, _ in imports_of(m) if t != m} for m in module_names()}
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_is_kept_for_type_checkers_alone():
    """An import under TYPE_CHECKING is how a cycle hides; there is none to hide."""
    hiding = [m for m in module_names() if "TYPE_CHECKING" in source_of(m)]
    assert hiding == []


def test_towers_is_used_only_through_its_package_surface():
    """models/ and launch/ import `towers`, never its modules: towers/__init__ is the API."""
    reaching_in = [
        f"{module} imports {target}"
        for module in module_names()
        if not module.startswith("towers")
        for target, _ in imports_of(module)
        if target.startswith("towers.")
    ]
    assert reaching_in == []


def test_the_layer_check_sees_an_upward_import():
    """The check itself can fail: launch.config importing the runtime is upward."""
    assert layer_of("launch.runtime.train") > layer_of("launch.config")
    assert layer_of("launch.cli") > layer_of("launch.bench")


def test_no_module_is_longer_than_400_lines():
    """A module one can read at once; past this, it is doing more than one thing."""
    long = {m: n for m in module_names() if (n := len(source_of(m).splitlines())) > 400}
    assert long == {}


def test_each_source_and_arrangement_is_found_by_one_name_in_each_layer():
    """A data source or an arrangement is one module per layer, of the same name: its
    job-file side a line of launch/config (no TensorFlow), what it does a module of
    launch/data/sources/ or launch/distributed/arrangements/."""
    from launch.config import ARRANGEMENTS as JOB_FILE_ARRANGEMENTS
    from launch.config import SOURCE_KEYS
    from launch.data.sources import SOURCES
    from launch.distributed.arrangements import ARRANGEMENTS

    assert list(SOURCES) == list(SOURCE_KEYS)
    assert [s.__module__ for s in SOURCES.values()] == [
        f"launch.data.sources.{name}" for name in SOURCES]
    assert list(ARRANGEMENTS) == list(JOB_FILE_ARRANGEMENTS)
    for name, arrangement in ARRANGEMENTS.items():
        assert arrangement.__module__ == f"launch.distributed.arrangements.{name}"
        assert isinstance(arrangement(), type(JOB_FILE_ARRANGEMENTS[name]))


@pytest.mark.e2e
def test_a_job_and_its_cluster_are_checked_without_tensorflow():
    """The job file, the arrangement a command runs it under and what that refuses, and
    the cluster from its sources: all before TensorFlow's seconds of import."""
    from helpers.commands import run_python

    code = (
        "import sys\n"
        "from launch.config import ConfigError, choose, load_job\n"
        "from launch.distributed import cluster\n"
        "def worker(job):\n"
        "    task = cluster.resolve(job.cluster, cluster.Flags(task_index=0), 'worker', {})\n"
        "    return choose(job.cluster.backend, 'worker', task.cluster)\n"
        "try:\n"
        "    load_job(None, ['cluster.worker=[h:1, h:2]', 'train.backup_workers=1'],\n"
        "             arrangement=worker)\n"
        "except ConfigError as err:\n"
        "    print(err.key, 'tensorflow' in sys.modules)\n")
    done = run_python(code, timeout=60)
    assert done.stdout.split() == ["train.backup_workers", "False"], done.stderr[-2000:]
