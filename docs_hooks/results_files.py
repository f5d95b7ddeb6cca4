"""An mkdocs hook: the results files of benchmarks/results/ on the site.

Every rendered row links the file behind its figures. README.md links
`benchmarks/results/<file>`; a docs page links `results/files/<file>`
relative to itself (render_results.py writes both), and this hook adds each
file there, so `mkdocs build --strict` checks those links and the site
serves the files. Markdown notes (HISTORY.md) are not added: as pages they
would need a place in the nav.
"""

import pathlib

from mkdocs.structure.files import File

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "results"
SITE_DIR = "results/files"


def on_files(files, config):
    """Adds every benchmarks/results/ file but Markdown to `files` under
    results/files/."""
    for path in sorted(RESULTS.iterdir()):
        if path.is_file() and path.suffix != ".md":
            files.append(File.generated(config, f"{SITE_DIR}/{path.name}",
                                        abs_src_path=str(path)))
    return files
