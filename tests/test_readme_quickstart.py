"""The README's quickstart runs as written and prints what the README shows.

The fenced bash block under "Quickstart" is run verbatim with bash, in an empty
directory, as a user right after `pip install` would (the shipped predictors answer);
every line of the README's shown output that is not abridged (`...`) must appear in
what it prints: the same words, and each number within ``REL_TOL`` of the one shown
(the op models are built on the user's machine, and another release of scikit-learn or
numpy moves their last digits).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: How far a printed number may lie from the README's (relative).
REL_TOL = 0.05
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)")


def _parts(line: str) -> tuple[list[str], list[float]]:
    """A line's words (whitespace runs made one space) and its numbers."""
    pieces = _NUMBER.split(line.strip())
    words = [" ".join(p.split()) for p in pieces[::2]]
    return words, [float(p) for p in pieces[1::2]]


def _same(shown: str, printed: str) -> bool:
    words, numbers = _parts(shown)
    printed_words, printed_numbers = _parts(printed)
    return words == printed_words and all(
        abs(a - b) <= REL_TOL * max(abs(a), abs(b))
        for a, b in zip(numbers, printed_numbers, strict=True)
    )


def _quickstart() -> tuple[str, list[str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    command = next(body for lang, body in blocks if lang == "bash")
    shown = next(body for lang, body in blocks if lang == "")
    lines = [line.rstrip() for line in shown.splitlines() if line.strip() and "..." not in line]
    return command, lines


def test_the_readme_quickstart_prints_what_the_readme_shows(tmp_path):
    command, shown = _quickstart()
    assert "opcost predict" in command
    env = {**os.environ, "OPCOST_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    printed = [line.rstrip() for line in run.stdout.splitlines()]
    missing = [line for line in shown if not any(_same(line, p) for p in printed)]
    assert not missing, f"README shows lines the quickstart did not print: {missing}"


def test_numbers_may_move_a_little_words_not_at_all():
    shown = "inference        h100   6.171   6.148  1.524 host   178.1  time"
    assert _same(shown, "inference        h100   6.171   6.148  1.526 host   178.4  time")
    assert _same(shown, "inference  h100  6.171  6.148  1.5241 host  178.1  time")  # widths
    assert not _same(shown, "inference        h100   6.171   6.148  1.824 host   178.1  time")
    assert not _same(shown, "inference        h100   6.171   6.148  1.524 host   178.1  energy")
    assert not _same(shown, "inference        h200   6.171   6.148  1.524 host   178.1  time")
