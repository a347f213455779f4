"""How fast does ``opcost predict`` answer for a network of 200 operations?

Issue 9's target: a network of 200 operations across all configurations in under 2 s on a
2-core CPU. This builds a synthetic study: ``--gpus`` GPU configurations, each trained
(default forests: ``--trees`` trees, min_samples_leaf 1) on ``--train-ops`` operations
measured at 4 settings in both modes; and a network of ``--ops`` distinct operations
(convolutions, linears, norms, activations, pools, additions, at random sizes) with random
counts. Then it times, ``--repeat`` times each, and prints the median (and the range):

* *in-process*: :func:`opcost.predict.load_predictors` + :func:`~opcost.predict.predict_networks`
  (loading every model, encoding, predicting, summing, per-op settings, extrapolation flags),
  the part opcost controls; opcost's caches of parsed ops are cleared before each run, so
  every run is a first prediction;
* *command*: ``python -m opcost.cli predict --ops net.parquet --format csv`` in a fresh
  interpreter, as a user runs it: wall time of the whole process (Python start, imports of
  numpy, pandas and pyarrow, loading, predicting, printing), and its CPU time (user +
  system), which depends less than wall time on what else the machine runs.

With ``--model NAME --input SHAPE`` it times the path users take instead,
``opcost predict --model NAME --input SHAPE --format csv`` in a fresh interpreter: the
first call, which extracts the network's operations (importing torch and torchvision)
and caches its op table in an empty cache directory, then ``--repeat`` calls that read
the cached table (no torch import), and, for comparison, a fresh interpreter that only
imports torch and torchvision. ``--predictors DIR`` uses trained predictors (else the
synthetic ones); ``--op-models DIR`` predicts by replay from op models
(``opcost predict --op-models``).

The load average is printed with the times: on a shared machine, compare runs made under a
similar load.

Usage: ``python bench/predict_speed.py [--ops 200] [--gpus 3] [--train-ops 500] [--trees 300]
[--cores 2] [--repeat 5] [--workdir DIR] [--model NAME --input SHAPE [--predictors DIR]]``.
``--cores N`` pins this process and the command
to the first N CPUs (Linux), to measure "a 2-core CPU" on a bigger machine. ``--workdir``
keeps the study in DIR and reuses it on a later run with the same sizes (training takes
tens of seconds), e.g. to time two versions of opcost on the same models.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from opcost.model.features import op_counts
from opcost.model.format import FORMAT_VERSION, load_predictors, save_predictor
from opcost.predict import predict_networks
from opcost.spec import canonical_json, op_id
from opcost.train import TrainConfig, fit_predictor

SETTINGS = {"default": 1980.0, "sm1410": 1410.0, "sm990": 990.0, "pl300": 1500.0}


def tensor(shape: list[int]) -> dict:
    return {"shape": shape, "dtype": "float32", "param": False}


def random_spec(rng: random.Random) -> dict:
    b = rng.choice([1, 4, 8, 16, 32, 64])
    c = rng.choice([3, 16, 32, 64, 128, 256, 512])
    hw = rng.choice([7, 14, 28, 56, 112, 224])
    x = [b, c, hw, hw]
    kind = rng.choice(["conv", "conv", "linear", "bn", "relu", "pool", "add"])
    if kind == "conv":
        out, k, s = (
            rng.choice([16, 64, 128, 256, 512]),
            rng.choice([1, 3, 5, 7]),
            rng.choice([1, 2]),
        )
        o = (hw + 2 * (k // 2) - k) // s + 1
        return {
            "kind": "module",
            "type": "torch.nn.modules.conv.Conv2d",
            "attrs": {
                "in_channels": c,
                "out_channels": out,
                "kernel_size": [k, k],
                "stride": [s, s],
                "padding": [k // 2, k // 2],
                "dilation": [1, 1],
                "groups": 1,
                "bias": rng.random() < 0.5,
            },
            "args": [{"__tensor__": 0}],
            "kwargs": {},
            "inputs": [tensor(x)],
            "outputs": [{"shape": [b, out, o, o], "dtype": "float32"}],
        }
    if kind == "linear":
        fin, fout = rng.choice([128, 512, 1024, 4096]), rng.choice([10, 1000, 4096])
        return {
            "kind": "module",
            "type": "torch.nn.modules.linear.Linear",
            "attrs": {"in_features": fin, "out_features": fout, "bias": True},
            "args": [{"__tensor__": 0}],
            "kwargs": {},
            "inputs": [tensor([b, fin])],
            "outputs": [{"shape": [b, fout], "dtype": "float32"}],
        }
    if kind == "bn":
        attrs = {"num_features": c, "affine": True, "eps": 1e-5, "momentum": 0.1}
        return {
            "kind": "module",
            "type": "torch.nn.modules.batchnorm.BatchNorm2d",
            "attrs": {**attrs, "track_running_stats": True},
            "args": [{"__tensor__": 0}],
            "kwargs": {},
            "inputs": [tensor(x)],
            "outputs": [{"shape": x, "dtype": "float32"}],
        }
    if kind == "pool":
        return {
            "kind": "module",
            "type": "torch.nn.modules.pooling.MaxPool2d",
            "attrs": {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1},
            "args": [{"__tensor__": 0}],
            "kwargs": {},
            "inputs": [tensor(x)],
            "outputs": [
                {"shape": [b, c, (hw - 1) // 2 + 1, (hw - 1) // 2 + 1], "dtype": "float32"}
            ],
        }
    if kind == "relu":
        return {
            "kind": "module",
            "type": "torch.nn.modules.activation.ReLU",
            "attrs": {"inplace": True},
            "args": [{"__tensor__": 0}],
            "kwargs": {},
            "inputs": [tensor(x)],
            "outputs": [{"shape": x, "dtype": "float32"}],
        }
    return {
        "kind": "function",
        "type": "torch.Tensor.add_",
        "args": [{"__tensor__": 0}, {"__tensor__": 1}],
        "kwargs": {},
        "inputs": [tensor(x), tensor(x)],
        "outputs": [{"shape": x, "dtype": "float32"}],
    }


def synthetic_dataset(n_ops: int, rng: random.Random) -> pd.DataFrame:
    """Op measurements at every setting and mode, with plausible time and power."""
    rows = []
    for _ in range(n_ops):
        spec = random_spec(rng)
        text = canonical_json(spec)
        counts = op_counts(text)
        work = 2e-14 * counts["flops"] + 1e-11 * (counts["input_numel"] + counts["output_numel"])
        for setting, clock in SETTINGS.items():
            for mode, factor in (("inference", 1.0), ("training", 3.0)):
                time_s = (8e-6 + factor * work * 1980.0 / clock) * rng.lognormvariate(0, 0.1)
                power_w = min(700.0, 90.0 + 400.0 * (clock / 1980.0) ** 2 * min(1.0, work * 1e4))
                rows.append(
                    {
                        "gpu": "synthetic",
                        "setting": setting,
                        "mode": mode,
                        "kind": "op",
                        "op_id": op_id(spec),
                        "model_input": None,
                        "op_type": spec["type"],
                        "spec": text,
                        "dtype": "float32",
                        "tf32": True,
                        "time_s": time_s,
                        "power_w": power_w,
                        "energy_j": time_s * power_w,
                        "low_power_samples": False,
                        "sm_clock_mhz": clock,
                        "mem_clock_mhz": 2619.0,
                        "power_limit_w": 300.0 if setting == "pl300" else 700.0,
                    }
                )
    return pd.DataFrame(rows)


def network(n_ops: int, rng: random.Random) -> pd.DataFrame:
    seen: dict[str, dict] = {}
    while len(seen) < n_ops:
        spec = random_spec(rng)
        seen[op_id(spec)] = spec
    return pd.DataFrame(
        [
            {
                "model_input": f"synthetic_{n_ops}ops_1",
                "op_id": oid,
                "kind": s["kind"],
                "type": s["type"],
                "spec": canonical_json(s),
                "count": rng.randint(1, 4),
            }
            for oid, s in seen.items()
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200, help="distinct ops of the network")
    parser.add_argument("--gpus", type=int, default=3, help="GPU configurations")
    parser.add_argument("--train-ops", type=int, default=500, help="training ops per GPU")
    parser.add_argument("--trees", type=int, default=300, help="trees per forest")
    parser.add_argument("--cores", type=int, default=0, help="pin to the first N CPUs")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs; the median is shown")
    parser.add_argument("--workdir", type=Path, help="keep the study here, reuse it if it fits")
    parser.add_argument("--model", help="time 'opcost predict --model' for this network")
    parser.add_argument("--input", default="16,3,224,224", help="its input shape")
    parser.add_argument("--predictors", type=Path, help="trained predictors for --model")
    parser.add_argument(
        "--op-models", type=Path, help="with --model: predict by replay from these op models"
    )
    args = parser.parse_args()
    if args.cores:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    if args.model:
        model_path(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        root, ops_path, train_s = build_study(work, args)
        ops = pd.read_parquet(ops_path)
        model_mb = sum(f.stat().st_size for f in (root / "gpu0").glob("*.npz")) / 1e6
        load_before = os.getloadavg()[0]

        in_process = []
        for _ in range(args.repeat):
            clear_caches()
            t0 = time.perf_counter()
            result = predict_networks(load_predictors(root), ops)
            in_process.append(time.perf_counter() - t0)
        command = [sys.executable, "-m", "opcost.cli", "predict", "--ops", str(ops_path)]
        command += ["--predictors", str(root), "--format", "csv"]
        wall, cpu = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            wall.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        load_after = os.getloadavg()[0]
    configs = len(result.table)
    trained = f"trained in {train_s:.1f} s" if train_s is not None else f"reused from {work}"
    print(
        f"{args.ops} distinct ops ({int(ops['count'].sum())} calls), {args.gpus} GPU "
        f"configurations x {len(SETTINGS)} settings x 2 modes = {configs} predictions per "
        f"network; forests of {args.trees} trees on {args.train_ops * 8} rows ({trained}), "
        f"{model_mb:.1f} MB per GPU; CPUs: {len(os.sched_getaffinity(0))}; "
        f"1-min load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print(f"in-process load + predict: {summary(in_process)}")
    print(f"command (fresh interpreter, imports included): {summary(wall)}")
    print(f"command CPU time (user + system): {summary(cpu)}")
    print(f"median time prediction: {np.median(result.table['time_s']) * 1e3:.3g} ms")


def timed(command: list[str]) -> float:
    """Wall time of one command, which must succeed."""
    t0 = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - t0


def model_path(args: argparse.Namespace) -> None:
    """Time ``opcost predict --model``: a first call, cached repeats, and importing torch."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.op_models:
            root, option = args.op_models, "--op-models"
        else:
            root = args.predictors or build_study(args.workdir or work, args)[0]
            option = "--predictors"
        command = [sys.executable, "-m", "opcost.cli", "predict", "--model", args.model]
        command += ["--input", args.input, option, str(root), "--format", "csv"]
        command += ["--cache-dir", str(work / "cache")]
        load_before = os.getloadavg()[0]
        first = timed(command)
        repeat = [timed(command) for _ in range(args.repeat)]
        imports = [
            timed([sys.executable, "-c", "import torch, torchvision"]) for _ in range(args.repeat)
        ]
        load_after = os.getloadavg()[0]
    gpus = sorted(p.parent.name for p in Path(root).glob("*/manifest.json"))
    print(
        f"opcost predict --model {args.model} --input {args.input} --format csv, fresh "
        f"interpreter; predictors {', '.join(gpus)}; CPUs: {len(os.sched_getaffinity(0))}; "
        f"1-min load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print(f"first call (extracts, caches the op table): {first:.2f} s")
    print(f"repeat (cached op table, no torch import): {summary(repeat)}")
    print(f"import torch, torchvision alone: {summary(imports)}")


def summary(seconds: list[float]) -> str:
    """Median, range and count of some timings."""
    return (
        f"{np.median(seconds):.2f} s median ({min(seconds):.2f}-{max(seconds):.2f} s, "
        f"{len(seconds)} runs)"
    )


def clear_caches() -> None:
    """Forget opcost's parsed ops, so that each timed run predicts as a fresh process does."""
    for module in ("opcost.model.features", "opcost.model.predictor"):
        for name in ("_op_vector", "_spec_type"):
            cached = getattr(sys.modules.get(module), name, None)
            if hasattr(cached, "cache_clear"):
                cached.cache_clear()


def build_study(work: Path, args: argparse.Namespace) -> tuple[Path, Path, float | None]:
    """Train the predictors and write the network under ``work``, or reuse them.

    Returns:
        The predictor root, the op table, and the training time (None if reused).
    """
    root, ops_path, stamp = work / "predictors", work / "net.parquet", work / "study.json"
    sizes = {"ops": args.ops, "gpus": args.gpus, "train_ops": args.train_ops}
    sizes["trees"] = args.trees
    sizes["predictor_format"] = FORMAT_VERSION  # a study saved in another format is retrained
    if stamp.is_file() and json.loads(stamp.read_text()) == sizes:
        return root, ops_path, None
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(0)
    data = synthetic_dataset(args.train_ops, rng)
    t0 = time.perf_counter()
    predictor = fit_predictor(data, TrainConfig(n_estimators=args.trees), "gpu0", n_jobs=-1)
    train_s = time.perf_counter() - t0
    for g in range(args.gpus):
        save_predictor(replace(predictor, gpu=f"gpu{g}"), root / f"gpu{g}")
    network(args.ops, rng).to_parquet(ops_path, index=False)
    stamp.write_text(json.dumps(sizes))
    return root, ops_path, train_s


if __name__ == "__main__":
    main()
