"""The pipeline through Snakemake's CLI, on the CPU, in temporary working directories.

A run killed mid-profiling and the no-overlap of profiling jobs are tested in
tests/test_faults.py, which imports :func:`snakemake` from here.
"""

import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import as_ordinary_user


def snakemake_argv(repo, workdir, *args):
    """The command that runs the repository's workflow in ``workdir``."""
    return [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile")] + [
        "--directory",
        str(workdir),
        *args,
    ]


def snakemake_env(repo, *extra_paths):
    """The environment it runs in: ``extra_paths``, then the tests and opcost importable."""
    path = [*map(str, extra_paths), str(repo / "tests"), str(repo / "src")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def snakemake(repo, workdir, *args, timeout=900, extra_paths=()):
    return subprocess.run(
        snakemake_argv(repo, workdir, *args),
        capture_output=True,
        text=True,
        cwd=repo,
        env=snakemake_env(repo, *extra_paths),
        timeout=timeout,
    )


def job_counts(stdout):
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    table = stdout.split("Job stats:")[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_dry_run_of_the_default_study_lists_every_profiling_job(repo, tmp_path):
    config = ["--configfile", str(repo / "config/local.yaml")]
    first = snakemake(repo, tmp_path, "results/ops/unique.parquet", "--cores", "2", *config)
    assert first.returncode == 0, first.stderr[-3000:]
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    dry = snakemake(repo, tmp_path, "-n", *config)
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = job_counts(dry.stdout)
    # Default study: 1 GPU configuration ("local"), 1 setting, 2 modes, 3 networks.
    assert counts["profile_op"] == len(unique) * 2
    assert counts["profile_network"] == 3 * 2
    assert counts["evaluate"] == 1
    assert "extract" not in counts  # done in the first call


def test_tiny_study_runs_end_to_end_and_a_rerun_does_nothing(repo, tmp_path):
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    run = snakemake(repo, tmp_path, "--cores", "2", *config)
    assert run.returncode == 0, run.stderr[-4000:]
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    dataset = pd.read_parquet(tmp_path / "results/dataset/cpu.parquet")
    failed = pd.read_parquet(tmp_path / "results/dataset/cpu.failed.parquet")
    assert failed.empty
    assert len(dataset) == 2 * len(unique) + 2 * 2
    assert set(dataset.loc[dataset["kind"] == "network", "model_input"]) == {
        "resnet18_2x3x32x32",
        "toymodels.nets.tiny_mlp_8x16",
    }
    assert dataset["time_s"].gt(0).all()
    assert dataset["power_w"].isna().all()  # the CPU measures time only
    # Raw logs are write-protected ground truth.
    raw = next((tmp_path / "results/raw").rglob("*.json"))
    # Not writable to its owner either (as root: root without its capabilities).
    probe = "import os, sys; print(os.access(sys.argv[1], os.W_OK))"
    access = subprocess.run(
        as_ordinary_user([sys.executable, "-c", probe, str(raw)]), capture_output=True, text=True
    )
    assert access.stdout == "False\n", access.stderr
    assert not raw.stat().st_mode & 0o222
    again = snakemake(repo, tmp_path, "-n", *config)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr


# --- issue 20: a change to a stage's code in the package reruns the stage -------------


def _package_copy(tmp_path):
    import shutil

    from opcost import workflow as wf

    copy = tmp_path / "opcost"
    shutil.copytree(wf.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_code_version_follows_the_modules_a_stage_script_uses(repo, tmp_path, monkeypatch):
    from opcost import workflow as wf

    copy = _package_copy(tmp_path)
    monkeypatch.setattr(wf, "PACKAGE_DIR", copy)
    scripts = repo / "workflow" / "scripts"
    stages = ("train.py", "evaluate.py", "extract.py", "validate_predictions.py")

    def versions():
        return {s: wf.code_version.__wrapped__(scripts / s) for s in stages}

    before = versions()
    assert all(re.fullmatch(r"[0-9a-f]{16}", v) for v in before.values())
    # train.py imports opcost.train directly; evaluate.py imports none of it.
    with open(copy / "train.py", "a") as f:
        f.write("# a comment\n")
    after_train = versions()
    assert after_train["train.py"] != before["train.py"]
    assert {s: after_train[s] for s in stages if s != "train.py"} == {
        s: before[s] for s in stages if s != "train.py"
    }
    # opcost.powerlog reaches evaluate.py through opcost.evaluate only.
    with open(copy / "powerlog.py", "a") as f:
        f.write("# a comment\n")
    after_powerlog = versions()
    assert after_powerlog["evaluate.py"] != after_train["evaluate.py"]
    assert after_powerlog["train.py"] == after_train["train.py"]


def test_every_stage_rule_carries_its_code_version_and_no_measurement_does(repo):
    # Each rule that runs a script of a stage reruns when that stage's package code
    # changes; the measurements (profiling, sweeps) never do: raw logs are ground truth.
    measurements = {"sweep_proportionality.py", "sweep_power_trace.py"}
    checked = []
    for smk in sorted((repo / "workflow" / "rules").glob("*.smk")):
        blocks = re.split(r"(?m)^(?=(?:rule|checkpoint) )", smk.read_text())
        for block in blocks:
            header = re.match(r"(?:rule|checkpoint) (\w+):", block)
            if not header:
                continue
            script = re.search(r'^    script:\n        "\.\./scripts/(\w+\.py)"', block, re.M)
            has_code = "opcost_code=" in block
            if header[1].startswith("profile_") or (script and script[1] in measurements):
                assert not has_code, header[1]
            elif script:
                assert f'opcost_code=code_version("{script[1]}")' in block, header[1]
                checked.append(header[1])
    assert {"extract", "unique_ops", "evaluate", "train", "validate_dataset"} <= set(checked)
