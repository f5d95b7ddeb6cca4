"""Every relative link of README.md and docs/**/*.md reaches what it names.

Each page is rendered with Python-Markdown (what mkdocs uses; it comes with
TensorBoard) with its `toc` extension, so that the links are the page's real
links (not text in code) and a heading's anchor is the id mkdocs gives it
(`toc.slugify`: lowercase, punctuation dropped, spaces to '-'; `_1`, `_2`
for repeats). Fenced code blocks are taken out first, as mkdocs' superfences
does. For every `<a href>` and `<img src>` that is not a URL:

- its file exists: relative to the page; from a docs page, inside docs/
  or under `results/files/`, where the site serves benchmarks/results/
  (docs_hooks/results_files.py);
- its `#anchor`, if any, is an id of the target page (a heading's, or an
  explicit `id` in the page's HTML), on a Markdown page.

It reads Markdown only and runs in about a second.
"""

import html.parser
import os
import re
import urllib.parse

import markdown
import pytest

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
RESULTS = os.path.join(REPO, "benchmarks", "results")
RESULTS_ON_SITE = "results/files/"           # docs_hooks/results_files.py's SITE_DIR
FENCE = re.compile(r"^([ \t]*)(```|~~~).*?^\1\2[ \t]*$", re.M | re.S)
URL = re.compile(r"^([a-z][a-z0-9+.-]*:|//)", re.I)


class _Links(html.parser.HTMLParser):
    """The hrefs, image sources and ids of an HTML fragment."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href") is not None:
            self.links.append(attrs["href"])
        if tag == "img" and attrs.get("src") is not None:
            self.links.append(attrs["src"])


def parse(text):
    """(links, ids) of a Markdown page's text."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    parser = _Links()
    parser.feed(markdown.markdown(text, extensions=["toc", "tables", "admonition"]))
    return parser.links, parser.ids


def pages(repo=REPO):
    """README.md and every Markdown page under docs/."""
    found = [os.path.join(repo, "README.md")]
    for root, dirs, files in os.walk(os.path.join(repo, "docs")):
        dirs.sort()
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return found


def _target(page, path, repo):
    """The file a link's `path` names from `page`, or (None, why not)."""
    docs = os.path.join(repo, "docs")
    full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if os.path.commonpath([page, docs]) == docs:
        inside = os.path.relpath(full, docs).replace(os.sep, "/")
        if inside.startswith(RESULTS_ON_SITE):
            full = os.path.join(repo, "benchmarks", "results", inside[len(RESULTS_ON_SITE):])
            if full.endswith(".md"):
                return None, "the site serves no Markdown of benchmarks/results/"
        elif inside.startswith("../"):
            return None, "leaves docs/, which the site does not serve"
    if not os.path.isfile(full):
        return None, "no such file"
    return full, None


def problems(repo=REPO):
    """One line per link of `repo`'s pages that does not reach what it names."""
    parsed = {}

    def parse_page(path):
        if path not in parsed:
            with open(path, encoding="utf-8") as f:
                parsed[path] = parse(f.read())
        return parsed[path]

    found = []
    for page in pages(repo):
        if not os.path.isfile(page):
            continue
        shown = os.path.relpath(page, repo)
        for link in parse_page(page)[0]:
            if URL.match(link):
                continue
            path, _, anchor = link.partition("#")
            target, why = _target(page, urllib.parse.unquote(path), repo)
            if target is None:
                found.append(f"{shown}: {link}: {why}")
            elif anchor and not target.endswith(".md"):
                found.append(f"{shown}: {link}: an anchor on a file that is not a page")
            elif anchor and urllib.parse.unquote(anchor) not in parse_page(target)[1]:
                found.append(f"{shown}: {link}: no heading or id '{anchor}' in "
                             f"{os.path.relpath(target, repo)}")
    return found


def test_anchors_are_the_ids_mkdocs_gives_headings():
    _, ids = parse("# Design\n\n## How `dqn_cartpole.gin` got its numbers\n\n"
                   "## TensorFlow's kernels\n\n## Let the run measure: `Layout.choice = 'auto'`\n\n"
                   "## Notes\n\n## Notes\n\n<a id=\"here\"></a>\n\n```\n## not a heading\n```\n")
    assert ids == {"design", "how-dqn_cartpolegin-got-its-numbers", "tensorflows-kernels",
                   "let-the-run-measure-layoutchoice-auto", "notes", "notes_1", "here"}


def test_links_in_code_are_not_links():
    links, _ = parse("[a](a.md) `[b](b.md)`\n\n```\n[c](c.md)\n```\n\n![d](images/d.png)\n")
    assert links == ["a.md", "images/d.png"]


def test_broken_links_and_anchors_are_found(tmp_path):
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "run.json").write_text("{}")
    (tmp_path / "README.md").write_text(
        "[ok](docs/index.md#start) [file](benchmarks/results/run.json) [gone](docs/gone.md)\n")
    (tmp_path / "docs" / "index.md").write_text(
        "# Start\n\n[ok](guides/a.md#a-b) [anchor](guides/a.md#nope) [self](#start)\n"
        "[results](results/files/run.json) [out](../README.md) [url](https://example.com/x)\n")
    (tmp_path / "docs" / "guides" / "a.md").write_text("## A, b\n\n[up](../index.md#start)\n")
    assert problems(str(tmp_path)) == [
        "README.md: docs/gone.md: no such file",
        "docs/index.md: guides/a.md#nope: no heading or id 'nope' in docs/guides/a.md",
        "docs/index.md: ../README.md: leaves docs/, which the site does not serve",
    ]


def test_every_link_of_the_readme_and_the_docs_resolves():
    assert problems() == []
