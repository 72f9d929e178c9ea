"""The documentation: the README fits on a page and keeps CI's test command, every relative link of the README and of
docs/*.md reaches an existing file and heading, every command the README's table must list is there, and the mkdocs
site builds with --strict and no warning."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks, with inline code spans blanked out."""
    lines, in_fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(CODE_SPAN.sub("``", line))
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (mkdocs) makes it; it equals GitHub's for the plain ASCII headings
    these pages link to."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(m.group(2)) for line in prose_lines(path) if (m := HEADING.match(line))}


def relative_links(path: Path) -> list[str]:
    return [target for line in prose_lines(path) for target in LINK.findall(line)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked here


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_the_readme_fits_on_a_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to a page under docs/")


def test_the_readme_keeps_the_test_command_ci_runs():
    assert "python -m pytest -q" in README.read_text(encoding="utf-8")  # .ci/run runs the README's test command


def atlas_fast_commands() -> list[str]:
    """Every command of the CLI, e.g. ``train`` and ``cache build`` (a group's own subcommands one by one)."""
    import argparse

    from atlas_fast.cli import build_parser

    def subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            return [prefix]
        return [name for group in groups for sub, child in group.choices.items()
                for name in subcommands(child, f"{prefix} {sub}".strip())]

    return subcommands(build_parser(), "")


def test_the_readme_table_lists_every_atlas_fast_command():
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `atlas-fast ")]
    assert rows, "README.md has no command table (rows starting with | `atlas-fast ...)"
    missing = [name for name in atlas_fast_commands()
               if not any(re.search(rf"`atlas-fast {re.escape(name)}(\s|`)", row) for row in rows)]
    assert not missing, f"the README's command table lacks {missing}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading(path: Path):
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{target}: no such file")
            continue
        if path.parent == DOCS and DOCS not in linked.parents and linked != DOCS:
            problems.append(f"{target}: leaves docs/ (the site cannot follow it; name the path in code instead)")
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: {linked.relative_to(REPO)} has no heading with the anchor #{anchor}")
    assert not problems, f"{path.relative_to(REPO)}:\n" + "\n".join(problems)


def test_every_docs_page_is_in_the_site_navigation():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS.glob("*.md") if not re.search(rf":\s*{re.escape(p.name)}\s*$", config, re.M)]
    assert not missing, f"mkdocs.yml's nav lacks {missing}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed: pip install -e '.[docs]' (CI's .ci/run installs it)")
def test_the_site_builds_strictly_without_warnings(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # a theme notice, not a build warning
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = build.stdout + build.stderr
    warnings = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert build.returncode == 0 and not warnings, output
    assert (tmp_path / "site" / "index.html").exists()


def test_the_install_page_lists_each_extra_as_setup_cfg_declares_it():
    """docs/install.md's table of extras names, for every extra of setup.cfg, exactly the packages it installs (its
    `test` row had lost hypothesis and optuna, and `search` had no row)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    declared = {extra: {re.split(r"[<>=!~\[; ]", line.strip())[0] for line in value.splitlines() if line.strip()}
                for extra, value in config["options.extras_require"].items()}
    rows = {}
    for line in (DOCS / "install.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[\w-]+`", cells[0]) and cells[1].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    assert rows == declared
