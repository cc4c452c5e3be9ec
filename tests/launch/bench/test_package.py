"""The bench package imports no TensorFlow with it, since the CLI imports it to build its
parser (tests/test_import_layers.py checks that no package imports in a circle)."""

import pytest
from helpers.commands import run_python


@pytest.mark.e2e
def test_the_cli_parser_imports_no_tensorflow():
    """The bench's options are the bench package's; building every command's parser
    still imports no TensorFlow, so a bad job file is reported before its seconds."""
    code = ("import sys, launch.cli; launch.cli.build_parser(); "
            "print('tensorflow' in sys.modules, 'launch.bench' in sys.modules)")
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
