"""What a change to the study reruns: Snakemake's CLI on the CPU, in temporary directories.

One small study runs once (module fixture); each test copies its working directory,
changes the config as a user would, runs Snakemake again and reads from Snakemake's own
output which jobs it scheduled. The profiling rules take no input file and their outputs
are protected, so what decides a rerun is the set of expected raw files and the rules'
params: a change must add exactly the new raw files and touch no existing one.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILING_RULES = {"profile_op", "profile_network"}
MEASUREMENT_RULES = {"extract", "unique_ops", *PROFILING_RULES, "evaluate"}

# User networks for the study, written to the temporary directory and imported from
# there (PYTHONPATH), like a user's own module:
# - `narrow`: the base study's second network (training leaves one network out);
# - `again`: tiny_mlp under another name, so all of its ops are already measured;
# - `wider`: tiny_mlp's first layer and activation (ops already measured), then a new
#   Linear(32, 8): exactly one new op in each mode.
USER_NETS = textwrap.dedent(
    """
    from torch import nn

    from toymodels.nets import TinyMLP


    def narrow():
        return nn.Sequential(nn.Linear(16, 4), nn.Sigmoid())


    def again():
        return TinyMLP()


    def wider():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    """
)
BASE_NETWORKS = ("toymodels.nets.tiny_mlp_8x16", "rerun_nets.narrow_8x16")

BASE_STUDY = {
    "models": [
        {"model": "toymodels.nets:tiny_mlp", "inputs": [[8, 16]]},
        {"model": "rerun_nets:narrow", "inputs": [[8, 16]]},
    ],
    "modes": ["inference", "training"],
    # auto: the CPU here; a dry run of a GPU setting needs no GPU either.
    "gpus": {"local": {"device": "auto", "settings": ["default"]}},
    "profile": {"min_run_time_s": 0.01, "warmup_s": 0.002},
}


def snakemake(workdir: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run Snakemake on the repository's workflow in ``workdir``, from the repository root.

    From the root, Snakemake applies the workflow profile profiles/default (local jobs as
    threads; a --configfile replaces the default study), as it does for users.
    """
    pythonpath = os.pathsep.join([str(workdir.parent), str(REPO / "tests"), str(REPO / "src")])
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
        + list(args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath},
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"snakemake {args} failed:\n{proc.stderr[-5000:]}"
    return proc


def scheduled_jobs(log: str) -> list[tuple[str, dict[str, str]]]:
    """Every job Snakemake announced (ran, or would run in a dry run), in order.

    Snakemake opens each job with ``rule NAME:`` (``localrule``, ``checkpoint``,
    ``localcheckpoint``) and lists its ``wildcards: a=1, b=2`` a few lines below.
    """
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in log.splitlines():
        header = re.fullmatch(r"\s*(?:local)?(?:rule|checkpoint) (\w+):", line)
        if header:
            jobs.append((header[1], {}))
            continue
        wildcards = re.fullmatch(r"\s*wildcards: (.*)", line)
        if wildcards and jobs and not jobs[-1][1]:
            jobs[-1][1].update(item.split("=", 1) for item in wildcards[1].split(", "))
    return jobs


def downstream_rules(rulegraph_dot: str, rule: str) -> set[str]:
    """The rules that consume ``rule``'s output, directly or not (``--rulegraph`` output)."""
    names = dict(re.findall(r"^\s*(\d+)\[label = \"(\w+)\"", rulegraph_dot, re.M))
    edges = re.findall(r"^\s*(\d+) -> (\d+)", rulegraph_dot, re.M)
    found: set[str] = set()
    todo = [rule]
    while todo:
        current = todo.pop()
        for src, dst in edges:
            if names[src] == current and names[dst] not in found:
                found.add(names[dst])
                todo.append(names[dst])
    return found


def write_study(workdir: Path, study: dict) -> str:
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return str(path)


def raw_files(workdir: Path) -> dict[str, int]:
    """Every raw log with its modification time (ns)."""
    return {
        str(p.relative_to(workdir)): p.stat().st_mtime_ns
        for p in (workdir / "results" / "raw").rglob("*")
        if p.is_file()
    }


def op_ids(workdir: Path, model_input: str) -> set[str]:
    return set(pd.read_parquet(workdir / f"results/ops/{model_input}.parquet")["op_id"])


@pytest.fixture(scope="module")
def measured_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory in which the base study has run to the end."""
    root = tmp_path_factory.mktemp("reruns")
    (root / "rerun_nets.py").write_text(USER_NETS)
    workdir = root / "base"
    workdir.mkdir()
    snakemake(workdir, "--cores", "2", "--configfile", write_study(workdir, BASE_STUDY))
    return workdir


@pytest.fixture
def study_copy(measured_study: Path, tmp_path: Path) -> Path:
    """A copy of the measured study, modification times and Snakemake's records included."""
    # The user module must sit next to the working directory (see snakemake()).
    shutil.copy2(measured_study.parent / "rerun_nets.py", tmp_path / "rerun_nets.py")
    workdir = tmp_path / "work"
    shutil.copytree(measured_study, workdir, symlinks=True)
    return workdir


@pytest.mark.slow
def test_a_rerun_of_the_unchanged_study_does_nothing(study_copy: Path) -> None:
    dry = snakemake(study_copy, "--dry-run", "--configfile", write_study(study_copy, BASE_STUDY))
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.slow
def test_adding_model_input_sets_profiles_only_new_ops_and_the_new_networks(
    study_copy: Path,
) -> None:
    before = raw_files(study_copy)
    study = copy.deepcopy(BASE_STUDY)
    study["models"] += [
        {"model": "rerun_nets:again", "inputs": [[8, 16]]},
        {"model": "rerun_nets:wider", "inputs": [[8, 16]]},
    ]
    run = snakemake(study_copy, "--cores", "2", "--configfile", write_study(study_copy, study))
    jobs = scheduled_jobs(run.stdout + run.stderr)

    old = set().union(*(op_ids(study_copy, name) for name in BASE_NETWORKS))
    again = op_ids(study_copy, "rerun_nets.again_8x16")
    wider = op_ids(study_copy, "rerun_nets.wider_8x16")
    # By construction (USER_NETS): `again` brings no new op, `wider` exactly one (its
    # Linear(32, 8)) and shares two (Linear(16, 32), ReLU) with tiny_mlp.
    assert again <= old
    assert len(wider - old) == 1
    assert len(wider & old) == 2

    profiled_ops = sorted((wc["mode"], wc["op_id"]) for rule, wc in jobs if rule == "profile_op")
    assert profiled_ops == sorted((mode, op) for mode in BASE_STUDY["modes"] for op in wider - old)
    profiled_networks = sorted(
        (wc["mode"], wc["model_input"]) for rule, wc in jobs if rule == "profile_network"
    )
    assert profiled_networks == sorted(
        (mode, name)
        for mode in BASE_STUDY["modes"]
        for name in ("rerun_nets.again_8x16", "rerun_nets.wider_8x16")
    )
    # Only the new networks were extracted; the op list and the dataset were redone.
    assert sorted(wc["model_input"] for rule, wc in jobs if rule == "extract") == [
        "rerun_nets.again_8x16",
        "rerun_nets.wider_8x16",
    ]
    assert {rule for rule, _ in jobs} >= {"unique_ops", "evaluate"}
    # No raw log was rewritten: the old ones keep their modification times.
    after = raw_files(study_copy)
    assert {k: after[k] for k in before} == before
    assert len(after) - len(before) == 2 * (len(profiled_ops) + len(profiled_networks))


@pytest.mark.slow
def test_adding_a_gpu_setting_would_profile_only_that_setting(study_copy: Path) -> None:
    study = copy.deepcopy(BASE_STUDY)
    study["gpus"]["local"]["settings"] = ["default", "sm1410"]
    # A dry run is enough: it lists every job a real run would start. (The op list is
    # already there, so the dry run sees the profiling jobs behind the checkpoint.)
    dry = snakemake(study_copy, "--dry-run", "--configfile", write_study(study_copy, study))
    jobs = scheduled_jobs(dry.stdout + dry.stderr)

    n_ops = len(pd.read_parquet(study_copy / "results/ops/unique.parquet"))
    profiling = [(rule, wc) for rule, wc in jobs if rule in PROFILING_RULES]
    assert {wc["setting"] for _, wc in profiling} == {"sm1410"}
    # Every op and network, in both modes, at the new setting, once each.
    assert len(profiling) == len({tuple(sorted(wc.items())) for _, wc in profiling})
    assert sum(rule == "profile_op" for rule, _ in profiling) == n_ops * 2
    assert sum(rule == "profile_network" for rule, _ in profiling) == len(BASE_NETWORKS) * 2
    assert not {rule for rule, _ in jobs} & {"extract", "unique_ops"}
    assert "evaluate" in {rule for rule, _ in jobs}


@pytest.mark.slow
def test_changing_a_training_hyperparameter_reruns_no_measurement(study_copy: Path) -> None:
    study = copy.deepcopy(BASE_STUDY)
    study["train"] = {"n_estimators": 7}
    configfile = write_study(study_copy, study)
    rulegraph = snakemake(study_copy, "--rulegraph", "--configfile", configfile).stdout
    # Without a train rule in the graph (train.smk not included, or rule all asking for
    # no predictor) no job reads config['train']: "nothing reruns" would hold vacuously.
    assert '"train"' in rulegraph, "no train rule in the workflow's rule graph"
    dry = snakemake(study_copy, "--dry-run", "--configfile", configfile)
    log = dry.stdout + dry.stderr
    scheduled = {rule for rule, _ in scheduled_jobs(log)}

    assert "train" in scheduled
    assert re.search(r"rule train:\n(?:.*\n)*?\s*reason: Params have changed", log)
    # Training and everything that consumes its output (validation, figures, all), and
    # nothing upstream of it: no extraction, no profiling, no evaluation.
    assert scheduled == {"train"} | downstream_rules(rulegraph, "train")
    assert not scheduled & MEASUREMENT_RULES


@pytest.mark.slow
def test_a_new_spec_version_reruns_extraction_and_no_valid_measurement(study_copy: Path) -> None:
    """An opcost whose extraction records more (a new ``opcost.names.SPEC_VERSION``, as a
    user gets on upgrading) reruns the extract jobs: their tables would otherwise stay
    those of the old version. Ops whose spec did not change keep their op_id, so no raw
    file is measured again. The new version is simulated by a sitecustomize module that
    raises SPEC_VERSION before the workflow reads it."""
    from opcost.names import SPEC_VERSION

    (study_copy.parent / "sitecustomize.py").write_text(
        f"import opcost.names\nopcost.names.SPEC_VERSION = {SPEC_VERSION + 1}\n"
    )
    configfile = write_study(study_copy, BASE_STUDY)
    dry = snakemake(study_copy, "--dry-run", "--configfile", configfile)
    log = dry.stdout + dry.stderr
    extracted = [wc["model_input"] for rule, wc in scheduled_jobs(log) if rule == "extract"]
    assert sorted(extracted) == sorted(BASE_NETWORKS)
    assert re.search(r"rule extract:\n(?:.*\n)*?\s*reason: Params have changed", log)

    before = raw_files(study_copy)
    ran = snakemake(study_copy, "--cores", "2", "--configfile", configfile)
    jobs = {rule for rule, _ in scheduled_jobs(ran.stdout + ran.stderr)}
    assert {"extract", "unique_ops"} <= jobs
    assert not jobs & PROFILING_RULES
    assert raw_files(study_copy) == before


@pytest.mark.slow
def test_deleting_a_raw_pair_measures_it_again_and_rebuilds_what_depends_on_it(
    study_copy: Path,
) -> None:
    """README, "Remeasuring on purpose": make the pair writable, delete it, run snakemake."""
    from test_workflow import snakemake as snakemake_unchecked

    configfile = write_study(study_copy, BASE_STUDY)
    op_id = sorted(pd.read_parquet(study_copy / "results/ops/unique.parquet")["op_id"])[0]
    prefix = f"results/raw/local/default/inference/ops/{op_id}"
    pair = [study_copy / f"{prefix}.json", study_copy / f"{prefix}.csv"]
    for path in pair:
        path.chmod(0o644)
        path.unlink()
    kept = raw_files(study_copy)
    deleted_at_ns = time.time_ns()

    # The dry run lists that one measurement and everything downstream of it.
    dry = snakemake(study_copy, "--dry-run", "--configfile", configfile)
    jobs = scheduled_jobs(dry.stdout + dry.stderr)
    rulegraph = snakemake(study_copy, "--rulegraph", "--configfile", configfile).stdout
    assert [(r, wc) for r, wc in jobs if r in PROFILING_RULES] == [
        ("profile_op", {"gpu": "local", "setting": "default", "mode": "inference", "op_id": op_id})
    ]
    assert {rule for rule, _ in jobs} == {"profile_op"} | downstream_rules(rulegraph, "profile_op")
    assert {"evaluate", "train", "validate_dataset"} <= {rule for rule, _ in jobs}

    # A job that would read the dataset made before the deletion refuses it.
    for target, rule in (
        ("results/predictors/local/metrics.json", "train"),
        ("results/validation/dataset_validation.parquet", "validate_dataset"),
    ):
        forced = snakemake_unchecked(
            REPO,
            study_copy,
            target,
            "--cores",
            "2",
            "--configfile",
            configfile,
            "--forcerun",
            rule,
            extra_paths=(study_copy.parent,),
        )
        assert forced.returncode != 0
        assert f"{prefix}.json, which no longer exists" in forced.stdout + forced.stderr

    ran = snakemake(study_copy, "--cores", "2", "--configfile", configfile)
    ran_jobs = scheduled_jobs(ran.stdout + ran.stderr)
    assert [r for r, _ in ran_jobs if r in PROFILING_RULES] == ["profile_op"]
    after = raw_files(study_copy)
    assert {k: after[k] for k in kept} == kept  # no other raw log was touched
    for path in pair:
        assert path.exists()
        assert not path.stat().st_mode & 0o222, f"{path} is writable"
    dataset_path = study_copy / "results/dataset/local.parquet"
    assert dataset_path.stat().st_mtime_ns > deleted_at_ns
    dataset = pd.read_parquet(dataset_path)
    assert all((study_copy / p).exists() for p in dataset["json_path"])
    assert f"{prefix}.json" in set(dataset["json_path"])
    for output in (
        "results/predictors/local/metrics.json",
        "results/validation/dataset_validation.parquet",
    ):
        assert (study_copy / output).stat().st_mtime_ns > deleted_at_ns


# --- issue 20: a change to the package's code reruns its stage, never the profiling ----


def edit_package_module(study_copy: Path, module: str) -> None:
    """Make Snakemake and its jobs import a copy of the opcost package in which a user
    has added a comment to ``module``.

    The copy sits in a checkout-like tree (``src/opcost``, with ``workflow`` beside it for
    the config schema); a sitecustomize module next to the study (first on PYTHONPATH:
    see snakemake()) puts its ``src`` first on ``sys.path`` in every Python process.
    """
    tree = study_copy.parent / "edited"
    copy = tree / "src" / "opcost"
    shutil.copytree(REPO / "src" / "opcost", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "workflow").symlink_to(REPO / "workflow")
    with open(copy / module, "a") as f:
        f.write("# edited\n")
    (study_copy.parent / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tree / 'src')!r})\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize(("module", "rule"), [("train.py", "train"), ("evaluate.py", "evaluate")])
def test_a_change_to_a_stage_module_reruns_that_stage_and_no_profiling(
    study_copy: Path, module: str, rule: str
) -> None:
    edit_package_module(study_copy, module)
    configfile = write_study(study_copy, BASE_STUDY)
    rulegraph = snakemake(study_copy, "--rulegraph", "--configfile", configfile).stdout
    dry = snakemake(study_copy, "--dry-run", "--configfile", configfile)
    log = dry.stdout + dry.stderr
    scheduled = {name for name, _ in scheduled_jobs(log)}
    # The stage and everything that consumes its output; nothing upstream, no profiling.
    assert scheduled == {rule} | downstream_rules(rulegraph, rule)
    assert re.search(rf"rule {rule}:\n(?:.*\n)*?\s*reason: Params have changed", log)
    assert not scheduled & PROFILING_RULES
    assert not scheduled & {"extract", "unique_ops"}


@pytest.mark.slow
def test_a_change_to_extraction_code_that_keeps_the_op_table_profiles_nothing(
    study_copy: Path,
) -> None:
    """Extraction reruns and writes the same op ids: profiling takes the op's spec as a
    parameter, read from the new op table, so no profiling job runs and no raw log changes."""
    edit_package_module(study_copy, "extract.py")
    configfile = write_study(study_copy, BASE_STUDY)
    unique_before = pd.read_parquet(study_copy / "results/ops/unique.parquet")
    before = raw_files(study_copy)
    ran = snakemake(study_copy, "--cores", "2", "--configfile", configfile)
    jobs = [name for name, _ in scheduled_jobs(ran.stdout + ran.stderr)]
    assert sorted(j for j in jobs if j == "extract") == ["extract"] * len(BASE_NETWORKS)
    assert "unique_ops" in jobs
    assert not set(jobs) & PROFILING_RULES
    assert raw_files(study_copy) == before
    pd.testing.assert_frame_equal(
        pd.read_parquet(study_copy / "results/ops/unique.parquet"), unique_before
    )
    again = snakemake(study_copy, "--dry-run", "--configfile", configfile)
    assert "Nothing to be done" in again.stdout + again.stderr
