"""Sphinx configuration of the towers documentation site.

Build it with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (the test
suite builds it the same way, strictly, into a temporary directory). The pages are
Markdown, read by MyST; ``reference.md``'s key tables are generated at build time from
the job file's definitions in ``launch/config`` by ``_ext/job_keys.py``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "_ext"), os.path.dirname(HERE)]

project = "towers"
author = "the towers authors"
extensions = ["myst_parser", "job_keys"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
# Headings up to ### get anchors, so a page can link to another's section
# (`data.md#csv`) and strict mode checks the target exists.
myst_heading_anchors = 3
html_theme = "furo"
html_title = "towers"
