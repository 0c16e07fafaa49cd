"""MkDocs hooks: publish a few Markdown files from outside docs/ as pages of the site.

The docs pages link to them as they sit in the repository (``../benchmarks/RESULTS.md``), so the links work
on GitHub too; here each becomes the page ``repo/<path>`` and the links are rewritten to it.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

#: Repository files (relative to the repository root) published as ``repo/<path>``.
PUBLISHED = ("benchmarks/RESULTS.md", "CHANGELOG.md")
PREFIX = "repo"
_LINK = re.compile(r"\]\(\.\./(" + "|".join(re.escape(p) for p in PUBLISHED) + r")(#[^)\s]*)?\)")


def on_files(files, config):
    root = Path(config["docs_dir"]).parent
    for rel in PUBLISHED:
        files.append(File.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(root / rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(PREFIX + "/"):
        return markdown
    up = "../" * page.file.src_uri.count("/")
    return _LINK.sub(lambda m: f"]({up}{PREFIX}/{m.group(1)}{m.group(2) or ''})", markdown)
