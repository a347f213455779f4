"""The README's quickstart runs as written and prints what the README shows.

The fenced bash block under "Quickstart" is run verbatim with bash, in an empty
directory, as a user right after `pip install` would (the shipped predictors answer);
every line of the README's shown output that is not abridged (`...`) must appear in
what it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    printed = {line.rstrip() for line in run.stdout.splitlines()}
    missing = [line for line in shown if line not in printed]
    assert not missing, f"README shows lines the quickstart did not print: {missing}"
