"""Do the reliability tests fail when the guard they check is removed?

For each guard (a check in the source that refuses bad input, survives a fault, or keeps a
caller's string away from a shell or a path), this copies the repository to a temporary
folder, removes the guard there with one exact text replacement, and runs the one test
that checks it against that copy. The test must pass on an unmutated copy and fail on the
mutated one; a test that still passes does not check its guard.

Usage, from the repository root::

    python tools/guard_mutations.py              # every guard (10 to 20 minutes on 2 cores)
    python tools/guard_mutations.py --list       # the guards, their mutations and tests
    python tools/guard_mutations.py --only profile-oom-failed --only check-name

It prints a Markdown table (guard, category, mutation, test, passes unmutated, fails
mutated, seconds) and exits 0 when every test passes unmutated and fails mutated, 1 when
one does not, 2 when a mutation's text does not occur exactly once (the source changed:
update the mutation). docs/reliability.md holds the last table.

The copies are taken from one snapshot, made at the start, of the files
``git ls-files --cached --others --exclude-standard`` lists (the working tree, uncommitted
changes included, without results/, .snakemake/ or caches). Each
test runs as ``python -m pytest NODEID -q -p no:cacheprovider`` with the copy as working
directory and its ``src`` first on ``PYTHONPATH``, and without bytecode files, so that a
mutated module is never shadowed by a cached one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
#: Longest a single test run may take (the pipeline tests run Snakemake), seconds.
TEST_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Guard:
    """One guard, the mutation that removes it, and the test that must notice."""

    name: str
    category: str  # "bad input", "faults", "security", or "method" (the method's own rules)
    path: str  # file in the repository
    old: str  # exact text; must occur exactly once in ``path``
    new: str
    test: str  # pytest node id
    mutation: str  # what the replacement does, in words


GUARDS_FILE = Path(__file__).resolve().with_name("guards.yaml")


def load_guards(path: Path = GUARDS_FILE) -> tuple[Guard, ...]:
    """The guards listed in ``path`` (tools/guards.yaml), in order."""
    return tuple(Guard(**entry) for entry in yaml.safe_load(path.read_text()))


GUARDS: tuple[Guard, ...] = load_guards()


def repository_files(repo: Path) -> list[Path]:
    """The working tree's files that git tracks or would track (ignored ones left out)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    names = sorted({n for n in out.decode().split("\0") if n})
    # A tracked file deleted in the working tree is listed but absent: left out.
    return [Path(n) for n in names if (repo / n).is_file()]


def copy_repository(files: list[Path], target: Path) -> Path:
    """Copy ``files`` (relative to :data:`REPO`) into ``target``, keeping modes."""
    for rel in files:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    return target


def copy_snapshot(snapshot: Path, target: Path) -> Path:
    """Copy the snapshot taken at the start (no test ever runs in it), so that every run
    sees the same tree even while someone edits the working tree."""
    shutil.copytree(snapshot, target, symlinks=True)
    return target


def mutate(copy: Path, guard: Guard) -> None:
    """Apply ``guard``'s replacement in ``copy``; raise unless its text occurs once."""
    path = copy / guard.path
    text = path.read_text()
    count = text.count(guard.old)
    if count != 1:
        raise SystemExit(
            f"guard {guard.name}: the text to replace occurs {count} times in {guard.path}, "
            f"not once; update the mutation\n--- text ---\n{guard.old}"
        )
    path.write_text(text.replace(guard.old, guard.new))


def check_mutations(files: list[Path], guards: list[Guard], root: Path = REPO) -> list[str]:
    """Problems with the selected mutations in the tree at ``root`` (none: empty list)."""
    problems = []
    present = {str(f) for f in files}
    for guard in guards:
        if guard.path not in present:
            problems.append(f"{guard.name}: {guard.path} is not in the repository")
            continue
        count = (root / guard.path).read_text().count(guard.old)
        if count != 1:
            problems.append(f"{guard.name}: text occurs {count} times in {guard.path}")
        if guard.old == guard.new:
            problems.append(f"{guard.name}: the replacement changes nothing")
    return problems


def test_env(copy: Path) -> dict[str, str]:
    """The environment of a test run: the copy's package first, no bytecode files."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_test(copy: Path, node_id: str) -> tuple[int, float, str]:
    """Run one pytest node id against ``copy``: exit code, seconds, last output lines."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", node_id, "-q", "-p", "no:cacheprovider"],
            cwd=copy,
            env=test_env(copy),
            capture_output=True,
            text=True,
            timeout=TEST_TIMEOUT_S,
            check=False,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code, output = -1, f"timed out after {TEST_TIMEOUT_S} s: {e}"
    tail = "\n".join(output.strip().splitlines()[-15:])
    return code, time.monotonic() - started, tail


def check_import_location(copy: Path) -> None:
    """Refuse to go on if the copy's tests would import the repository's package instead."""
    done = subprocess.run(
        [sys.executable, "-c", "import opcost; print(opcost.__file__)"],
        cwd=copy,
        env=test_env(copy),
        capture_output=True,
        text=True,
        check=True,
    )
    where = Path(done.stdout.strip()).resolve()
    if not where.is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy imports opcost from {where}, not from {copy}/src")


#: pytest exit codes that show a mutation caught: a failed test, or its module no longer
#: collected (an import error of the mutated code).
CAUGHT = {1: "yes", 2: "yes (not collected)", 4: "yes (not collected)"}


def outcome(code: int) -> str:
    """A pytest exit code in words (1 is a failed test, the outcome a mutation must give)."""
    return {0: "passed", 1: "FAILED", -1: "timeout"}.get(code, f"error (exit {code})")


def markdown_table(rows: list[dict[str, str]]) -> str:
    header = ["guard", "category", "mutation", "test", "passes unmutated", "fails mutated", "s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cells = [r[h] for h in header]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this guard (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the guards and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies")
    args = parser.parse_args(argv)

    guards = list(GUARDS)
    if args.only:
        known = {g.name for g in GUARDS}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown guard(s) {unknown}; see --list")
        guards = [g for g in GUARDS if g.name in args.only]
    if args.list:
        for g in guards:
            print(f"{g.name:28} {g.category:9} {g.path}: {g.mutation}\n{'':38} {g.test}")
        return 0

    files = repository_files(REPO)
    problems = check_mutations(files, guards)
    if problems:
        print("mutations that do not apply:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    started = datetime.now().astimezone()
    work = Path(tempfile.mkdtemp(prefix="guard-mutations-"))
    print(f"{started:%Y-%m-%d %H:%M %Z}: {len(guards)} guards, copies under {work}", flush=True)
    rows: list[dict[str, str]] = []
    all_ok = True
    try:
        snapshot = copy_repository(files, work / "snapshot")
        # Checked again on the snapshot: the working tree may have changed meanwhile.
        problems = check_mutations(files, guards, snapshot)
        if problems:
            print("mutations that do not apply:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 2
        pristine = copy_snapshot(snapshot, work / "unmutated")
        check_import_location(pristine)
        baseline: dict[str, int] = {}
        for node in dict.fromkeys(g.test for g in guards):
            code, seconds, tail = run_test(pristine, node)
            baseline[node] = code
            print(f"unmutated {outcome(code):8} {seconds:6.1f} s  {node}", flush=True)
            if code != 0:
                print(tail, flush=True)
        for guard in guards:
            copy = copy_snapshot(snapshot, work / guard.name)
            mutate(copy, guard)
            code, seconds, tail = run_test(copy, guard.test)
            # A test module that no longer even imports (pytest exit 2 or 4) turns the
            # suite red too; a wrong node id cannot pass for one, as its unmutated run
            # would not pass.
            ok = baseline[guard.test] == 0 and code in CAUGHT
            all_ok &= ok
            print(f"{guard.name:28} mutated: {outcome(code):8} {seconds:6.1f} s", flush=True)
            if not ok:
                print(tail, flush=True)
            rows.append(
                {
                    "guard": guard.name,
                    "category": guard.category,
                    "mutation": f"`{guard.path}`: {guard.mutation}",
                    "test": f"`{guard.test}`",
                    "passes unmutated": "yes" if baseline[guard.test] == 0 else "NO",
                    "fails mutated": CAUGHT.get(code, f"NO ({outcome(code)})"),
                    "s": f"{seconds:.0f}",
                }
            )
            if not args.keep:
                shutil.rmtree(copy, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    minutes = (datetime.now().astimezone() - started).total_seconds() / 60
    print()
    print(f"Run {started:%Y-%m-%d %H:%M %Z}, {minutes:.0f} min, Python {sys.version.split()[0]}:")
    print()
    print(markdown_table(rows))
    print()
    failed = [
        r["guard"]
        for r in rows
        if r["passes unmutated"] != "yes" or not r["fails mutated"].startswith("yes")
    ]
    print(
        f"{len(rows) - len(failed)} of {len(rows)} guards checked by their test"
        + (f"; not: {', '.join(failed)}" if failed else "")
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
