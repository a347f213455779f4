"""opcost installed as a wheel (``pip install .``, not editable) works without the
repository: the CLI, the config schema (package data) and a copy of the workflow.

The package is built from a copy of the repository's ``pyproject.toml``, ``README.md`` and
``src/`` into a fresh virtual environment that sees the system's packages (torch,
snakemake, ...; ``--without-pip``: pip and setuptools then come from the system too).
Every command runs with the repository's ``src`` off ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")


def _env() -> dict[str, str]:
    """The environment without the caller's PYTHONPATH (which names the repository's src)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(argv: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=timeout
    )


def _python(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in the venv's interpreter with the repository's src (an editable
    install may add it) taken off ``sys.path`` first."""
    prelude = (
        f"import sys\nsys.path = [p for p in sys.path if not p.startswith({str(REPO / 'src')!r})]\n"
    )
    return _run([str(venv / "bin" / "python"), "-c", prelude + code], cwd)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with opcost installed from a wheel built off a copy of the sources."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=IGNORED)
    venv = root / "venv"
    made = _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        root,
    )
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    done = _run([*pip, "--no-deps", "--no-build-isolation", str(source)], root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shutil.rmtree(source)  # nothing may be read from the sources after the install
    return venv


@pytest.fixture
def workflow_copy(tmp_path: Path) -> Path:
    """The workflow as a user copies it: Snakefile, workflow/ and config/."""
    for name in ("workflow", "config"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=IGNORED)
    shutil.copy2(REPO / "Snakefile", tmp_path / "Snakefile")
    return tmp_path


@pytest.mark.slow
def test_the_installed_package_holds_its_config_schema(installed, tmp_path):
    done = _python(
        installed,
        "import opcost.config as c\n"
        "print(c.__file__)\n"
        "print(sorted(c.load_schema()['properties']) == sorted(c.validate_config({})))\n",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    module_file, same_keys = done.stdout.split()
    assert Path(module_file).is_relative_to(installed)
    assert Path(module_file).with_name("config.schema.yaml").is_file()
    assert same_keys == "True"


@pytest.mark.slow
def test_the_installed_cli_runs_help_and_plan(installed, workflow_copy):
    opcost = str(installed / "bin" / "opcost")
    shown = _run([opcost, "--help"], workflow_copy)
    assert shown.returncode == 0, shown.stderr
    assert "{extract,predict,gpus,train,plan}" in shown.stdout

    planned = _run(
        [opcost, "plan", "--configfile", "config/local.yaml", "--batch-size", "4"],
        workflow_copy,
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    # The default study: 3 model-input sets, both modes.
    assert planned.stdout.startswith("config/local.yaml: 3 model-input sets")

    # The schema is found: a misspelt key is refused by name, in one line.
    config = yaml.safe_load((workflow_copy / "config" / "local.yaml").read_text())
    config["modez"] = config.pop("modes")
    (workflow_copy / "bad.yaml").write_text(yaml.safe_dump(config))
    refused = _run([opcost, "plan", "--configfile", "bad.yaml", "--batch-size", "4"], workflow_copy)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "modez" in refused.stderr


@pytest.mark.slow
def test_snakemake_dry_run_of_a_workflow_copy_with_the_installed_package(installed, workflow_copy):
    argv = ["snakemake", "-n", "--configfile", "config/local.yaml"]
    done = _python(
        installed,
        f"sys.argv = {argv!r}\n"
        "import atexit, opcost\n"
        "atexit.register(lambda: print('opcost from', opcost.__file__, file=sys.stderr))\n"
        "from snakemake.cli import main\n"
        "main()\n",
        workflow_copy,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "This was a dry-run" in done.stdout
    assert "extract" in done.stdout
    source = [line for line in done.stderr.splitlines() if line.startswith("opcost from ")]
    assert Path(source[0].removeprefix("opcost from ")).is_relative_to(installed)


@pytest.mark.slow
@pytest.mark.parametrize("forests", [False, True])
def test_the_installed_package_answers_with_its_shipped_predictors(installed, tmp_path, forests):
    """Right after `pip install` of the wheel, in an empty directory: the forests shipped
    as package data answer, for the four shipped GPU configurations; without --forests
    after one line saying that there are no op models (a wheel carries no op-space data
    to build them from)."""
    argv = [str(installed / "bin" / "opcost"), "gpus", "--format", "json"]
    done = _run([*argv, *(["--forests"] if forests else [])], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    from opcost.cli.predict import NO_OP_MODELS

    assert (NO_OP_MODELS in done.stderr) == (not forests)
    doc = json.loads(done.stdout)
    assert doc["source"] == "shipped with opcost, from the data in data/"
    assert Path(doc["directory"]).is_relative_to(installed)
    assert [g["gpu"] for g in doc["gpus"]] == ["h100", "h100-notf32", "h200", "h200-notf32"]
