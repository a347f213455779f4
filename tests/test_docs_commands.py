"""Snakemake commands shown to users put their targets before options that take a list.

``--configfile``, ``--config``, ``--resources`` and the other options of Snakemake that take
several values swallow every word that follows them: in ``snakemake --configfile
study.yaml results/ops/unique.parquet`` the target is read as a second config file (a
``UnicodeDecodeError`` on Parquet), after ``--resources gpu=1`` as a resource. This scans
the commands in the docs, READMEs, configs, profiles, messages and docstrings (fenced
blocks, indented blocks, inline code spans, comments and Python strings, ``\\`` line
continuations joined) and fails, naming file:line, where a target follows such an option,
or where ``--configfile``/``--config`` ends a command that shows no target first (a target
added at its end would be read as a config).
"""

from __future__ import annotations

import io
import re
import shlex
import tokenize
from pathlib import Path

from snakemake.cli import get_argument_parser

REPO = Path(__file__).resolve().parents[1]
#: Where commands are shown to users.
SCANNED = (
    "README.md",
    "Snakefile",
    "docs/**/*.md",
    "tests/data/**/README.md",
    "data/**/README.md",
    "profiles/**/*",
    "config/**/*",
    "bench/*.py",
    "experiments/*.py",
    "tools/*.py",
    "tools/*.sh",
    "src/opcost/**/*.py",
    "workflow/**/*",
)
#: ``snakemake`` as a command word (not ``snakemake-executor-plugin-slurm``, ``snakemake_compat``).
COMMAND = re.compile(r"(?<![\w./-])snakemake(?=[ \t])")
#: Options whose values are ``name=value`` words.
ASSIGNMENTS = {
    "--config",
    "--resources",
    "--set-threads",
    "--set-resources",
    "--set-scatter",
    "--set-resource-scopes",
    "--default-resources",
}
CONFIGFILE = {"--configfiles", "--config"}
CONFIG_FILE_VALUE = re.compile(r"\.(ya?ml|json)$")


def _options() -> dict[str, tuple[str, object]]:
    """Each option string of Snakemake's parser -> (its longest spelling, its nargs)."""
    options = {}
    for action in get_argument_parser()._actions:
        for option in action.option_strings:
            options[option] = (max(action.option_strings, key=len), action.nargs)
    return options


OPTIONS = _options()


def _placeholder(word: str) -> bool:
    """``...``, ``<study>``, ``$config``: a value the reader fills in."""
    return word in ("...", "…") or "$" in word or re.fullmatch(r"<[^>]*>", word) is not None


def check_command(words: list[str]) -> list[str]:
    """The problems of one command (the words after ``snakemake``), as short sentences."""
    problems = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            continue
        name, _, inline = word.partition("=")
        canonical, nargs = OPTIONS.get(name, (name, 0))
        if inline or nargs == 0:
            continue
        if nargs is None or nargs == "?" or isinstance(nargs, int):
            count = 1 if nargs in (None, "?") else nargs
            while count and i < len(words) and not words[i].startswith("-"):
                i += 1
                count -= 1
            continue
        values = []
        while i < len(words) and not (words[i].startswith("-") and len(words[i]) > 1):
            values.append(words[i])
            i += 1
        given = [value for value in values if not _placeholder(value)]
        if canonical == "--configfiles":
            wrong = [value for value in given if not CONFIG_FILE_VALUE.search(value)]
        elif canonical in ASSIGNMENTS:
            wrong = [value for value in given if "=" not in value]
        else:
            wrong = given[1:]
        if wrong:
            problems.append(
                f"{' '.join(wrong)} after {name} would be read as its values, not as "
                "targets: put targets before options"
            )
        if canonical in CONFIGFILE and i == len(words) and words[0].startswith("-"):
            problems.append(
                f"{name} ends the command: a target added after it is read as a "
                "config; put --configfile before another option"
            )
    return problems


def _cut(command: str) -> str:
    """The command alone: up to the shell's next ``;``, ``|``, ``&&``, `` >``, comment or ``)``."""
    depth = 0
    for index, char in enumerate(command):
        after_space = command[index - 1 : index].isspace()
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif char in ";|`)" or (char in "#>" and after_space) or command.startswith("&&", index):
            return command[:index]
    return command


def _words(command: str) -> list[str]:
    """The shell's words; a placeholder such as ``<one job>`` is one word."""
    command = re.sub(r"<[^<>]*>", lambda match: match.group().replace(" ", "_"), command)
    try:
        return shlex.split(command)
    except ValueError:  # an apostrophe in prose
        return command.split()


def commands_in(text: str, first_line: int) -> list[tuple[int, list[str]]]:
    """(line, words after ``snakemake``) for each command in a piece of text.

    A ``\\`` at a line's end continues the command on the next line, where a leading ``#``
    (a comment block) is dropped.
    """
    lines = text.split("\n")
    found = []
    for offset, line in enumerate(lines):
        for match in COMMAND.finditer(line):
            command = line[match.end() :]
            following = offset + 1
            while command.rstrip().endswith("\\") and following < len(lines):
                command = command.rstrip()[:-1] + " " + lines[following].strip().lstrip("#")
                following += 1
            found.append((first_line + offset, _words(_cut(command))))
    return found


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def markdown_commands(text: str) -> list[tuple[int, list[str]]]:
    """Commands in fenced blocks and in the other lines; inline code spans may span lines."""
    found = []
    blanked = list(text)

    def blank(start: int, end: int) -> None:
        for index in range(start, end):
            if blanked[index] != "\n":
                blanked[index] = " "

    for fence in re.finditer(r"^ *```[^\n]*\n(.*?)^ *```", text, re.M | re.S):
        found += commands_in(fence.group(1), _line_of(text, fence.start(1)))
        blank(fence.start(), fence.end())
    outside = "".join(blanked)
    for span in re.finditer(r"`([^`]+)`", outside):
        if "\n\n" in span.group(1):
            continue
        content = span.group(1)
        for match in COMMAND.finditer(content):
            line = _line_of(outside, span.start(1) + match.start())
            found.append((line, _words(_cut(content[match.end() :].replace("\n", " ")))))
        blank(span.start(), span.end())
    found += commands_in("".join(blanked), 1)
    return found


def python_commands(text: str) -> list[tuple[int, list[str]]]:
    """Commands in a module's comments and strings (adjacent literals joined)."""
    pieces: list[tuple[int, str]] = []
    group: tuple[int, str] | None = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING:
            body = re.sub(r"^[A-Za-z]*('\'\'|\"\"\"|'|\")", "", token.string)
            body = re.sub(r"('\'\'|\"\"\"|'|\")$", "", body)
            group = (group[0], group[1] + body) if group else (token.start[0], body)
            continue
        if token.type == tokenize.COMMENT:
            pieces.append((token.start[0], token.string))
        elif token.type != tokenize.NL and group:
            pieces.append(group)
            group = None
    found = []
    for line, body in pieces + ([group] if group else []):
        found += commands_in(body, line)
    return found


def scanned_files() -> list[Path]:
    files = set()
    for pattern in SCANNED:
        files.update(path for path in REPO.glob(pattern) if path.is_file())
    return sorted(path for path in files if "__pycache__" not in path.parts)


def problems_in(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []  # not text
    if path.suffix == ".md":
        commands = markdown_commands(text)
    elif path.suffix == ".py":
        commands = python_commands(text)
    else:
        commands = commands_in(text, 1)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return [
        f"{where}:{line}: snakemake {' '.join(words)}: {problem}"
        for line, words in commands
        for problem in check_command(words)
    ]


def test_check_command_finds_a_target_read_as_config_or_resource():
    """The commands of issue 20 and docs/validation.md as they were, and their fixes."""
    assert check_command(shlex.split("--configfile study.yaml results/ops/unique.parquet -n"))
    assert not check_command(shlex.split("results/ops/unique.parquet --configfile study.yaml -n"))
    assert check_command(shlex.split("--cores 16 --resources gpu=1 results/figures/a.pdf"))
    assert not check_command(shlex.split("results/figures/a.pdf --cores 16 --resources gpu=1"))
    assert check_command(shlex.split("--config train.seed=1 results/a"))
    assert check_command(shlex.split("--forcerun train results/a"))
    assert not check_command(shlex.split("--forcerun train"))
    assert check_command(shlex.split("--profile profiles/slurm --configfile config/<study>.yaml"))
    assert not check_command(shlex.split("--configfile config/<study>.yaml --profile p"))
    assert not check_command(shlex.split("--configfile ... --unlock"))
    assert not check_command(shlex.split("[targets] --configfile my-study.yaml"))


def test_extraction_joins_continuations_and_inline_spans():
    """A command cut by ``\\`` or by a line break inside a code span is checked whole."""
    fenced = "x\n```bash\nsnakemake --cores 2 --resources gpu=1 \\\n    results/a.pdf\n```\n"
    assert markdown_commands(fenced) == [
        (3, ["--cores", "2", "--resources", "gpu=1", "results/a.pdf"])
    ]
    inline = "See `snakemake --profile p\n--configfile ... --dry-run`, then\n"
    assert markdown_commands(inline) == [
        (1, ["--profile", "p", "--configfile", "...", "--dry-run"])
    ]
    comment = "#   snakemake results/a.parquet \\\n#       --configfile c.yaml --cores 16\n"
    assert commands_in(comment, 1) == [
        (1, ["results/a.parquet", "--configfile", "c.yaml", "--cores", "16"])
    ]
    module = 'raise ValueError(\n    "retrain (snakemake --forcerun train) "\n    "or not"\n)\n'
    assert python_commands(module) == [(2, ["--forcerun", "train"])]


def test_shown_commands_put_targets_before_list_options():
    files = scanned_files()
    assert REPO / "README.md" in files
    assert REPO / "docs/slurm.md" in files
    problems = [problem for path in files for problem in problems_in(path)]
    assert not problems, "\n".join(problems)
