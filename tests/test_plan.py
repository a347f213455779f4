"""``opcost plan``: what a study will measure, counted before anything runs (opcost.plan).

The counts are checked against a study small enough to count by hand, and (slow) against
the profiling jobs Snakemake's own dry run lists once the op list exists.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from opcost import plan
from opcost.cli import main
from opcost.config import load_study_file
from opcost.extract import extract_model_input
from opcost.names import ModelInput

REPO = Path(__file__).resolve().parents[1]

# `wider` shares tiny_mlp's first Linear(16, 32) and its ReLU (same shapes) and adds one
# Linear(32, 8). tiny_mlp has 6 distinct ops (tests/toymodels/nets.py: fc1, ReLU, tanh,
# the add, Scale, fc2), so the study has 6 + 1 = 7 distinct ops and 2 networks.
USER_NETS = textwrap.dedent(
    """
    from torch import nn


    def wider():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    """
)
STUDY = {
    "models": [
        {"model": "toymodels.nets:tiny_mlp", "inputs": [[8, 16]]},
        {"model": "plan_nets:wider", "inputs": [[8, 16]]},
    ],
    "modes": ["inference", "training"],
    "gpus": {
        "a": {"device": "cuda", "settings": ["default", "sm1410"]},
        "b": {"device": "cpu", "settings": ["default"]},
    },
    "profile": {"min_run_time_s": 0.5, "warmup_s": 0.1},
}
OPS, NETWORKS = 7, 2
# (7 ops + 2 networks) x settings x 2 modes
MEASUREMENTS = {"a": 9 * 2 * 2, "b": 9 * 1 * 2}


@pytest.fixture
def study_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "plan_nets.py").write_text(USER_NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    return path


def _touch_raw(workdir: Path, prefix: str, *suffixes: str) -> None:
    for suffix in suffixes:
        path = workdir / f"{prefix}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}" if suffix == ".json" else "")


def test_counts_of_a_study_counted_by_hand(study_file: Path, tmp_path: Path) -> None:
    study = load_study_file(study_file)
    op_ids = plan.study_op_ids(study)
    assert len(op_ids) == OPS
    plans = {p.gpu: p for p in plan.plan_study(study, op_ids, plan.ProfileBatching(10), tmp_path)}
    assert sorted(plans) == ["a", "b"]
    for gpu, p in plans.items():
        assert (p.ops, p.networks, p.modes) == (OPS, NETWORKS, 2)
        assert p.measurements == MEASUREMENTS[gpu]
        assert p.measured == 0
        assert p.missing == MEASUREMENTS[gpu]
        assert p.missing_networks == NETWORKS * p.settings * 2
        assert p.batches == math.ceil(MEASUREMENTS[gpu] / 10)
        # warm-up 0.1 + window 0.5 + 0.07 s per job, 10 s per batch; on the GPU the jobs
        # trace too: 0.09 s an op, 2.5 s a network, 5 s per batch for the profiler's start
        seconds = MEASUREMENTS[gpu] * 0.67 + p.batches * 10
        if gpu == "a":
            seconds += p.missing_ops * 0.09 + p.missing_networks * 2.5 + p.batches * 5
        assert p.gpu_hours == pytest.approx(seconds / 3600)
        assert p.requested_hours is None
    assert (plans["a"].batches, plans["b"].batches) == (4, 2)


def test_existing_raw_files_reduce_what_is_left_to_run(study_file: Path, tmp_path: Path) -> None:
    study = load_study_file(study_file)
    op_ids = plan.study_op_ids(study)
    tiny_ops = list(extract_model_input(ModelInput("toymodels.nets:tiny_mlp", (8, 16)))["op_id"])
    workdir = tmp_path / "work"
    _touch_raw(workdir, f"results/raw/a/default/inference/ops/{tiny_ops[0]}", ".json", ".csv")
    _touch_raw(workdir, f"results/raw/a/sm1410/training/ops/{tiny_ops[1]}", ".json", ".csv")
    _touch_raw(
        workdir, "results/raw/a/default/training/networks/plan_nets.wider_8x16", ".json", ".csv"
    )
    # Half a measurement (no .csv) is still to run; so is one of another GPU configuration.
    _touch_raw(workdir, f"results/raw/a/default/training/ops/{tiny_ops[2]}", ".json")
    _touch_raw(workdir, f"results/raw/c/default/inference/ops/{tiny_ops[3]}", ".json", ".csv")
    batching = plan.ProfileBatching(10, op_runtime_min=1, network_runtime_min=5)
    plans = {p.gpu: p for p in plan.plan_study(study, op_ids, batching, workdir)}
    a, b = plans["a"], plans["b"]
    assert a.measured == 3
    assert a.missing == 36 - 3
    assert (a.missing_ops, a.missing_networks) == (28 - 2, 8 - 1)
    assert a.batches == 4  # ceil(33 / 10)
    assert a.requested_hours == pytest.approx((26 * 1 + 7 * 5) / 60)
    assert (b.measured, b.missing, b.batches) == (0, 18, 2)


def test_the_shipped_profile_gives_batch_size_and_runtimes() -> None:
    # profiles/slurm/config.yaml: group-components profile_{gpu}=50; runtime "1 * attempt"
    # for profile_op and "5 * attempt" for profile_network (minutes, attempt 1).
    assert plan.read_profile(REPO / "profiles" / "slurm") == plan.ProfileBatching(50, 1.0, 5.0)
    assert plan.read_profile(REPO / "profiles" / "slurm", 7) == plan.ProfileBatching(7, 1.0, 5.0)


def test_a_profile_without_batch_size_needs_the_option(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("executor: slurm\n")
    with pytest.raises(plan.PlanError, match=r"group-components.*give --batch-size N"):
        plan.read_profile(tmp_path)
    assert plan.read_profile(tmp_path, 5) == plan.ProfileBatching(5)
    assert plan.read_profile(tmp_path / "absent", 5) == plan.ProfileBatching(5)


def test_cli_prints_one_row_per_gpu_and_a_total(
    study_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["plan", "--configfile", str(study_file), "--profile", str(REPO / "profiles" / "slurm")]
        + ["--directory", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert "7 distinct ops" in out[0]
    assert "batches of up to 50 profiling jobs" in out[0]
    rows = {line.split()[0]: line.split() for line in out[1:] if line.split()}
    # gpu settings ops networks measurements measured to-run batches GPU-h time-limit
    assert rows["a"][1:8] == ["2", "7", "2", "36", "0", "36", "1"]
    assert rows["b"][1:8] == ["1", "7", "2", "18", "0", "18", "1"]
    assert rows["total"][1:4] == ["54", "0", "54"]
    # time limit asked: 28 ops x 1 min + 8 networks x 5 min = 68 min
    assert rows["a"][9] == f"{68 / 60:.1f}"


def test_cli_without_a_batch_size_is_one_line_and_exit_2(
    study_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--configfile", str(study_file), "--profile", str(tmp_path / "none")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("opcost plan: error: ")
    assert "give --batch-size" in err


def test_plan_runs_without_snakemake_and_without_cuda(study_file: Path, tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from opcost.cli import main
        main(["plan", "--configfile", {str(study_file)!r}, "--batch-size", "4",
              "--directory", {str(tmp_path)!r}, "--format", "json"])
        import torch
        print(json.dumps({{"snakemake": "snakemake" in sys.modules,
                           "cuda": torch.cuda.is_initialized()}}))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests"), str(REPO / "src")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    report, _, modules = proc.stdout.rpartition("\n{")
    result = json.loads(report)
    assert json.loads("{" + modules) == {"snakemake": False, "cuda": False}
    assert result["distinct_ops"] == OPS
    assert result["batch_size"] == 4
    assert [g["missing"] for g in result["gpus"]] == [36, 18]
    assert [g["batches"] for g in result["gpus"]] == [9, 5]


def _snakemake(workdir: Path, *args: str) -> str:
    pythonpath = os.pathsep.join([str(workdir.parent), str(REPO / "tests"), str(REPO / "src")])
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
        + list(args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def _dry_run_profiling(log: str) -> dict[str, int]:
    """Profiling jobs per GPU configuration that a dry run lists (``rule X:`` blocks)."""
    counts: dict[str, int] = {}
    rule = None
    for line in log.splitlines():
        header = re.fullmatch(r"\s*(?:local)?(?:rule|checkpoint) (\w+):", line)
        if header:
            rule = header[1]
        wildcards = re.fullmatch(r"\s*wildcards: (.*)", line)
        if wildcards and rule in ("profile_op", "profile_network"):
            gpu = dict(item.split("=", 1) for item in wildcards[1].split(", "))["gpu"]
            counts[gpu] = counts.get(gpu, 0) + 1
            rule = None
    return counts


@pytest.mark.slow
def test_plan_agrees_with_the_dry_run_once_the_op_list_exists(
    study_file: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    # Targets before --configfile: Snakemake would read the target as a second config.
    _snakemake(
        workdir, "results/ops/unique.parquet", "--cores", "2", "--configfile", str(study_file)
    )
    unique = (workdir / "results" / "ops" / "unique.parquet").exists()
    assert unique
    study = load_study_file(study_file)
    op_ids = plan.study_op_ids(study)
    tiny_ops = list(extract_model_input(ModelInput("toymodels.nets:tiny_mlp", (8, 16)))["op_id"])
    _touch_raw(workdir, f"results/raw/a/sm1410/inference/ops/{tiny_ops[0]}", ".json", ".csv")
    _touch_raw(
        workdir, "results/raw/b/default/training/networks/plan_nets.wider_8x16", ".json", ".csv"
    )
    plans = {p.gpu: p for p in plan.plan_study(study, op_ids, plan.ProfileBatching(50), workdir)}
    dry = _dry_run_profiling(_snakemake(workdir, "--dry-run", "--configfile", str(study_file)))
    assert dry == {"a": 35, "b": 17}
    assert {gpu: p.missing for gpu, p in plans.items()} == dry


@pytest.mark.slow
def test_a_gpu_study_traces_in_its_profiling_jobs_unless_it_traces_apart(
    study_file: Path, tmp_path: Path
) -> None:
    """By default no trace job runs (each profiling job traces what it measured); with
    ``profile.traces: separate_jobs`` a GPU configuration has one per measurement, and a
    CPU configuration none either way."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    _snakemake(
        workdir, "results/ops/unique.parquet", "--cores", "2", "--configfile", str(study_file)
    )
    apart = tmp_path / "apart.yaml"
    config = yaml.safe_load(study_file.read_text())
    config["profile"]["traces"] = "separate_jobs"
    apart.write_text(yaml.safe_dump(config, sort_keys=False))
    for path, traces in ((study_file, 0), (apart, MEASUREMENTS["a"])):
        log = _snakemake(workdir, "--dry-run", "--configfile", str(path))
        jobs = re.findall(r"^\s*(?:local)?rule (trace_op|trace_network):", log, re.MULTILINE)
        assert len(jobs) == traces
        assert _dry_run_profiling(log) == MEASUREMENTS
