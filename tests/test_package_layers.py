"""The package layers are the architecture: imports run one way, top to bottom.

Every `import` in alf_async (module level or inside a function) is read with
`ast`, without importing anything, and checked against the layers:

    bin                          CLI entry points
    trainer                      train(): the gin wiring of one run
    resume | train_checks        what a rerun on a root_dir restores, applies or refuses;
                                 the checks of train()'s arguments
    distributed | serving        built on the learner (siblings: neither imports the other)
    settings                     train()'s settings groups (collectors build theirs too)
    learning                     the learner, hooks, replayers, agents
    driver                       the asynchronous driver
    environments                 every environment, as a TFEnvironment
    tf215_py311_fixes, _lazy,    workarounds for the pinned stack; lazy exports;
    kernels, roles, quiet        TensorFlow's kernels, chosen before it is imported;
                                 the roles of a run, named; a quiet start
    errors                       the one ConfigError (imports nothing)

A module may import its own package and any layer below its own; `testing`
(the fakes tests and benchmarks share) may import only environments, and
nothing in the package imports it.
"""

import ast
import os

import pytest

import alf_async

PACKAGE_DIR = os.path.dirname(alf_async.__file__)

# Layer of each top-level part of alf_async; a module may import parts of a
# lower layer, or its own part.
LAYERS = {
    "_lazy": 0,
    "tf215_py311_fixes": 0,
    "kernels": 0,
    "roles": 0,
    "quiet": 0,
    "errors": -1,
    "environments": 1,
    "driver": 2,
    "learning": 3,
    "settings": 4,
    "distributed": 5,
    "serving": 5,
    "resume": 6,
    "train_checks": 6,
    "trainer": 7,
    "bin": 8,
}
# testing sits beside the stack: it may import these parts, and none imports it.
TESTING_MAY_IMPORT = {"_lazy", "tf215_py311_fixes", "quiet", "roles", "environments",
                      "testing"}


def _modules():
    """{dotted module name: path} for every .py file of the package."""
    modules = {}
    for root, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            modules[".".join(rel)] = path
    return modules


def _imports(path, modules):
    """The alf_async modules `path` imports (every import statement, at any depth)."""
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` imports the module pkg.sub where there is one.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("alf_async.") or name == "alf_async":
                found.add(name)
    return found


def _graph():
    modules = _modules()
    return {m: _imports(path, modules) - {m} for m, path in modules.items()}


def _part(module):
    """'alf_async.driver.env_thread' -> 'driver'; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(m) for m in _modules()} - {None, "testing"}
    assert parts == set(LAYERS)


def test_no_import_circle_anywhere_in_the_package():
    assert _cycles(_graph()) == []


def test_a_layer_imports_only_its_own_part_and_layers_below_it():
    upward = []
    for module, imported in sorted(_graph().items()):
        part = _part(module)
        if part is None:  # alf_async/__init__.py: the lazy public facade
            continue
        for target in sorted(imported):
            target_part = _part(target)
            if target_part is None or target_part == part:
                continue
            if part == "testing":
                ok = target_part in TESTING_MAY_IMPORT
            else:
                ok = target_part != "testing" and LAYERS[target_part] < LAYERS[part]
            if not ok:
                upward.append(f"{module} -> {target}")
    assert upward == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_circle_check_finds_circles(graph, expected):
    assert _cycles(graph) == expected


def test_the_layer_check_reads_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from alf_async.learning import learner\n")
    assert _imports(str(source), _modules()) == {"alf_async.learning.learner"}


def test_the_top_level_names_import():
    from alf_async import AsyncOffPolicyDriver, DriverStoppedError, Learner
    from alf_async.driver import async_driver
    from alf_async.learning import learner
    assert (AsyncOffPolicyDriver, DriverStoppedError, Learner) == (
        async_driver.AsyncOffPolicyDriver, async_driver.DriverStoppedError, learner.Learner)
