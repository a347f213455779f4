"""Build the docs' figures from the committed real data (by hand, not a rule).

Usage, from the repository root::

    python tools/figure_docs.py            # writes docs/figures/*.png
    python tools/figure_docs.py --keep DIR # and keeps the working directory

The figures of validation and prediction (:data:`SHIPPED_FIGURES`) are the default
study's: ``snakemake`` on ``config/config.yaml`` in a scratch working directory, from the
shipped H100 and H200 data in ``data/``. The method figures need a GPU run of their own:
they come from the real H100 sample (``tests/data/h100``), copied into another scratch
directory (:func:`prepare_workdir`, also what tests/test_figures.py runs the figure rules
in) and run with ``config/h100-sample.yaml``; they use the sweep outputs in
``tests/data/h100/sweep/`` where there are some, else the power figures show the real
power log of the H100 probe (``tests/data/h100_probe``) and the proportionality figure is
not built (docs/sweep.md). The PNGs named in :data:`DOCS_FIGURES` go to ``docs/figures/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tests" / "data" / "h100"
#: Where the GPU run's sweep outputs go, when there are some (``results/sweep/{gpu}/``).
SAMPLE_SWEEP = SAMPLE / "sweep"
PROBE = REPO / "tests" / "data" / "h100_probe"
SAMPLE_CONFIG = REPO / "config" / "h100-sample.yaml"
#: Figures built from the sample (the proportionality sweep needs a GPU run).
SAMPLE_FIGURES = (
    "validation_small",
    "validation_large",
    "network_energy",
    "settings",
    "prediction_ops",
    "prediction_errors",
    "prediction_op_types",
    "prediction_networks",
    "power_trace",
    "startup_effect",
)
#: Figures drawn from the default study, the shipped data (``data/``).
SHIPPED_FIGURES = (
    "validation_small",
    "validation_large",
    "network_energy",
    "prediction_ops",
    "prediction_networks",
    "replay",
)
#: The PNGs committed under docs/figures/ and shown in the docs.
DOCS_FIGURES = (
    "validation_small",
    "validation_large",
    "network_energy",
    "power_trace",
    "startup_effect",
    "prediction_ops",
    "prediction_networks",
    "replay",
    "proportionality",
)
#: The probe's three matmul loops, (start, end) in unix seconds, from probe.log line
#: ``[[1795340491.1656625, 1795340513.9351466, ...], ...]`` (GPU busy until the end: the
#: loop queued 1 s of launches, then synchronised).
PROBE_LOOPS_UNIX_S = (
    (1795340491.1656625, 1795340513.9351466),
    (1795340514.6380308, 1795340537.4357774),
    (1795340538.138641, 1795340561.0261881),
)


def scratch_snakefile(repo: Path) -> str:
    """The repository's Snakefile, with absolute paths to its rules and configs."""
    text = (repo / "Snakefile").read_text()
    return re.sub(r'"(workflow/|config/)', lambda m: f'"{repo}/{m[1]}', text)


def _log_span_unix_s(csv_path: Path) -> tuple[float, float]:
    """First and last timestamp of an nvidia-smi log recorded in UTC, unix seconds."""
    lines = [line for line in csv_path.read_text().splitlines()[1:] if line.strip()]
    stamps = [
        datetime.strptime(line.split(",")[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)
        for line in (lines[0], lines[-1])
    ]
    return stamps[0].timestamp(), stamps[1].timestamp()


def probe_power_trace(gpu: str, csv_path: Path, json_path: Path) -> None:
    """The probe's real power log as the power-trace sweep's output (CSV copied untouched).

    Its three loops are both the alternating runs and the overlaid runs; they were 0.7 s
    apart, not back to back, and had no warm-up: each run's timed region is all of it.
    """
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROBE / "trace.csv", csv_path)
    first, end = _log_span_unix_s(PROBE / "trace.csv")
    events = []
    previous = first
    for k, (start, stop) in enumerate(PROBE_LOOPS_UNIX_S):
        events.append(
            {
                "part": "alternating",
                "index": k,
                "phase": "idle",
                "start_unix_s": previous,
                "end_unix_s": start,
            }
        )
        run = {
            "index": k,
            "phase": "run",
            "start_unix_s": start,
            "end_unix_s": stop,
            "timed_start_unix_s": start,
            "timed_end_unix_s": stop,
        }
        events.append({"part": "alternating", **run})
        previous = stop
    events.append(
        {
            "part": "alternating",
            "index": len(PROBE_LOOPS_UNIX_S),
            "phase": "idle",
            "start_unix_s": previous,
            "end_unix_s": end,
        }
    )
    events += [{**e, "part": "overlay"} for e in events if e["phase"] == "run"]
    record = {
        "schema_version": 1,
        "kind": "power_trace",
        "source": "tests/data/h100_probe (probe.sh): three 1-s loops of an 8192x8192 matmul",
        "gpu": gpu,
        "setting": "default",
        "mode": "inference",
        "model_input": "probe.sh",
        "op_type": "torch.matmul",
        "spec": {"inputs": [{"shape": [8192, 8192]}, {"shape": [8192, 8192]}]},
        "device": "cuda",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "driver_version": "580.159.04",
        "power_available": True,
        "power_interval_ms": 20,
        "utc_offset_s": 0,  # probe.log: tz 0 ('UTC', 'UTC')
        "events": events,
    }
    json_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def prepare_workdir(workdir: Path, repo: Path = REPO, figures: dict | None = None) -> Path:
    """A working directory holding the real sample as if the pipeline had produced it.

    Raw logs, operation tables and the dataset are copied from ``tests/data/h100`` with
    modification times in pipeline order (raw, then ops, then the dataset), so that
    Snakemake reruns none of them. The sweep outputs are those of ``tests/data/h100/sweep``
    where it exists, else the probe's power log as the power-trace sweep's. Returns the
    config file to run with: ``config/h100-sample.yaml`` plus the ``figures`` section given.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(scratch_snakefile(repo))
    results = workdir / "results"
    shutil.copytree(SAMPLE / "raw", results / "raw", dirs_exist_ok=True)
    shutil.copytree(SAMPLE / "ops", results / "ops", dirs_exist_ok=True)
    shutil.copytree(SAMPLE / "dataset", results / "dataset", dirs_exist_ok=True)
    config = yaml.safe_load(SAMPLE_CONFIG.read_text())
    gpu = next(iter(config["gpus"]))
    sweep_dir = results / "sweep" / gpu
    if (SAMPLE_SWEEP / "power_trace.json").exists():
        sweep_dir.mkdir(parents=True, exist_ok=True)
        for path in SAMPLE_SWEEP.glob("*.*"):
            shutil.copyfile(path, sweep_dir / path.name)
    else:
        probe_power_trace(gpu, sweep_dir / "power_trace.csv", sweep_dir / "power_trace.json")
    # Newer than every script (a script rule reruns when its script is newer than its
    # outputs), in pipeline order among themselves, and in the past (outputs made later
    # must be newer still). In a checkout made a moment ago the scripts are seconds old:
    # then the times start after the newest of them, and this waits until they are past.
    newest = max(
        p.stat().st_mtime
        for folder in (repo / "workflow", repo / "src")
        for p in folder.rglob("*")
        if p.is_file()
    )
    t0 = max(time.time() - 60, newest + 1)
    stages = [
        [p for p in (results / "raw").rglob("*") if p.is_file()],
        [*sweep_dir.glob("*.*")],
        [p for p in (results / "ops").glob("*.parquet") if p.name != "unique.parquet"],
        [results / "ops" / "unique.parquet"],
        [*(results / "dataset").glob("*.parquet")],
    ]
    for k, paths in enumerate(stages):
        for path in paths:
            os.utime(path, (t0 + 2 * k, t0 + 2 * k))
    time.sleep(max(0.0, t0 + 2 * len(stages) - time.time()))
    if figures:
        config["figures"] = figures
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path


def run_snakemake(
    workdir: Path, config: Path, targets: list[str], *extra: str, repo: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run Snakemake on ``workdir`` from the repository root (its default profile applies)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo / "src")])}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(workdir / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(config),
            "--cores",
            "2",
            *extra,
            *targets,
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=env,
        check=False,
    )


def shipped_workdir(workdir: Path, repo: Path = REPO, figures: dict | None = None) -> Path:
    """A working directory for the default study (its config and data linked in); returns
    the config to run with: ``config/config.yaml`` plus the ``figures`` section given."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(scratch_snakefile(repo))
    for name in ("config", "data"):
        if not (workdir / name).exists():
            (workdir / name).symlink_to(repo / name)
    config = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    if figures:
        config["figures"] = figures
    config_path = workdir / "study.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="working directory to use and keep")
    parser.add_argument("--dpi", type=int, default=110, help="PNG resolution (default 110)")
    args = parser.parse_args(argv)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="opcost-docs-"))
    style = {"dpi": args.dpi, "font_size": 10}
    method = [n for n in SAMPLE_FIGURES if n not in SHIPPED_FIGURES]
    if (SAMPLE_SWEEP / "proportionality.json").exists():
        method.append("proportionality")
    runs = [
        (workdir / "sample", prepare_workdir(workdir / "sample", figures=style), method),
        (workdir / "shipped", shipped_workdir(workdir / "shipped", figures=style), SHIPPED_FIGURES),
    ]
    out = REPO / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    for directory, config, names in runs:
        run = run_snakemake(directory, config, [f"results/figures/{n}.png" for n in names])
        if run.returncode != 0:
            sys.stderr.write(run.stderr[-6000:])
            return run.returncode
        for name in [n for n in DOCS_FIGURES if n in names]:
            shutil.copyfile(directory / "results" / "figures" / f"{name}.png", out / f"{name}.png")
            print(f"docs/figures/{name}.png")
    if args.keep is None:
        shutil.rmtree(workdir)
    else:
        print(f"working directory: {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
