"""The docstring examples and the documentation's Python examples run as written; README.md and docs/ hold
together (length, links, the site's navigation)."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import numpy as np
import pytest

import foal_pipe.core.statistics
import foal_pipe.model.classifier
import foal_pipe.model.projection
from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


@pytest.mark.parametrize("module", [foal_pipe.model.classifier, foal_pipe.model.projection, foal_pipe.core.statistics])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_docs_python_api_example(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", (DOCS / "python-api.md").read_text(), re.S).group(1)
    rng = np.random.default_rng(0)
    x, y = rng.random((120, 64)).astype(np.float32), np.repeat(np.arange(10), 12)
    store = write_store(tmp_path / "digits.zarr", (x, y), (x[:30], y[:30]), [str(i) for i in range(10)], chunk_rows=50)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code.replace("data/features/digits.zarr", str(store)), namespace)
    assert namespace["pred"].shape == (30,) and namespace["clf"].n_samples_seen_ == 120


def test_docs_read_split_example(tmp_path, capsys):
    page = (DOCS / "python-api.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "read_split" in block)
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(3), 20)
    x = (rng.normal(size=(60, 16)) + 2 * y[:, None]).astype(np.float32)
    store = write_store(tmp_path / "digits.zarr", (x, y), (x[::4], y[::4]), ["ant", "bee", "cow"], chunk_rows=16)
    namespace: dict = {}
    exec(code.replace("data/features/digits.zarr", str(store)), namespace)
    np.testing.assert_array_equal(namespace["X"], x)
    np.testing.assert_array_equal(namespace["y_test"], y[::4])
    assert namespace["names"] == ["ant", "bee", "cow"]
    score, first = capsys.readouterr().out.rsplit(" [", 1)
    assert float(score) > 0.9 and first.startswith("'ant'")


def test_read_split_refuses_an_unknown_split(tmp_path):
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.store import read_split

    store = write_store(tmp_path / "s.zarr", (np.zeros((4, 2)), np.arange(4) % 2), (np.zeros((2, 2)), np.arange(2)),
                        ["a", "b"])
    with pytest.raises(FoalPipeError, match="unknown split 'val'; choose train or test"):
        read_split(store, "val")


# --------------------------------------------------------------------------------------------------
# README.md is the front door; docs/ is the site (mkdocs.yml). Both read on GitHub as they are.

PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "RESULTS.md", *sorted(DOCS.glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~)")


def _prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    """The heading anchors that GitHub and the site (Python-Markdown's toc, which ``mkdocs build --strict`` checks)
    both give. GitHub's: lower case, punctuation but '-' and '_' dropped, each space to '-', repeats numbered '-1';
    the site's: the same but a run of spaces and '-' becomes one '-', repeats numbered '_1'. A heading whose two
    anchors differ (``--flag`` in it, or a repeat) gives none: a link to it works on one of the two only."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            github, site = text.replace(" ", "-"), re.sub(r"[-\s]+", "-", text.strip())
            count = seen.get(github, 0)
            seen[github] = count + 1
            if count == 0 and github == site:
                anchors.add(github)
    return anchors


def _links(path: Path) -> list[str]:
    text = "\n".join(re.sub(r"`[^`]*`", "", line) for line in _prose_lines(path))
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


def test_readme_is_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(page):
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)


def test_the_site_navigation_lists_every_docs_page():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for item in node.values():
                yield from pages(item)

    listed = list(pages(config["nav"]))
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(p for p in listed if "/" not in p)
    published = [p.removeprefix("repo/") for p in listed if p.startswith("repo/")]
    assert published and all((ROOT / p).is_file() for p in published)


def test_metrics_page_worked_example():
    """docs/metrics.md's example matrix gives the A_avg, A_last and F that the page works out by hand."""
    page = (DOCS / "metrics.md").read_text()
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", page, re.S).group(1), namespace)
    m = namespace["m"]
    assert [round(a, 4) for a in m["A_steps"]] == [0.9, 0.875, 0.89]
    assert (round(m["A_avg"], 4), round(m["A_last"], 4), round(m["F"], 4)) == (0.8883, 0.89, 0.05)
    assert round(m["F_published_code"], 4) == 0.0333
    for shown in ("A_avg = (0.90 + 0.875 + 0.89) / 3 = 0.8883", "A_last = A_3 = 0.89",
                  "F = ((0.90 - 0.85) + (0.95 - 0.90)) / 2 = 0.05"):
        assert shown in page
