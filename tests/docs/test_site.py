"""The documentation site (docs/) builds in Sphinx's strict mode, and its generated
reference lists every job key `towers validate` prints, with its default.

The site is built once per test run (a module fixture, in this process): a warning (a
broken link, a missing cross-reference or page, a page in no table of contents) fails
the build.
"""

import html
import os
import re

import pytest
from sphinx.cmd.build import build_main

from launch.config import dump_yaml, load_job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
# Sphinx 9 warns of its own deprecations that MyST still uses; they are not the site's.
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning",
                                        "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    status = build_main(["-W", "--keep-going", "-q", "-b", "html", "-d", str(out / "doctrees"),
                         DOCS, str(out / "html")])
    assert status == 0, "the documentation site does not build strictly (warnings above)"
    return out / "html"


def test_the_site_builds_strictly_with_every_page(site):
    pages = {os.path.splitext(n)[0] for n in os.listdir(DOCS) if n.endswith(".md")}
    built = {os.path.splitext(n)[0] for n in os.listdir(site) if n.endswith(".html")}
    assert pages <= built


def validate_keys() -> dict[str, str]:
    """Each key `towers validate` prints for the built-in job, dotted, with its value
    as it prints it (the cli writes dump_yaml of the resolved job)."""
    keys, path = {}, []
    for line in dump_yaml(load_job(None)).splitlines():
        depth = (len(line) - len(line.lstrip())) // 2
        name, _, value = line.strip().partition(":")
        path[depth:] = [name]
        if value.strip():
            keys[".".join(path)] = value.strip()
    return keys


def reference_rows(site) -> dict[str, str]:
    """The reference page's table rows: key -> default, as the reader sees them."""
    text = (site / "reference.html").read_text()
    rows = {}
    for row in re.findall(r"<tr.*?</tr>", text, re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.findall(r"<td.*?</td>", row, re.S)]
        if cells:
            rows[cells[0]] = cells[1]
    return rows


def test_the_reference_lists_every_key_validate_prints_with_its_default(site):
    keys = validate_keys()
    assert len(keys) > 100 and keys["train.steps"] == "600"
    rows = reference_rows(site)
    missing = {k: v for k, v in keys.items() if rows.get(k) != v}
    assert not missing, f"keys missing from the reference, or with another default: {missing}"


def test_the_reference_lists_the_keys_of_sections_null_until_set(site):
    rows = reference_rows(site)
    assert rows["train.warm_start"] == "null" and rows["train.warm_start.path"] == "(required)"
    assert rows["data.schema.kind"] == "float"


def test_the_readme_is_a_front_page_whose_links_land(site):
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert readme.count("\n") <= 300
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len([p for p, _ in links if p.startswith("docs/")]) >= 10
    for path, anchor in links:
        assert os.path.isfile(os.path.join(ROOT, path)), f"the README links to {path}: no such file"
        if anchor:  # a section of a page: its id in the built page
            page = (site / os.path.relpath(path, "docs")).with_suffix(".html").read_text()
            assert f'id="{anchor}"' in page, f"the README links to {path}#{anchor}: no such section"
