"""benchmarks/, examples/ and tests/ use the package; none uses another.

Every `import` in their files (module level or inside a function) is read
with `ast`, without importing anything, and resolved as Python would find
it: a script run as `python benchmarks/x.py` has its own directory on
sys.path, so `import sibling` finds benchmarks/sibling.py; a test has
tests/ on sys.path (pytest's rootdir) and imports its own package
relatively (tests/stress/). Checked:

- no file touches sys.path;
- no import between benchmarks/, examples/ and tests/ (an import that
  resolves nowhere but names a module of another of them): what they share
  lives in alf_async.testing;
- no import circle among their modules (test_package_layers.py checks the
  package itself).
"""

import ast
import functools
import os

import pytest

from test_package_layers import _cycles

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AREAS = ("benchmarks", "examples", "tests")


def _files(root, area):
    """The .py files under root/area (benchmarks/results holds none)."""
    found = []
    for directory, dirs, files in os.walk(os.path.join(root, area)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.join(directory, f) for f in sorted(files) if f.endswith(".py")]
    return found


def _find(directory, dotted):
    """The file of module `dotted` under `directory` (a .py file or a
    package's __init__.py, as far down as the name goes), or None."""
    path, found = directory, None
    for part in dotted.split("."):
        if os.path.isfile(os.path.join(path, part + ".py")):
            return os.path.join(path, part + ".py")
        package = os.path.join(path, part, "__init__.py")
        if not os.path.isfile(package):
            return found
        path, found = os.path.join(path, part), package
    return found


def _imported_names(tree, path):
    """(dotted name, search directories or None for absolute) of every import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: from the file's package
                base = os.path.dirname(path)
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                prefix = (node.module + ".") if node.module else ""
                for alias in node.names:
                    yield prefix + alias.name, [base]
                if node.module:
                    yield node.module, [base]
            else:
                for alias in node.names:
                    yield f"{node.module}.{alias.name}", None
                yield node.module, None


@functools.lru_cache(maxsize=None)
def _graph(root=REPO):
    """({file: {files it imports}}, [(file, import name, area it names)],
    [(file, line) where it touches sys.path]) over the areas under `root`."""
    top_level = {area: {os.path.splitext(os.path.relpath(p, os.path.join(root, area)))[0]
                        .split(os.sep)[0] for p in _files(root, area)} for area in AREAS}
    graph, crossing, path_edits = {}, [], []
    for area in AREAS:
        for path in _files(root, area):
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            # A script's own directory; for tests, tests/ too (pytest's rootdir).
            search = [os.path.dirname(path)] + (
                [os.path.join(root, "tests")] if area == "tests" else [])
            edges = set()
            for name, relative in _imported_names(tree, path):
                for directory in relative or search:
                    target = _find(directory, name)
                    if target is not None:
                        if target != path:
                            edges.add(target)
                        break
                else:
                    top = name.split(".")[0]
                    for other in AREAS:
                        if other != area and relative is None and top in top_level[other]:
                            crossing.append((os.path.relpath(path, root), top, other))
            graph[path] = edges
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and node.attr == "path"
                        and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                    path_edits.append((os.path.relpath(path, root), node.lineno))
    return graph, sorted(set(crossing)), path_edits


def test_no_file_touches_sys_path():
    assert _graph()[2] == []


def test_no_import_between_benchmarks_examples_and_tests():
    assert _graph()[1] == []


def test_no_import_circle_in_benchmarks_examples_or_tests():
    graph = _graph()[0]
    assert [[os.path.relpath(p, REPO) for p in c] for c in _cycles(graph)] == []


def test_imports_resolve_as_python_finds_them():
    graph = _graph()[0]
    edges = {(os.path.relpath(a, REPO), os.path.relpath(b, REPO))
             for a, targets in graph.items() for b in targets}
    assert ("benchmarks/per_frame.py", "benchmarks/unroll_sync.py") in edges   # a sibling
    assert ("tests/stress/test_chaos.py", "tests/stress/chaos.py") in edges    # relative
    assert ("tests/test_pacing.py", "tests/cli_runs.py") in edges              # tests/


def test_the_checks_find_a_circle_a_crossing_and_a_sys_path_edit(tmp_path):
    for area in AREAS:
        (tmp_path / area).mkdir()
    (tmp_path / "benchmarks" / "a.py").write_text("import b\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def f():\n    from a import g\n")
    (tmp_path / "benchmarks" / "c.py").write_text(
        "import sys\nsys.path.insert(0, 'tests')\nimport test_x\n")
    (tmp_path / "tests" / "test_x.py").write_text("import os\n")
    graph, crossing, path_edits = _graph(str(tmp_path))
    assert [[os.path.basename(p) for p in c] for c in _cycles(graph)] == [["a.py", "b.py"]]
    assert crossing == [(os.path.join("benchmarks", "c.py"), "test_x", "tests")]
    assert path_edits == [(os.path.join("benchmarks", "c.py"), 2)]


@pytest.mark.parametrize("source", ["import sys\nsys.path.append('x')\n",
                                    "import sys\nsys.path[:0] = ['x']\n"])
def test_every_kind_of_sys_path_edit_is_found(tmp_path, source):
    for area in AREAS:
        (tmp_path / area).mkdir()
    (tmp_path / "examples" / "e.py").write_text(source)
    assert _graph(str(tmp_path))[2] == [(os.path.join("examples", "e.py"), 2)]
