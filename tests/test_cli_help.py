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


def run_with_stderr(argv: list[str], tty: bool) -> str:
    """``opcost ARGV`` in a fresh interpreter, its stderr a terminal or a pipe; its stderr."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    command = [sys.executable, "-m", "opcost.cli", *argv]
    if not tty:
        done = subprocess.run(command, capture_output=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr.decode()
    parent, child = pty.openpty()
    # A terminal of 80 columns (a new pseudo-terminal has 0, where tqdm draws nothing).
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=child, env=env) as proc:
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # the terminal closed: the process is done
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=120) == 0
    os.close(parent)
    return b"".join(chunks).decode(errors="replace")


def test_progress_shows_on_a_terminal_only(predictors):
    argv = ["predict", "--ops", str(REPO / "tests/data/h100/ops/resnet18_4x3x64x64.parquet")]
    argv += ["--predictors", str(predictors)]
    assert "predict: " in run_with_stderr(argv, tty=True)
    assert run_with_stderr(argv, tty=False) == ""
