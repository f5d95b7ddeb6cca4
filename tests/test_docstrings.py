"""The API reference reads each documented value as one item: the Google
docstrings of alf_async, parsed as the docs site parses them (griffe, the
parser of mkdocstrings-python), have no Args, Raises, Returns or Yields item
that is only the continuation of the one before."""

import importlib.util
import logging
import os
import re

import griffe

CHECK_SITE = os.path.join(os.path.dirname(__file__), os.pardir, ".ci", "check_site.py")

EXCEPTION_NAME = re.compile(r"^[A-Za-z_][\w.]*$")


def _objects(obj):
    """`obj` and every module, class, function and attribute inside it that
    alf_async defines (aliases, the names it imports, skipped)."""
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _objects(member)


def _parameter_names(obj):
    if obj.is_function:
        return {p.name for p in obj.parameters}
    if obj.is_class:
        init = obj.members.get("__init__")
        names = {p.name for p in init.parameters} if init is not None and (
            not init.is_alias) else set()
        return names | set(obj.attributes)
    return set()


def _problems():
    package = griffe.load("alf_async", docstring_parser="google",
                          resolve_aliases=False)
    problems = []
    for obj in _objects(package):
        if obj.docstring is None:
            continue
        for section in obj.docstring.parse("google"):
            kind = section.kind.value
            where = f"{obj.path} ({kind})"
            if kind in ("returns", "yields") and len(section.value) > 1:
                problems.append(f"{where}: {len(section.value)} items, "
                                f"{[item.description[:40] for item in section.value]}")
            if kind == "raises":
                for item in section.value:
                    if not EXCEPTION_NAME.match(str(item.annotation)):
                        problems.append(f"{where}: {str(item.annotation)[:60]!r} is not an "
                                        f"exception")
            if kind in ("parameters", "other parameters") and obj.is_function | obj.is_class:
                names = _parameter_names(obj)
                for item in section.value:
                    if not names or item.name.lstrip("*") in names:
                        continue
                    problems.append(f"{where}: {item.name!r} is not a parameter")
    return problems


def test_docstring_items_are_whole(caplog):
    with caplog.at_level(logging.WARNING, logger="griffe"):
        problems = _problems()
    # Types are named in prose, not annotated: griffe's notes of that are not problems.
    problems += [f"griffe: {r.getMessage()}" for r in caplog.records
                 if r.levelno >= logging.WARNING and "No type or annotation" not in r.getMessage()]
    assert not problems, "\n".join(problems)


def _check_site():
    spec = importlib.util.spec_from_file_location("check_site", CHECK_SITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(code, description):
    """An item (a Returns item has no name), its description holding a list."""
    name = f"<b><code>{code}</code></b> - " if code else ""
    return (f'<li class="doc-section-item field-body">{name}'
            f'<div class="doc-md-description"><p>{description}</p>'
            f'<ul><li>a <code>nested</code> list</li></ul></div></li>')


def _section(title, *items):
    return (f'<p><span class="doc-section-title">{title}:</span></p>'
            f'<ul>{"".join(items)}</ul>')


def test_the_site_check_finds_an_item_that_continues_the_one_before(tmp_path):
    # mkdocstrings-python's list-style sections, as .ci/run builds the site.
    page = tmp_path / "reference" / "driver" / "index.html"
    page.parent.mkdir(parents=True)
    signature = ('<div class="doc-signature highlight"><pre><code>stop(timeout, *, grace)'
                 '</code></pre></div>')
    whole = signature + "".join([
        _section("Parameters", _item("timeout", "seconds"), _item("grace", "seconds")),
        _section("Returns", _item("", "the number of env steps, counted")),
        _section("Raises", _item("RuntimeError", "a"), _item("DriverStoppedError", "b"),
                 _item("Exception", "c"), _item("tf.errors.OpError", "d"))])
    page.write_text(whole)
    check = _check_site()
    assert check.problems(str(tmp_path)) == []
    page.write_text(whole + signature + "".join([
        _section("Parameters", _item("timeout", "seconds"), _item("by", "the driver")),
        _section("Returns", _item("", "the number of env steps,"), _item("", "counted")),
        _section("Raises", _item("RuntimeError", "a"), _item("the learner", "b"))]))
    assert check.problems(str(tmp_path)) == [
        "driver: parameter 'by' is not in the signature 'stop(timeout, *, grace)'",
        "driver: a Returns section of 2 items ['nested', 'nested']",
        "driver: Raises item 'the learner' is not an exception",
    ]
