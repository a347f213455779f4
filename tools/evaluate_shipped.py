"""Evaluate a shipped study's archives into its committed dataset (by hand, not a rule).

Usage, from the repository root::

    python tools/evaluate_shipped.py data/hopper [GPU ...]

For each GPU configuration directory of the study (or those named), unpacks
``raw_and_logs.tar.gz`` and ``traces.tar.gz`` into a scratch directory and writes
``dataset/{gpu}.parquet``, ``{gpu}.failed.parquet`` and ``{gpu}.breakdown.parquet`` as the
pipeline's ``evaluate`` rule does on the GPU host: what to run after a trace archive is
replaced, or after the dataset's columns change.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from opcost import included
from opcost.evaluate import breakdown_table, evaluate_files, write_dataset
from opcost.io import write_parquet_atomic


def evaluate_study_gpu(study: Path, gpu: str) -> str:
    """Write one configuration's dataset files from its archives; a line saying what."""
    archives = [study / gpu / name for name in ("raw_and_logs.tar.gz", "traces.tar.gz")]
    out = (study / gpu / "dataset").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        included.unpack([str(a) for a in archives if a.is_file()], tmp)
        with contextlib.chdir(tmp):  # paths in the dataset as the rule records them
            jsons = sorted(Path("results/raw", gpu).glob("*/*/*/*.json"))
            dataset, failed = evaluate_files(jsons, gpu)
            write_dataset(dataset, failed, out / f"{gpu}.parquet", out / f"{gpu}.failed.parquet")
            write_parquet_atomic(breakdown_table(jsons), out / f"{gpu}.breakdown.parquet")
    return f"{study}/{gpu}: {len(dataset)} measurements, {len(failed)} failed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a directory of data/ (e.g. data/hopper)")
    parser.add_argument("gpus", nargs="*", help="GPU configurations (default: every one)")
    args = parser.parse_args()
    gpus = args.gpus or sorted(
        p.name for p in args.study.iterdir() if (p / "raw_and_logs.tar.gz").is_file()
    )
    for gpu in gpus:
        print(evaluate_study_gpu(args.study, gpu))


if __name__ == "__main__":
    main()
