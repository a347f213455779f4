"""What users expect of the ``opcost`` command: ``--version`` and ``--help`` with examples."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest

from opcost.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("extract", "predict", "train", "plan")


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"opcost {version}\n"


def examples(text: str) -> list[list[str]]:
    """The commands under ``examples:`` in a help text, ``\\`` continuations joined."""
    block = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_shows_examples_that_parse(capsys, command):
    argv = [command, "--help"] if command else ["--help"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    shown = examples(capsys.readouterr().out)
    assert shown, "no examples"
    for words in shown:
        assert words[0] == "opcost"
        if command:
            assert words[1] == command
        args = build_parser().parse_args(words[1:])  # exits 2 on an unknown option
        assert args.command == words[1]
