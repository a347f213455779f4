"""Tests for the ``opcost`` command line: extract, predict and train, and their outputs.

Their errors (bad arguments, missing or incompatible files) are tested in
tests/test_bad_input.py; the ``predictors`` fixture is in tests/conftest.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opcost.cli import main, parse_shape

TESTS = Path(__file__).parent
DATA = TESTS / "data" / "h100"
RESNET18_OPS = DATA / "ops" / "resnet18_4x3x64x64.parquet"
TINY = ["--model", "toymodels.nets:tiny_mlp", "--input", "8,16"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("text", "shape"),
    [("32,3,224,224", (32, 3, 224, 224)), ("8x16", (8, 16)), (" 4, 3 ,64,64 ", (4, 3, 64, 64))],
)
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


def test_extract_prints_ops_and_counts(capsys, tmp_path):
    out_file = tmp_path / "tiny.parquet"
    code, out, _ = run(capsys, "extract", *TINY, "--out", str(out_file))
    assert code == 0
    # tests/toymodels/nets.py: fc1, act, tanh, h + tanh(h), scale, fc2, each once.
    assert out.splitlines()[0] == ("toymodels.nets.tiny_mlp_8x16: 6 distinct operations, 6 calls")
    assert "Linear" in out
    assert "torch.tanh" in out
    table = pd.read_parquet(out_file)
    assert len(table) == 6
    assert table["count"].sum() == 6
    for op_id in table["op_id"]:
        assert op_id in out


def test_extract_without_functional_ops(capsys):
    code, out, _ = run(capsys, "extract", *TINY, "--no-functional")
    assert code == 0
    assert out.splitlines()[0].endswith("4 distinct operations, 4 calls")


def predict_resnet18(capsys, predictors: Path, *options: str) -> tuple[int, str, str]:
    """``opcost predict`` of the sample's resnet18 op table with the given predictors."""
    return run(
        capsys, "predict", "--ops", str(RESNET18_OPS), "--predictors", str(predictors), *options
    )


def test_predict_from_an_op_table(capsys, predictors):
    code, out, err = predict_resnet18(capsys, predictors)
    assert code == 0, err
    head, body = out.split("\n\n", 1)
    # Which predictors answered, each with its GPU, driver and torch (the sample's).
    assert head.splitlines() == [
        f"predictors ({predictors}):",
        "  h100: NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, "
        "measured 2026-11-22, 91 ops",
    ]
    assert body.startswith("resnet18_4x3x64x64: 29 distinct operations, 69 calls\n")
    assert "best for inference: fastest h100/default" in out
    assert "best for training: fastest h100/default" in out
    assert "needs more than one setting" in out


def test_predict_csv_and_json(capsys, predictors):
    code, out, _ = predict_resnet18(capsys, predictors, "--format", "csv")
    assert code == 0
    table = pd.read_csv(io.StringIO(out))
    assert list(table["mode"]) == ["inference", "training"]
    assert (table["edp_js"] == table["energy_j"] * table["time_s"]).all()
    assert table["best_energy"].all()
    code, out, _ = predict_resnet18(capsys, predictors, "--format", "json", "--mode", "training")
    assert code == 0
    doc = json.loads(out)
    assert [r["mode"] for r in doc["predictions"]] == ["training"]
    assert {b["criterion"] for b in doc["best"]} == {"time", "energy", "edp"}
    assert doc["per_op_setting"][0]["status"].startswith("needs more than one setting")


def test_predict_says_when_a_choice_lies_within_the_predictors_error(capsys, predictors, tmp_path):
    """Two GPU configurations with the same models predict the same: the best leads by
    0 %, which lies within any LONO error recorded in metrics.json."""
    from dataclasses import replace

    from opcost.model.format import load_predictor, save_predictor

    h100 = load_predictor(predictors / "h100")
    for gpu in ("h100", "twin"):
        # metrics.json first, as opcost train writes it: the manifest then covers it.
        (tmp_path / gpu).mkdir()
        scores = {"n": 3, "time_mape_pct": 12.5, "energy_mape_pct": 20.0}
        lono = {"inference": scores, "training": scores}
        (tmp_path / gpu / "metrics.json").write_text(json.dumps({"lono": {"network": lono}}))
        save_predictor(replace(h100, gpu=gpu), tmp_path / gpu)
    code, out, err = predict_resnet18(capsys, tmp_path)
    assert code == 0, err
    assert "0 % ahead of twin/default, within the predictors' 12.5 % LONO error" in out
    assert "0 % ahead of twin/default, within the predictors' 20 % LONO error" in out
    code, out, _ = predict_resnet18(capsys, tmp_path, "--format", "json")
    best = [b for b in json.loads(out)["best"] if b["criterion"] == "time"]
    assert [b["margin"] for b in best] == [0.0, 0.0]
    assert all(b["within_error"] is True for b in best)


def test_predict_a_model_it_never_saw(capsys, predictors):
    code, out, err = run(capsys, "predict", *TINY, "--predictors", str(predictors))
    assert code == 0, err
    assert "fastest h100/default" in out
    # torch.tanh and the Scale module are not in the H100 sample: flagged.
    assert "extrapolation, h100:" in out
    assert "op type not in the training data" in out


def test_predict_from_a_table_does_not_import_torch(predictors):
    # A fresh interpreter, as a user runs it: from an op table, no torch import (seconds
    # saved), and the error path prints no traceback.
    code = (
        "import sys; from opcost.cli import main; "
        f"rc = main(['predict', '--ops', {str(RESNET18_OPS)!r}, '--predictors', "
        f"{str(predictors)!r}, '--format', 'csv']); "
        "print('torch' in sys.modules, rc)"
    )
    # The caller's PYTHONPATH kept: it may name the opcost under test.
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False 0"


def test_train_then_predict(capsys, tmp_path):
    config = tmp_path / "study.yaml"
    config.write_text("train: {n_estimators: 5, seed: 1}\n")
    out = tmp_path / "predictors" / "h100"
    ops = [str(DATA / "ops" / f"{n}_4x3x64x64.parquet") for n in ("resnet18", "vgg11")]
    code, stdout, err = run(
        capsys,
        "train",
        "--dataset",
        str(DATA / "dataset" / "h100.parquet"),
        "--ops",
        *ops,
        "--gpu",
        "h100",
        "--out",
        str(out),
        "--config",
        str(config),
    )
    assert code == 0, err
    assert "leave out vgg11_4x3x64x64" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_config"]["n_estimators"] == 5
    assert metrics["lono"]["networks"] == ["resnet18_4x3x64x64", "vgg11_4x3x64x64"]
    assert "network vs measured" in stdout
    code, stdout, _ = run(capsys, "predict", *TINY, "--predictors", str(out.parent))
    assert code == 0
    assert "fastest h100/default" in stdout


# --- issue 19: a reader that goes away ------------------------------------------------------


def test_extract_into_a_closed_pipe_exits_quietly():
    """`opcost extract ... | head -1`: once the reader has gone, no "Broken pipe" message
    and exit code 141 (128 + SIGPIPE), what a shell reports for `seq 100000 | head -1`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "opcost.cli", "extract", *TINY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # the reader is gone before the first line is written
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_predict_by_replay(capsys, op_models):
    code, out, _ = run(capsys, "predict", "--ops", str(RESNET18_OPS), "--op-models", str(op_models))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"op models in {op_models}:"
    assert lines[1].startswith("  h100: NVIDIA H100 80GB HBM3, driver 580.159.04")
    assert "measured 2026-11-24" in lines[1]
    # Both configurations are predicted for one host: the median of their probes.
    assert "host times for one host on every GPU: host probe" in out
    assert "best for inference: fastest h100 (" in out
    assert "pace, inference: " in out
    code, out, _ = run(
        capsys,
        "predict",
        "--ops",
        str(RESNET18_OPS),
        "--op-models",
        str(op_models),
        "--format",
        "json",
        "--host-probe-ms",
        "1.5",
    )
    doc = json.loads(out)
    assert doc["op_models"]["host_probe_s"] == pytest.approx(1.5e-3)
    rows = pd.DataFrame(doc["predictions"])
    assert sorted(set(rows["gpu"])) == ["h100", "slow"]
    assert set(rows["bound"]) <= {"host", "gpu"}
    # The step is at least as long as the host's work and the GPU's busy time.
    assert (rows["time_s"] >= rows[["host_time_s", "gpu_busy_s"]].max(axis=1)).all()
    best = pd.DataFrame(doc["best"])
    assert set(best.loc[best["criterion"] == "time", "gpu"]) == {"h100"}


def test_predict_by_replay_refuses_mixed_options(capsys, op_models):
    code, _, err = run(
        capsys, "predict", "--ops", str(RESNET18_OPS), "--op-models", str(op_models),
        "--predictors", str(op_models),
    )  # fmt: skip
    assert code == 2
    assert "not both" in err


def test_host_probe_must_be_a_number_or_local(capsys, op_models):
    import torch

    base = ["predict", "--ops", str(RESNET18_OPS), "--op-models", str(op_models)]
    code, _, err = run(capsys, *base, "--host-probe-ms", "fast")
    assert code == 2
    assert "--host-probe-ms must be a positive number of ms or 'local', not 'fast'" in err
    code, _, err = run(capsys, *base, "--host-probe-ms", "0")
    assert code == 2
    if not torch.cuda.is_available():
        code, _, err = run(capsys, *base, "--host-probe-ms", "local")
        assert code == 2
        assert "there is none here" in err
