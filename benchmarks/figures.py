"""The measured figures of a Markdown page that stand outside rendered blocks.

A measured figure (a rate, ratio, score, time or size from a run) belongs in
a block benchmarks/render_results.py writes from its results file. Outside
those blocks, fenced code, inline code spans, HTML comments and tags, link
targets, URLs, images and headings' `{#anchors}`, `find` flags:

- ratios: `1.52x`, `2x`, `0.57×` (not layouts: `4x16`, `2 x 8`);
- percents: `82%`, `1.5 %`;
- rates: a number before `/s` or `per second` (`2,306 steps/s`, `340 env steps/s`);
- thousands with commas: `4,985`;
- signed scores: `+19.9`, `-21` (not ranges `1-8`, dates, `kill -9`);
- decimals with or without a unit: `0.54`, `7.9 ms`, `3.2M frames`, except
  versions: `x.y.z`, or `x.y` after a package's name (`Python 3.11`,
  `TensorFlow 2.15`).

Plain integers (`32 CartPoles`, `60 minutes`, port `8000`) are settings and
counts, not figures.
"""

import re

OPEN = re.compile(r"^<!-- rendered: (\S+) -->\s*$")
CLOSE = re.compile(r"^<!-- /rendered: (\S+) -->\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)")
# Names a version number follows.
VERSIONED = re.compile(
    r"(?:python|tensorflow|tensorflow-cpu|tf|tf-agents|tf_agents|gymnasium|gym|numpy|ale-py|"
    r"envpool|mujoco|reverb|dm-reverb|ray|mkdocs|keras|protobuf|pip|ubuntu|version|versions|"
    r"release|http/|[<>=~!]=?)\s*\(?\s*(?:\d+\.\d+\s*(?:,|or|and|to|-|/|\+)\s*)*$",
    re.IGNORECASE)
# A signed number after a comparison is a threshold (`>= -200`), not a score.
THRESHOLD = re.compile(r"[<>=]=?\s*$")
PATTERNS = (
    re.compile(r"(?<![\w.])\d+(?:\.\d+)?[x×](?!\w)"),                         # ratio
    re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?%"),                                # percent
    re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?\s?[kKM]?\s?(?:[A-Za-z_-]+\s){0,3}"
               r"(?:[A-Za-z_-]*/s(?:ec)?\b|per second\b)"),                    # rate
    re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\d,])"),                     # thousands
    re.compile(r"(?<![\w.+\-−/])(?<!kill )[+\-−]\d+(?:\.\d+)?(?![\w.]|\.\d)"),  # signed score
)
SIGNED = PATTERNS[-1]
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?!\d|\.\d)"
                     r"(?:\s?(?:ms|us|µs|s|min|h|[KMG]i?B)\b|[A-Za-z]*)")
# Stretches of a line that are not prose: code spans, images, link targets,
# URLs, HTML tags and headings' attribute lists.
NOT_PROSE = (re.compile(r"(`+)(?:(?!\1).)+?\1"), re.compile(r"!\[[^\]]*\]\([^)]*\)"),
             re.compile(r"\]\([^)]*\)"), re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$"),
             re.compile(r"<https?://[^>]*>"), re.compile(r"https?://\S+"),
             re.compile(r"<[^>\n]+>"), re.compile(r"\{[#:.][^}]*\}"))
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img\b[^>]*\bsrc=[\"']([^\"']+)")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# Images that show no measured figure: the TensorBoard screenshot and the
# concepts diagram may stand outside a picture block.
ILLUSTRATIONS = re.compile(r"(?:^|/)(?:tensorboard|concepts)[^/]*\.(?:png|svg)$")


def _blank(match):
    return " " * len(match.group(0))


def prose(line):
    """`line` with its non-prose stretches blanked (positions kept)."""
    for pattern in NOT_PROSE:
        line = pattern.sub(_blank, line)
    return line


def find(line, before=""):
    """The measured figures in one line of prose, in order.

    Args:
        line: a line of Markdown outside code blocks and comments.
        before: the prose line before it in its paragraph ("" if none): a
            version's package may end it.

    Returns:
        The figures' texts as they stand in the line.
    """
    text = prose(line)
    context = prose(before).rstrip() + " " if before.strip() else ""
    spans = []
    for pattern in PATTERNS:
        spans += [m.span() for m in pattern.finditer(text)
                  if pattern is not SIGNED or not THRESHOLD.search(text[:m.start()])]
    for match in DECIMAL.finditer(text):
        if not VERSIONED.search(context + text[:match.start()]):
            spans.append(match.span())
    merged = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return [text[start:end].strip() for start, end in merged]


def prose_lines(text):
    """[(line number, line)] of `text` outside rendered blocks, fenced code
    and HTML comments (a comment's lines come back blank)."""
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n") if not OPEN.match(m.group(0))
                       and not CLOSE.match(m.group(0)) else m.group(0), text)
    out, fence, block = [], None, None
    for number, line in enumerate(text.splitlines(), 1):
        if block is not None:
            if CLOSE.match(line):
                block = None
            continue
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped[len(fence):].strip():
                fence = None
            continue
        opened = FENCE.match(line)
        if opened:
            fence = opened.group(1)
            continue
        if OPEN.match(line):
            block = line
            continue
        out.append((number, line))
    return out


def outside_blocks(text):
    """[(line number, figure, line)] of every measured figure of the page
    `text` outside its rendered blocks, code and comments."""
    found, previous = [], (None, "")
    for number, line in prose_lines(text):
        before = previous[1] if previous[0] == number - 1 else ""
        found += [(number, figure, line) for figure in find(line, before)]
        previous = (number, line)
    return found


def images_outside_blocks(text):
    """[(line number, image path)] of the images of `text` outside rendered
    blocks and code, illustrations (`ILLUSTRATIONS`) aside."""
    found = []
    for number, line in prose_lines(text):
        for match in IMAGE.finditer(line):
            path = match.group(1) or match.group(2)
            if not ILLUSTRATIONS.search(path):
                found.append((number, path))
    return found
