"""The snippets of the README and of every page in docs/ hold as written: Python
blocks compile (the library example trains a step on two CPU devices, the Keras builder
builds); YAML job snippets load and pass the job-file checks `towers validate` makes;
and every `towers ...` command line parses with the `towers` parser. The snippet
loading an exported Keras model's weights is the one
tests/launch/modelref/test_user_models_e2e.py runs against a real export."""

import re
import shlex

import pytest
import tensorflow as tf
from helpers.doc_pages import snippet, snippets

from launch import cli


def test_every_python_snippet_compiles():
    found = snippets("python")
    assert len(found) >= 4
    for page, code in found:
        compile(code, page, "exec")


def test_the_library_example_trains_a_step():
    with tf.Graph().as_default():
        names: dict = {}
        exec(snippet("towers.build_train_op"), names)  # it runs its step itself
        assert names["ops"].train_op is not None


def test_the_keras_builder_builds_a_compiled_model():
    names: dict = {}
    exec(snippet("def build(filters=16, hidden=64)"), names)
    model = names["build"]()
    assert model.compiled_loss is not None or model.loss is not None


def job_snippets() -> list[tuple[str, str]]:
    """(page, job file) of each YAML snippet; a block whose top-level key repeats
    holds alternatives (one `data:` line each), and each is a job of its own."""
    jobs = []
    for page, code in snippets("yaml"):
        parts: list[list[str]] = [[]]
        for line in code.splitlines():
            key = re.match(r"(\w+):", line)
            if key and any(x.startswith(key.group(1) + ":") for x in parts[-1]):
                parts.append([])
            parts[-1].append(line)
        jobs += [(page, "\n".join(p)) for p in parts]
    return jobs


def test_every_yaml_job_snippet_passes_the_checks_of_towers_validate(tmp_path):
    jobs = job_snippets()
    assert len(jobs) >= 8
    parser = cli.build_parser()
    for i, (page, text) in enumerate(jobs):
        path = tmp_path / f"job{i}.yaml"
        path.write_text(text)
        # As `towers validate -c` loads it: the sections, the keys, the arrangement's
        # refusals and the model's parameters (the data and the graph need files).
        try:
            cli._load(parser.parse_args(["validate", "-c", str(path)]))
        except Exception as e:
            pytest.fail(f"{page}: the job snippet\n{text}\ndoes not load: {e}")


LAUNCHERS = {"srun", "horovodrun", "mpirun"}  # each runs the `towers` command after it


def towers_arguments(words: list[str]) -> list[str] | None:
    """The arguments of the `towers` command a shell line runs: `towers ...`, a
    launcher's `... towers ...`, or the `towers` image's (`docker run ... towers:cpu
    ...`, whose entrypoint is `towers`); None for a line that runs none."""
    if words[:1] == ["towers"]:
        return words[1:]
    if words[:1] and words[0] in LAUNCHERS and "towers" in words:
        return words[words.index("towers") + 1:]
    if words[:2] == ["docker", "run"]:
        image = [i for i, w in enumerate(words) if w.startswith("towers:")]
        return words[image[0] + 1:] or ["train"] if image else None
    return None


def command_lines() -> list[tuple[str, list[str]]]:
    """(page, arguments) of each `towers` command line in a bash block, continuation
    lines joined and comments dropped."""
    found = []
    for page, code in snippets("bash"):
        for line in re.sub(r"\\\n", " ", code).splitlines():
            args = towers_arguments(shlex.split(line, comments=True))
            if args is not None:
                found.append((page, args))
    return found


def test_every_towers_command_line_parses():
    lines = command_lines()
    assert len(lines) >= 40
    parser = cli.build_parser()
    for page, args in lines:
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{page}: `towers {shlex.join(args)}` does not parse")
