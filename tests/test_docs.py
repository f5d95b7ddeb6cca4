"""The README and the docs site say only what exists.

- every `alf_async.<...>` name in an inline code span of README.md or
  docs/**/*.md, every `from alf_async... import ...` in their code blocks,
  and every `::: alf_async...` API-reference directive resolves: its module
  imports and each further part is an attribute (private names skipped);
- README.md stays short (under 120 lines), still shows the test command
  .ci/run greps for, and its relative links point at files that exist;
- no page names the project's internal history ("session 5", "issue 14");
- every docs page is in mkdocs.yml's nav, however deep its section.

It reads the Markdown itself and does not need mkdocs (`.ci/run` builds the
site with `mkdocs build --strict`, which checks the links between pages).
"""

import functools
import importlib
import os
import re

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"\balf_async(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(alf_async(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]+)", re.M)
IMPORT = re.compile(r"^\s*import\s+(alf_async(?:\.\w+)*)", re.M)
DIRECTIVE = re.compile(r"^:::\s+(alf_async(?:\.\w+)*)\s*$", re.M)
HISTORY = re.compile(r"\b(session|issue) \d+", re.I)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 120
# A nav entry's page: `- Title: path.md` or `- path.md`, at any depth.
NAV_PAGE = re.compile(r"^\s*-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", re.M)


def _pages():
    pages = [os.path.join(REPO, "README.md")]
    for root, _, files in os.walk(DOCS):
        pages += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return pages


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _documented_names():
    """{dotted name: [pages that name it]}."""
    names = {}
    for page in _pages():
        text = _read(page)
        rel = os.path.relpath(page, REPO)
        found = set(DIRECTIVE.findall(text))
        for block in FENCE.findall(text):
            for module, imported in FROM_IMPORT.findall(block):
                found.update(f"{module}.{n.strip()}" for n in imported.strip("()").split(",")
                             if n.strip())
            found.update(IMPORT.findall(block))
        for span in INLINE_CODE.findall(FENCE.sub("", text)):
            found.update(DOTTED.findall(span))
        for name in found:
            names.setdefault(name, []).append(rel)
    return names


@functools.lru_cache(maxsize=None)
def _resolve(name):
    """Imports the longest module prefix of `name`, then getattr's the rest.
    Returns None if it resolves, else what went wrong."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and not module_name.startswith(e.name) and \
                    not e.name.startswith(module_name):
                return f"importing {module_name} failed: {e}"
            continue
        for j in range(i, len(parts)):
            if not hasattr(obj, parts[j]):
                return f"{'.'.join(parts[:j])} has no attribute {parts[j]!r}"
            obj = getattr(obj, parts[j])
        return None
    return f"no module of {name} imports"


def test_docs_name_alf_async_things():
    names = _documented_names()
    # The API reference and the Python API page name at least these.
    assert "alf_async.driver.async_driver.AsyncOffPolicyDriver" in names
    assert "alf_async.learning.learner" in names
    assert len(names) > 40, sorted(names)


def test_every_documented_name_exists():
    missing = []
    for name, pages in sorted(_documented_names().items()):
        if any(part.startswith("_") for part in name.split(".")):
            continue
        problem = _resolve(name)
        if problem is not None:
            missing.append(f"{name} ({', '.join(sorted(set(pages)))}): {problem}")
    assert not missing, "documented names that do not exist:\n" + "\n".join(missing)


def test_readme_is_short():
    lines = _read(os.path.join(REPO, "README.md")).splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines (under {README_MAX_LINES}); the details belong in docs/")


def test_readme_shows_the_ci_test_command():
    ci = _read(os.path.join(REPO, ".ci", "run"))
    command = re.search(r'^TEST_COMMAND="(.*)"$', ci, re.M).group(1)
    assert command == ("python3 -m venv .venv && . .venv/bin/activate && "
                       "pip install -e '.[test]' && pytest")
    assert command in _read(os.path.join(REPO, "README.md"))


def test_readme_links_exist():
    readme = _read(os.path.join(REPO, "README.md"))
    broken = []
    for target in LINK.findall(readme):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not os.path.exists(os.path.join(REPO, path)):
            broken.append(target)
    assert not broken, f"README.md links to files that do not exist: {broken}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, REPO))
def test_no_internal_history(page):
    hits = [m.group(0) for m in HISTORY.finditer(_read(page))]
    assert not hits, f"{os.path.relpath(page, REPO)} names internal history: {hits}"


def _nav_pages(config):
    """The pages mkdocs.yml's `nav:` lists, at every depth."""
    nav = re.search(r"^nav:\n((?:[ \t]+.*\n|\n)*)", config, re.M)
    return set(NAV_PAGE.findall(nav.group(1))) if nav else set()


def test_nav_pages_reads_nested_sections():
    config = ("site_name: x\nnav:\n  - Home: index.md\n  - Guides:\n      - A: guides/a.md\n"
              "      - Deeper:\n          - guides/deep/b.md\n\nplugins:\n  - x.md\n")
    assert _nav_pages(config) == {"index.md", "guides/a.md", "guides/deep/b.md"}


def test_mkdocs_nav_lists_every_page():
    """Every page under docs/ is in mkdocs.yml's nav, and every nav entry
    is a page (mkdocs --strict would only warn about an omitted page if
    validation says so)."""
    listed = _nav_pages(_read(os.path.join(REPO, "mkdocs.yml")))
    pages = {os.path.relpath(os.path.join(root, f), DOCS).replace(os.sep, "/")
             for root, _, files in os.walk(DOCS) for f in files if f.endswith(".md")}
    assert sorted(pages - listed) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(listed - pages) == [], "nav entries with no page under docs/"
