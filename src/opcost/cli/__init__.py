"""The ``opcost`` command: extract a network's operations, predict its cost on every GPU.

::

    opcost extract --model resnet50 --input 32,3,224,224 [--no-functional] [--out ops.parquet]
    opcost predict --model resnet50 --input 32,3,224,224 [--mode training]
                   [--op-models DIR] [--host-probe-ms MS|local] [--format table|csv|json]
    opcost predict --model resnet50 --input 32,3,224,224 --forests [--predictors DIR]
    opcost predict --ops ops.parquet ...
    opcost predict --model resnet50 --input 32,3,224,224 [--cache-dir DIR | --no-cache]
    opcost gpus [--op-models DIR | --forests [--predictors DIR]] [--format table|json]
    opcost train --dataset results/dataset/h100.parquet --ops results/ops/*.parquet --gpu h100
    opcost plan --configfile config/my-study.yaml [--profile profiles/slurm] [--batch-size N]

A model is a torchvision model name (built without weights) or a user's import path
``package.module:factory``. ``opcost predict`` replays the network's calls from the op
models (:mod:`opcost.predict_replay`): those of ``--op-models DIR``, else the study's
``results/op-models``, else those built once from the checkout's ``data/op-space`` and
cached (:mod:`opcost.model.op_model_cache`). With ``--forests`` (or ``--predictors
DIR``), or where no op models can be had, it sums the thesis's forests' per-op
predictions instead: those of ``--predictors DIR``, else ``results/predictors``, else the
shipped (:mod:`opcost.model.sources`). Either says which answered. The op table of a torchvision
model is cached (:mod:`opcost.opcache`), so that predicting it again imports no torch.
``opcost --version`` prints the installed version; each command's ``--help`` ends with
examples. Errors end with a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from opcost.cli.common import (
    DEFAULT_PREDICTORS,
    EXIT_ERROR,
    PREDICTORS_HELP,
    CliError,
    _extract,
    _fmt,
    _input_shapes,
    _progress,
    _short_type,
    parse_shape,
)
from opcost.cli.gpus import cmd_gpus
from opcost.cli.predict import cmd_predict
from opcost.errors import OpcostError
from opcost.names import MODES

__all__ = [
    "EXIT_ERROR",
    "CliError",
    "build_parser",
    "cmd_gpus",
    "cmd_predict",
    "main",
    "parse_shape",
]


def cmd_extract(args: argparse.Namespace) -> int:
    with _progress(2, "extract") as bar:
        bar.set_postfix_str(args.model)
        table = _extract(args)
        bar.update()
        if args.out:
            from opcost.io import write_parquet_atomic
            from opcost.model.grad_sums import COLUMNS as GRAD_SUMS
            from opcost.schemas import OPS

            # The op table, and its calls' gradient sums for a prediction from it (--ops).
            write_parquet_atomic(table[[*OPS.names, *GRAD_SUMS]], args.out)
        bar.update()
    show = pd.DataFrame(
        {
            "op_id": table["op_id"],
            "count": table["count"],
            "type": table["type"].map(_short_type),
            "inputs": table["spec"].map(_input_shapes),
        }
    )
    name = table["model_input"].iloc[0] if len(table) else args.model
    print(f"{name}: {len(table)} distinct operations, {int(table['count'].sum())} calls")
    if len(show):
        print(show.to_string(index=False))
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from opcost.train import TrainConfig, TrainOutputs, train_gpu

    section: dict[str, Any] = {}
    if args.config:
        import yaml

        from opcost.config import validate_config

        with open(args.config) as f:
            config = yaml.safe_load(f) or {}
        if not isinstance(config, dict):
            raise CliError(f"{args.config}: the config must be a mapping")
        section = validate_config(config)["train"]
    cfg = TrainConfig.from_config(section)
    out = Path(args.out) if args.out else Path(DEFAULT_PREDICTORS) / args.gpu
    lines: list[str] = []
    # One step per log line of train_gpu: summary, hold-out, each network, done.
    with _progress(len(args.ops) + 3, f"train {args.gpu}") as bar:

        def log(line: str) -> None:
            lines.append(line)
            bar.set_postfix_str(line[:60])
            bar.update()

        metrics = train_gpu(args.dataset, args.ops, TrainOutputs.under(out), cfg, args.gpu, -1, log)
    for line in lines:
        print(line, file=sys.stderr)
    rows = []
    for split, key, what in (
        ("holdout", "op", "ops"),
        ("holdout", "baseline_op", "ops, per-type median"),
        ("lono", "op", "ops"),
        ("lono", "baseline_op", "ops, per-type median"),
        ("lono", "network", "network vs measured"),
        ("lono", "network_vs_summed_ops", "network vs summed ops"),
    ):
        for mode, score in metrics[split].get(key, {}).items():
            rows.append(
                {
                    "split": split,
                    "compared": what,
                    "mode": mode,
                    "n": score.get("n"),
                    "time_mape_pct": _fmt(_num(score.get("time_mape_pct")), 3),
                    "power_mape_pct": _fmt(_num(score.get("power_mape_pct")), 3),
                    "energy_mape_pct": _fmt(_num(score.get("energy_mape_pct")), 3),
                }
            )
    print(f"predictors of {args.gpu} in {out} (regressor {cfg.regressor}, time fitted on log)")
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def cmd_plan(args: argparse.Namespace) -> int:
    """Print what a study will measure per GPU configuration, before anything runs."""
    from opcost import plan
    from opcost.config import load_study_file

    batching = plan.read_profile(args.profile, args.batch_size)
    study = load_study_file(args.configfile)
    op_ids = plan.study_op_ids(study)
    plans = plan.plan_study(study, op_ids, batching, args.directory)
    if args.format == "json":
        out = {
            "configfile": str(args.configfile),
            "model_inputs": len(study.model_inputs),
            "modes": list(study.modes),
            "distinct_ops": len(op_ids),
            "batch_size": batching.batch_size,
            "gpus": plan.as_records(plans),
        }
        print(json.dumps(out, indent=2))
        return 0
    source = "--batch-size" if args.batch_size else f"{args.profile}, group-components"
    print(
        f"{args.configfile}: {len(study.model_inputs)} model-input sets, {len(op_ids)} distinct "
        f"ops, modes {', '.join(study.modes)}; batches of up to {batching.batch_size} "
        f"profiling jobs ({source})"
    )
    print(plan.render_table(plans))
    print(
        f"to run: measurements not yet in {Path(args.directory) / 'results' / 'raw'} (.json "
        f"and .csv). GPU-h: per job warmup_s + min_run_time_s + {plan.JOB_OVERHEAD_S:g} s, "
        f"per batch {plan.BATCH_STARTUP_S:g} s; where a CUDA configuration's jobs trace, "
        f"{plan.TRACE_OP_S:g} s an op, {plan.TRACE_NETWORK_S:g} s a network, "
        f"{plan.PROFILER_START_S:g} s a batch more. Time limit asked: the profile's runtime "
        "per job, summed over the batches."
    )
    if study.included:
        print(f"included, measured elsewhere (not profiled): {', '.join(study.included)}")
    return 0


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _version() -> str:
    """The installed package's version (its metadata), else the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("opcost")
    except metadata.PackageNotFoundError:
        from opcost import __version__

        return __version__


def _cache_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="where extracted op tables of torchvision models are kept, so that a repeat "
        "imports no torch (default $OPCOST_CACHE_DIR, else $XDG_CACHE_HOME/opcost/ops, "
        "else ~/.cache/opcost/ops)",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="extract again; neither read nor write the cache"
    )


def _source_options(parser: argparse.ArgumentParser) -> None:
    """Which models answer: the op models (default) or the thesis's forests."""
    parser.add_argument(
        "--op-models",
        type=Path,
        help="directory of op models, one subdirectory per GPU configuration, whose "
        "replay of the network's calls answers (default: results/op-models where it "
        "holds any, else those built once from this opcost checkout's data/op-space and "
        "cached in ~/.cache/opcost/op-models; without either, the forests answer)",
    )
    parser.add_argument(
        "--forests",
        action="store_true",
        help="answer with the thesis's forests instead, their per-op predictions summed",
    )
    parser.add_argument("--predictors", type=Path, help=f"with --forests: {PREDICTORS_HELP}")


def _sub(sub: Any, name: str, help: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with examples."""
    return sub.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


EXAMPLES = {
    "extract": """\
  opcost extract --model resnet50 --input 32,3,224,224
  opcost extract --model mypkg.nets:make_net --input 16,3,128,128 --out net.parquet""",
    "predict": """\
  opcost predict --model resnet50 --input 8,3,224,224
  opcost predict --model resnet50 --input 8,3,224,224 --mode training --format json
  opcost predict --model resnet50 --input 8,3,224,224 --host-probe-ms local
  opcost predict --ops net.parquet --op-models results/op-models
  opcost predict --model resnet50 --input 8,3,224,224 --forests""",
    "train": """\
  opcost train --dataset results/dataset/h100.parquet --ops results/ops/*_*.parquet \\
      --gpu h100 --config config/local.yaml""",
    "gpus": """\
  opcost gpus
  opcost gpus --op-models results/op-models --format json
  opcost gpus --forests""",
    "plan": """\
  opcost plan --configfile config/my-study.yaml
  opcost plan --configfile config/my-study.yaml --batch-size 20 --format json""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opcost",
        description="Time, power and energy of PyTorch networks on NVIDIA GPUs, operation by "
        "operation.\n'opcost COMMAND --help' explains a command, with examples.",
        epilog="""examples:
  opcost predict --model resnet50 --input 8,3,224,224
  opcost gpus
  opcost extract --model resnet50 --input 32,3,224,224
  opcost plan --configfile config/my-study.yaml

The measurements and the predictors come from the pipeline: run 'snakemake' (README.md).""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"opcost {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = "torchvision model name (e.g. resnet50) or import path package.module:factory"
    input_help = "input shape, comma-separated, e.g. 32,3,224,224"

    ext = _sub(
        sub, "extract", "list a network's operations and how often each runs", EXAMPLES["extract"]
    )
    ext.add_argument("--model", required=True, help=model_help)
    ext.add_argument("--input", required=True, help=input_help)
    ext.add_argument(
        "--no-functional",
        action="store_true",
        help="record leaf modules only, not functional ops (residual adds, flatten, ...)",
    )
    ext.add_argument("--out", help="also write the op table to this Parquet file")
    _cache_options(ext)
    ext.set_defaults(func=cmd_extract)

    pred = _sub(
        sub,
        "predict",
        "predict a network's time, power and energy on every trained GPU configuration",
        EXAMPLES["predict"],
    )
    pred.add_argument("--model", help=model_help)
    pred.add_argument("--input", help=input_help)
    pred.add_argument("--ops", type=Path, help="op table from 'opcost extract --out'")
    pred.add_argument("--mode", choices=MODES, help="inference or training (default: both)")
    _source_options(pred)
    pred.add_argument(
        "--host-probe-ms",
        help="the host-speed probe (ms) of the host to predict for, or 'local' to measure "
        "this host's (needs a CUDA GPU here; default: the median of the hosts that "
        "measured the op space, shown in the output); not with --forests",
    )
    pred.add_argument("--format", choices=("table", "csv", "json"), default="table")
    pred.add_argument("--no-functional", action="store_true", help="as for extract")
    _cache_options(pred)
    pred.set_defaults(func=cmd_predict)

    gpus = _sub(
        sub,
        "gpus",
        "list the GPU configurations that opcost predict answers for, and their data",
        EXAMPLES["gpus"],
    )
    _source_options(gpus)
    gpus.add_argument("--format", choices=("table", "json"), default="table")
    gpus.set_defaults(func=cmd_gpus)

    tr = _sub(
        sub,
        "train",
        "train and validate one GPU configuration's predictor from its dataset "
        "(what the workflow's train rule does)",
        EXAMPLES["train"],
    )
    tr.add_argument("--dataset", required=True, help="results/dataset/{gpu}.parquet")
    tr.add_argument(
        "--ops", nargs="+", default=[], help="op tables of the networks (leave-one-network-out)"
    )
    tr.add_argument("--gpu", required=True, help="GPU configuration name")
    tr.add_argument("--out", help=f"output directory (default {DEFAULT_PREDICTORS}/GPU)")
    tr.add_argument("--config", help="study config whose train section to use (else defaults)")
    tr.set_defaults(func=cmd_train)

    pl = _sub(
        sub,
        "plan",
        "before a run: how many ops, measurements, SLURM batches and GPU-hours a "
        "study needs per GPU configuration, less what results/raw already holds",
        EXAMPLES["plan"],
    )
    pl.add_argument("--configfile", required=True, type=Path, help="the study's config file")
    pl.add_argument(
        "--profile",
        type=Path,
        default=Path("profiles/slurm"),
        help="SLURM profile whose batch size and runtimes to use (default profiles/slurm)",
    )
    pl.add_argument(
        "--batch-size", type=_positive_int, help="profiling jobs per batch (default: the profile's)"
    )
    pl.add_argument(
        "--directory",
        type=Path,
        default=Path("."),
        help="the workflow's working directory, holding results/raw (default .)",
    )
    pl.add_argument("--format", choices=("table", "json"), default="table")
    pl.set_defaults(func=cmd_plan)
    return parser


#: Exit code when the reader of stdout went away (``opcost extract ... | head -1``): 128 +
#: SIGPIPE, what a shell reports for coreutils' ``seq 100000 | head -1``, so that a
#: pipeline under ``set -o pipefail`` sees the output was cut short.
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> int:
    """Exit quietly when stdout's reader has gone: no message, and nothing left for the
    interpreter to flush into the closed pipe at exit (Python's documented recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``opcost`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        return _stdout_closed()
    except (OpcostError, OSError) as e:
        # One line: a multi-line message (a config's list of errors) is joined.
        message = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
        message = message or type(e).__name__
        print(f"opcost {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
