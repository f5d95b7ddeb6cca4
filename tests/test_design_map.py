"""docs/design.md's map keeps up with the package: a line per module."""

import os
import re

import alf_async

PACKAGE_DIR = os.path.dirname(alf_async.__file__)
DESIGN = os.path.join(os.path.dirname(PACKAGE_DIR), "docs", "design.md")


def _modules():
    """Every module of the package, as a path relative to alf_async/."""
    found = set()
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                found.add(os.path.relpath(os.path.join(root, name), PACKAGE_DIR).replace(
                    os.sep, "/"))
    return found


def test_the_design_map_has_a_line_for_every_module_and_no_other():
    with open(DESIGN, encoding="utf-8") as f:
        listed = re.findall(r"^\| `([\w/]+\.py)` \| \S.* \|$", f.read(), re.MULTILINE)
    assert len(listed) == len(set(listed)), "a module listed twice"
    modules = _modules()
    assert sorted(modules - set(listed)) == [], "modules without a line in docs/design.md"
    assert sorted(set(listed) - modules) == [], "lines for modules that are gone"
