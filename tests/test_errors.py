"""Tests for the common error base: every error opcost raises on purpose is an
``OpcostError`` (and keeps its builtin base), and the CLI turns any of them into one line
on stderr and exit code 2."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import opcost
from opcost import cli
from opcost.errors import OpcostError


def _error_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of the opcost package."""
    found = []
    for info in pkgutil.walk_packages(opcost.__path__, "opcost."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and obj is not OpcostError
                # Stands in for pynvml's class where pynvml is missing (never raised).
                and obj.__name__ != "_NVMLError"
            ):
                found.append(obj)
    return found


ERROR_CLASSES = _error_classes()


def test_the_package_defines_its_errors():
    # The walk finds the classes (not an empty list that passes any check below).
    names = {c.__name__ for c in ERROR_CLASSES}
    assert {"ConfigError", "TableError", "PredictorError", "WorkerError", "CliError"} <= names


@pytest.mark.parametrize("error", ERROR_CLASSES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_error_is_an_opcost_error_and_keeps_its_builtin_base(error):
    assert issubclass(error, OpcostError)
    # ``except ValueError`` (or RuntimeError, ...) in callers keeps working.
    builtin = [b for b in error.__mro__ if b.__module__ == "builtins" and b is not object]
    assert builtin[0] not in (BaseException, Exception), error.__mro__


def run_plan_with(monkeypatch, func) -> int:
    """``opcost plan ...`` with its command function replaced by ``func``."""
    parser = cli.build_parser()
    original = parser.parse_args

    def parse_args(argv):
        args = original(argv)
        args.func = func
        return args

    monkeypatch.setattr(parser, "parse_args", parse_args)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main(["plan", "--configfile", "x.yaml"])


def test_the_cli_reports_any_opcost_error_in_one_line(capsys, monkeypatch):
    # An error class the CLI does not name: caught through the base.
    class NewStageError(OpcostError, ValueError):
        pass

    def fail(args):
        raise NewStageError("results/x.parquet: first line\n  second line")

    code = run_plan_with(monkeypatch, fail)
    assert code == cli.EXIT_ERROR == 2
    assert capsys.readouterr().err == (
        "opcost plan: error: results/x.parquet: first line second line\n"
    )


def test_the_cli_lets_a_bug_keep_its_traceback(monkeypatch):
    with pytest.raises(ZeroDivisionError):
        run_plan_with(monkeypatch, lambda args: 1 / 0)
