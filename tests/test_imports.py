"""Torch stays where the measuring happens: evaluating, training, validating, drawing
figures, predicting from an op table and parsing the workflow do not import it.

Each check runs in a fresh interpreter (this test process imports torch elsewhere) and
reads ``sys.modules`` at its end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RESNET18_OPS = TESTS / "data" / "h100" / "ops" / "resnet18_4x3x64x64.parquet"
#: Printed by the checked interpreter at exit.
REPORT = "torch imported: "


def run_python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that says at exit whether torch was imported
    (the caller's PYTHONPATH kept: it may name the opcost under test)."""
    prelude = (
        "import atexit, sys\n"
        f"atexit.register(lambda: print({REPORT!r} + str('torch' in sys.modules), "
        "file=sys.stderr))\n"
    )
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def torch_imported(done: subprocess.CompletedProcess[str]) -> bool:
    reports = [line for line in done.stderr.splitlines() if line.startswith(REPORT)]
    assert len(reports) == 1, done.stderr[-3000:]
    return reports[0] == REPORT + "True"


@pytest.mark.parametrize(
    "module",
    [
        "opcost.evaluate",
        "opcost.validate.dataset",
        "opcost.validate.predictions",
        "opcost.train",
        "opcost.predict",
        "opcost.config",
        "opcost.workflow",
        "opcost.opspace_workflow",
        "opcost.names",
        "opcost.figures",
        "opcost.sweep_record",
    ],
)
def test_importing_a_stage_that_does_not_measure_leaves_torch_out(module):
    done = run_python(f"import {module}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not torch_imported(done)


def test_loading_the_default_study_checks_its_models_without_torch():
    # What the Snakefile runs at each parse: the model names are checked against
    # torchvision's registry, read from its source.
    code = (
        "from opcost.config import load_study_file\n"
        "study = load_study_file('config/local.yaml')\n"
        "print(' '.join(mi.model for mi in study.model_inputs))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["resnet18", "mobilenet_v3_small", "squeezenet1_1"]
    assert not torch_imported(done)


def test_predicting_from_an_op_table_leaves_torch_out(predictors):
    # What `opcost predict --ops FILE` runs (opcost.cli.cmd_predict), without the CLI.
    code = (
        "from opcost.predict import load_predictors, predict_networks, read_ops_table\n"
        f"result = predict_networks(load_predictors({str(predictors)!r}), "
        f"read_ops_table({str(RESNET18_OPS)!r}), None)\n"
        "print(len(result.table))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    # Both modes of one network on the one trained GPU and setting.
    assert done.stdout.split() == ["2"]
    assert not torch_imported(done)


@pytest.mark.slow
def test_a_dry_run_of_the_default_study_leaves_torch_out_of_snakemake(tmp_path):
    # Targets first, then --configfile (whose values would swallow a target after it).
    argv = [
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "-n",
        "all",
        "--configfile",
        str(REPO / "config" / "local.yaml"),
    ]
    done = run_python(f"sys.argv = {argv!r}\nfrom snakemake.cli import main\nmain()\n")
    assert done.returncode == 0, done.stderr[-3000:]
    # The dry run got as far as planning the first stage.
    assert "extract" in done.stdout
    assert not torch_imported(done)
