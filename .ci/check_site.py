"""Checks the built docs site's API reference: every documented value is one
item. Returns and Yields sections hold exactly one item, each Raises item
names an exception class, and each Parameters item names a parameter of the
signature it documents, so no item is only the continuation of the one
before it (what unindented continuation lines render as).

    python .ci/check_site.py SITE_DIR

Prints one line per problem and exits 1 if there is any.
"""

import html.parser
import pathlib
import re
import sys

EXCEPTION = re.compile(r"^(\w+\.)*([A-Z]\w*)?(Error|Exception|Exit|Interrupt|Warning|Iteration)$")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


class _Sections(html.parser.HTMLParser):
    """Collects (signature text, section title, [first code text of each
    item]) of mkdocstrings' list-style sections."""

    def __init__(self):
        super().__init__()
        self.sections = []
        self._signature = ""
        self._in_signature = 0     # depth inside a doc-signature block
        self._title = None         # the section title read, whose <ul> comes next
        self._in_title = False
        self._list_depth = 0       # depth inside that section's <ul>
        self._item = None          # the current top-level item's [code text]
        self._in_code = False

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if self._in_signature:
            self._in_signature += 1
        elif "doc-signature" in classes:
            self._in_signature = 1
            self._signature = ""
        if tag == "span" and "doc-section-title" in classes:
            self._in_title, self._title = True, ""
        elif tag == "ul" and self._title is not None:
            if self._list_depth == 0:
                self.sections.append((self._signature, self._title.strip().rstrip(":"), []))
            self._list_depth += 1
        elif tag == "li" and self._list_depth == 1:
            self._item = [""]
            self.sections[-1][2].append(self._item)
        elif tag == "code" and self._item is not None and not self._item[0]:
            self._in_code = True

    def handle_endtag(self, tag):
        if self._in_signature:
            self._in_signature -= 1
        if tag == "span" and self._in_title:
            self._in_title = False
        elif tag == "ul" and self._list_depth:
            self._list_depth -= 1
            if self._list_depth == 0:
                self._title = None
        elif tag == "li" and self._list_depth == 1:
            self._item = None
        elif tag == "code":
            self._in_code = False

    def handle_data(self, data):
        if self._in_signature:
            self._signature += data
        if self._in_title:
            self._title += data
        if self._in_code:
            self._item[0] += data


def problems(site_dir):
    """The problems of the reference pages under `site_dir`, one line each."""
    found = []
    pages = sorted(pathlib.Path(site_dir, "reference").glob("*/index.html"))
    if not pages:
        return [f"{site_dir}: no reference pages"]
    for page in pages:
        parser = _Sections()
        parser.feed(page.read_text())
        where = page.parent.name
        for signature, title, items in parser.sections:
            texts = [item[0].strip() for item in items]
            if title in ("Returns", "Yields") and len(items) != 1:
                found.append(f"{where}: a {title} section of {len(items)} items {texts}")
            elif title == "Raises":
                found += [f"{where}: Raises item {t!r} is not an exception"
                          for t in texts if not EXCEPTION.match(t)]
            elif title == "Parameters":
                names = set(IDENTIFIER.findall(signature))
                found += [f"{where}: parameter {t!r} is not in the signature {signature!r}"
                          for t in texts if t.lstrip("*") not in names]
    return found


def main(argv):
    if len(argv) != 2:
        print("usage: python .ci/check_site.py SITE_DIR", file=sys.stderr)
        return 2
    found = problems(argv[1])
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
