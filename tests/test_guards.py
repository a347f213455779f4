"""Every mutation guard of tools/guards.yaml still names text its file holds once, so
that ``python tools/guard_mutations.py`` can apply each mutation (the guards themselves
run their tests there, minutes each, not here)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import guard_mutations  # noqa: E402


def test_every_guard_names_text_that_occurs_once_in_its_file():
    guards = list(guard_mutations.load_guards())
    assert guards
    files = guard_mutations.repository_files(REPO)
    assert guard_mutations.check_mutations(files, guards) == []
