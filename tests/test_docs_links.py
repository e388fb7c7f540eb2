"""Relative links in the repository's Markdown files lead somewhere.

Every `[text](target)` in a tracked `.md` file whose target is not a URL must
name a file or folder that exists, relative to the linking file, and a
`#fragment` must name a heading of the target the way GitHub derives heading
anchors (lower case; punctuation other than `-` and `_` dropped; spaces to
`-`; a repeated heading gets `-1`, `-2`, ...) or an `<a id="...">` in it.
Code blocks and inline code are skipped, as GitHub does not render links
there.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def _markdown_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked Markdown files")
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [REPO / line for line in out.splitlines() if line]


def github_anchor(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading)            # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)     # links keep their text
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """The heading anchors of a Markdown file, and its `<a id="...">` ones."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    result = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return frozenset(result)


def test_github_anchor_follows_githubs_rule():
    assert github_anchor("Launch variant choice: `kAuto` (refit on the H200 of 2026-11-27, "
                         "issue 16)") == ("launch-variant-choice-kauto-refit-on-the-h200-of-"
                                          "2026-11-27-issue-16")
    assert github_anchor("E4's random heads, learnable scale") == "e4s-random-heads-learnable-scale"
    assert github_anchor("Set-up: two commands") == "set-up-two-commands"


def test_every_relative_link_names_an_existing_file_and_heading():
    broken = []
    checked = 0
    for md in _markdown_files():
        text = INLINE_CODE.sub("", FENCE.sub("", md.read_text(encoding="utf-8")))
        for target in LINK.findall(text):
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # a URL (http:, https:, mailto:)
            path_part, _, fragment = target.partition("#")
            dest = (md.parent / path_part).resolve() if path_part else md
            checked += 1
            if not dest.exists():
                broken.append(f"{md.relative_to(REPO)}: {target} (no such file)")
            elif fragment and dest.is_file() and dest.suffix == ".md" \
                    and fragment not in anchors(dest):
                broken.append(f"{md.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 100  # the docs link to each other; a parser that finds none is broken
    assert not broken, "\n".join(broken)
