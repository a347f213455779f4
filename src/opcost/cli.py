"""The ``opcost`` command: extract a network's operations, predict its cost on every GPU.

::

    opcost extract --model resnet50 --input 32,3,224,224 [--no-functional] [--out ops.parquet]
    opcost predict --model resnet50 --input 32,3,224,224 [--mode training]
                   [--predictors DIR] [--format table|csv|json]
    opcost predict --ops ops.parquet ...
    opcost predict --model resnet50 --input 32,3,224,224 [--cache-dir DIR | --no-cache]
    opcost gpus [--predictors DIR] [--format table|json]
    opcost train --dataset results/dataset/h100.parquet --ops results/ops/*.parquet --gpu h100
    opcost plan --configfile config/my-study.yaml [--profile profiles/slurm] [--batch-size N]

A model is a torchvision model name (built without weights) or a user's import path
``package.module:factory``. Predictions come from ``--predictors DIR``, else the study's
``results/predictors``, else the predictors shipped with opcost (:mod:`opcost.model.sources`),
and say which. The op table of a torchvision model is cached
(:mod:`opcost.opcache`), so that predicting it again imports no torch. ``opcost --version``
prints the installed version; each command's ``--help`` ends with examples. Errors end with
a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from opcost.errors import OpcostError
from opcost.names import MODES

EXIT_ERROR = 2
DEFAULT_PREDICTORS = "results/predictors"
PREDICTORS_HELP = (
    "directory of trained predictors, one subdirectory per GPU configuration (default: "
    f"{DEFAULT_PREDICTORS} where it holds any, else those shipped with opcost)"
)
#: Extrapolated ops listed in the table output (all of them in JSON).
MAX_LISTED = 8
_SHAPE = re.compile(r"[0-9]+(?:[,x][0-9]+)*")


class CliError(OpcostError, ValueError):
    """A command-line argument is unusable; the message says what was expected."""


def parse_shape(text: str) -> tuple[int, ...]:
    """``"32,3,224,224"`` (or ``32x3x224x224``) -> ``(32, 3, 224, 224)``."""
    compact = re.sub(r"\s+", "", text)
    shape = tuple(int(p) for p in re.split(r"[,x]", compact)) if _SHAPE.fullmatch(compact) else ()
    if not shape or any(d <= 0 for d in shape):
        raise CliError(
            f"--input {text!r} is not a shape: give positive integers separated by commas, "
            "e.g. --input 32,3,224,224"
        )
    return shape


def _progress(total: int, desc: str):
    from tqdm import tqdm

    # disable=None: a bar on an interactive terminal, silence in pipes and logs.
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=None, leave=False)


def _extract(args: argparse.Namespace) -> pd.DataFrame:
    """The op table of ``--model`` at ``--input``, from the op cache where it holds it."""
    from opcost.opcache import cache_dir, extract_cached

    shape = parse_shape(args.input)
    functional = not args.no_functional

    def extract() -> pd.DataFrame:
        from opcost.extract import extract_model_input
        from opcost.names import ModelInput

        return extract_model_input(ModelInput(args.model, shape), functional_ops=functional)

    directory = None if args.no_cache else cache_dir(args.cache_dir)
    return extract_cached(
        args.model, shape, functional, extract, directory, lambda line: print(line, file=sys.stderr)
    )


def _short_type(name: str) -> str:
    return name.rsplit(".", 1)[-1] if name.startswith("torch.nn.modules.") else name


def _input_shapes(spec: str) -> str:
    inputs = json.loads(spec).get("inputs", [])
    return " ".join("x".join(str(d) for d in i["shape"]) or "()" for i in inputs)


def cmd_extract(args: argparse.Namespace) -> int:
    with _progress(2, "extract") as bar:
        bar.set_postfix_str(args.model)
        table = _extract(args)
        bar.update()
        if args.out:
            from opcost.io import write_parquet_atomic

            write_parquet_atomic(table, args.out)
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


def _fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def _json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for record in frame.to_dict(orient="records"):
        clean = {}
        for k, v in record.items():
            if hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            clean[k] = v
        out.append(clean)
    return out


def _lead(best: pd.Series) -> str:
    """How far a best choice leads the runner-up, and whether the predictors' own
    leave-one-network-out error is larger than that lead."""
    if not math.isfinite(best["margin"]):
        return ""
    text = (
        f", {_fmt(100 * best['margin'], 2)} % ahead of "
        f"{best['runner_up_gpu']}/{best['runner_up_setting']}"
    )
    if best["within_error"]:
        text += f", within the predictors' {_fmt(best['lono_mape_pct'], 3)} % LONO error"
    return text


#: The criteria of a best choice: what it is called and how its value is written.
BEST_CRITERIA = (
    ("time", "fastest", lambda v: f"{_fmt(v * 1e3)} ms"),
    ("energy", "least energy", lambda v: f"{_fmt(v)} J"),
    ("edp", "least energy-delay product", lambda v: f"{_fmt(v)} J·s"),
)


def _networks(table: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, int, int, str]]:
    """Per network of a prediction table, in its order: its rows, its distinct ops and
    calls, and the heading line that says so."""
    shapes = table.drop_duplicates("network").set_index("network")[["n_ops", "n_calls"]]
    for network, group in table.groupby("network", sort=False):
        n_ops, n_calls = shapes.loc[network]
        yield (
            network,
            group,
            n_ops,
            n_calls,
            f"{network}: {n_ops} distinct operations, {n_calls} calls",
        )


def _best_marks(group: pd.DataFrame) -> list[str]:
    """Per row, the criteria it is best by (the ``best_*`` columns)."""
    return [
        " ".join(c for c in ("time", "energy", "edp") if r[f"best_{c}"])
        for _, r in group.iterrows()
    ]


def _best_parts(best: pd.DataFrame, criteria: Sequence[str], with_setting: bool) -> list[str]:
    """The best choice by each of ``criteria`` in one network's and mode's ``best`` rows,
    with its lead; without the setting where every configuration runs at ``default``."""
    parts = []
    for criterion, label, fmt in BEST_CRITERIA:
        row = best[best["criterion"] == criterion]
        if criterion not in criteria or not len(row):
            continue
        r = row.iloc[0]
        if with_setting:
            name, lead = f"{r['gpu']}/{r['setting']}", _lead(r)
        else:
            name, lead = r["gpu"], _lead(r).replace(f"/{r['runner_up_setting']}", "")
        parts.append(f"{label} {name} ({fmt(r['value'])}{lead})")
    return parts


def _render_table(result: Any, predictors: dict[str, Any], source: str) -> str:
    from opcost.model.sources import provenance_line

    lines = [f"predictors ({source}):"]
    lines += [f"  {provenance_line(predictors[gpu])}" for gpu in sorted(predictors)]
    lines.append("")
    table = result.table
    for network, group, n_ops, n_calls, heading in _networks(table):
        lines.append(heading)
        show = pd.DataFrame(
            {
                "mode": group["mode"],
                "gpu": group["gpu"],
                "setting": group["setting"],
                "time_ms": group["time_s"].map(lambda v: _fmt(v * 1e3)),
                "power_w": group["power_w"].map(lambda v: _fmt(v)),
                "energy_j": group["energy_j"].map(lambda v: _fmt(v)),
                "edp_js": group["edp_js"].map(lambda v: _fmt(v)),
                "best": _best_marks(group),
            }
        )
        lines += ["", show.to_string(index=False), ""]
        best = result.best[result.best["network"] == network]
        for mode, b in best.groupby("mode", sort=False):
            parts = _best_parts(b, ("time", "energy", "edp"), with_setting=True)
            if not (b["criterion"] == "energy").any():
                parts.append("energy: no power model (time-only data)")
            lines.append(f"best for {mode}: " + "; ".join(parts))
        per_op = result.per_op[result.per_op["network"] == network]
        for r in per_op.itertuples(index=False):
            if r.status == "ok":
                text = (
                    f"{_fmt(r.per_op_energy_j)} J with the best setting per operation vs "
                    f"{_fmt(r.best_single_energy_j)} J at the best single setting "
                    f"{r.best_single_setting}: {_fmt(r.saving_pct, 3)} % less energy "
                    "(ignores the cost of switching settings)"
                )
            else:
                text = str(r.status)
            lines.append(f"per-operation setting choice, {r.gpu} {r.mode}: {text}")
        flags = result.extrapolation[result.extrapolation["network"] == network]
        lines += _extrapolation_lines(flags, n_ops, n_calls, "lie outside the training data")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _extrapolation_lines(flags: pd.DataFrame, n_ops: int, n_calls: int, what: str) -> list[str]:
    """Per GPU configuration, how many of a network's ops are flagged, and the first
    :data:`MAX_LISTED` of them."""
    lines = []
    for gpu, f in flags.groupby("gpu", sort=True):
        lines.append(
            f"extrapolation, {gpu}: {f['op_id'].nunique()} of {n_ops} distinct operations "
            f"({int(f['count'].sum())} of {n_calls} calls) {what}:"
        )
        for r in f.head(MAX_LISTED).itertuples(index=False):
            lines.append(f"  {_short_type(r.type)} {r.op_id}: {r.reason}")
        if len(f) > MAX_LISTED:
            lines.append(f"  ... {len(f) - MAX_LISTED} more (--format json lists all)")
    return lines


class _NoProgress:
    """Stands in for a tqdm bar that would be disabled, without importing tqdm."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def _op_model_line(model: Any) -> str:
    """One line: ``h100: NVIDIA H100 80GB HBM3, driver ..., torch ..., host CPU ...,
    measured 2026-11-24, 9088 samples, host probe 2.73 ms``."""
    m = model.meta
    parts = [str(m.get("gpu_name", "GPU not recorded"))]
    for key, label in (("driver_version", "driver"), ("torch_version", "torch")):
        if m.get(key):
            parts.append(f"{label} {m[key]}")
    if m.get("host_cpu"):
        parts.append(f"host CPU {m['host_cpu']}")
    dates = m.get("measured") or []
    if dates:
        parts.append(f"measured {dates[0]}" + ("" if dates[0] == dates[-1] else f" to {dates[-1]}"))
    if m.get("samples"):
        parts.append(f"{m['samples']} samples")
    parts.append(f"host probe {_fmt(model.host_probe_s * 1e3, 3)} ms")
    return f"{model.gpu}: " + ", ".join(parts)


def _pace_line(mode: str, group: pd.DataFrame) -> str:
    """Whether the host or the GPU sets the pace of a network in one mode, and what that
    means for the choice of GPU."""
    host = group["bound"].eq("host")
    ratio = group["host_time_s"] / group["gpu_busy_s"].where(group["gpu_busy_s"] > 0)
    if host.all():
        return (
            f"pace, {mode}: the host sets it on every GPU configuration (host "
            f"{_fmt(group['host_time_s'].min() * 1e3)}-{_fmt(group['host_time_s'].max() * 1e3)}"
            f" ms a step, {_fmt(ratio.min(), 2)}-{_fmt(ratio.max(), 2)}x the GPU's busy time): "
            "the GPU choice barely changes the time; a faster host, a larger batch or CUDA "
            f"graphs would (with graphs {_fmt(group['graph_time_s'].min() * 1e3)}-"
            f"{_fmt(group['graph_time_s'].max() * 1e3)} ms a step)"
        )
    if not host.any():
        return (
            f"pace, {mode}: the GPU sets it on every GPU configuration (host "
            f"{_fmt(100 / ratio.max(), 3)}-{_fmt(100 / ratio.min(), 3)} % of the GPU's busy "
            "time): the GPU choice decides the time"
        )
    hosts = ", ".join(group.loc[host, "gpu"])
    return f"pace, {mode}: the host sets it on {hosts}; the GPU on the others"


def _host_probe_ms(text: str) -> float:
    """``--host-probe-ms``: a positive number of ms, or ``local``: this host's probe
    (:func:`opcost.tracing.host_probe_s` on its CUDA GPU, as the op space measured it)."""
    if text.strip().lower() == "local":
        import torch

        if not torch.cuda.is_available():
            raise CliError(
                "--host-probe-ms local measures this host issuing work to a CUDA GPU, and "
                "there is none here; give the probe of the host to predict for in ms"
            )
        from opcost import tracing

        tracing.host_probe_s("cuda")  # the first dispatches warm the CUDA context up
        return tracing.host_probe_s("cuda") * 1e3
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise CliError(f"--host-probe-ms must be a positive number of ms or 'local', not {text!r}")
    return value


def _render_replay(
    result: Any, models: dict[str, Any], directory: Path, probe_s: float, given: bool
) -> str:
    lines = [f"op models (replay of the network's calls), in {directory}:"]
    lines += [f"  {_op_model_line(models[gpu])}" for gpu in sorted(models)]
    whose = (
        "given"
        if given
        else "the median of the op-space hosts'; --host-probe-ms MS or local for yours"
    )
    lines.append(
        f"host times for one host on every GPU: host probe {_fmt(probe_s * 1e3, 3)} ms ({whose})"
    )
    lines.append("")
    table = result.table
    for network, group, n_ops, n_calls, heading in _networks(table):
        lines.append(heading)
        show = pd.DataFrame(
            {
                "mode": group["mode"],
                "gpu": group["gpu"],
                "time_ms": group["time_s"].map(lambda v: _fmt(v * 1e3)),
                "host_ms": group["host_time_s"].map(lambda v: _fmt(v * 1e3)),
                "gpu_ms": group["gpu_busy_s"].map(lambda v: _fmt(v * 1e3)),
                "pace": group["bound"],
                "power_w": group["power_w"].map(lambda v: _fmt(v)),
                "energy_j": group["energy_j"].map(lambda v: _fmt(v)),
                "graph_ms": group["graph_time_s"].map(lambda v: _fmt(v * 1e3)),
                "graph_j": group["graph_energy_j"].map(lambda v: _fmt(v)),
                "best": _best_marks(group),
            }
        )
        lines += ["", show.to_string(index=False), ""]
        lines.append("graph_ms, graph_j: run from a CUDA graph, without the host's share")
        best = result.best[result.best["network"] == network]
        for mode, b in best.groupby("mode", sort=False):
            parts = _best_parts(b, ("time", "energy"), with_setting=False)
            lines.append(f"best for {mode}: " + "; ".join(parts))
            lines.append(_pace_line(str(mode), group[group["mode"] == mode]))
        flags = result.extrapolation[result.extrapolation["network"] == network]
        lines += _extrapolation_lines(flags, n_ops, n_calls, "unlike any sampled")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _predict_replay(args: argparse.Namespace) -> int:
    """``opcost predict --op-models DIR``: the replay of the network's calls."""
    from opcost.model.opmodel_format import load_op_models
    from opcost.predict import read_ops_table
    from opcost.predict_replay import common_probe_s, replay_networks

    models = load_op_models(args.op_models)
    given = args.host_probe_ms is not None
    probe_s = args.host_probe_ms / 1e3 if given else common_probe_s(models)
    ops = read_ops_table(args.ops) if args.ops is not None else _extract(args)
    modes = [args.mode] if args.mode else None
    result = replay_networks(models, ops, modes, host_probe_s=probe_s)
    if args.format == "csv":
        sys.stdout.write(result.table.to_csv(index=False))
    elif args.format == "json":
        doc = {
            "op_models": {
                "directory": str(args.op_models),
                "gpus": [
                    {"gpu": gpu, "host_probe_s": m.host_probe_s, **m.meta}
                    for gpu, m in sorted(models.items())
                ],
                "host_probe_s": probe_s,
            },
            "units": {
                "time_s": "s",
                "host_time_s": "s",
                "gpu_busy_s": "s",
                "power_w": "W",
                "energy_j": "J",
                "edp_js": "J*s",
                "graph_time_s": "s",
                "graph_energy_j": "J",
            },
            "predictions": _json_records(result.table),
            "best": _json_records(result.best),
            "extrapolation": _json_records(result.extrapolation),
        }
        print(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(_render_replay(result, models, args.op_models, probe_s, given))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from opcost.model.sources import predictor_source, provenance
    from opcost.predict import load_predictors, predict_networks, read_ops_table

    if (args.model is None) == (args.ops is None):
        raise CliError("give either --model (with --input) or --ops FILE")
    if args.model is not None and args.input is None:
        raise CliError("--model needs --input, e.g. --input 32,3,224,224")
    if args.host_probe_ms is not None and args.op_models is None:
        raise CliError("--host-probe-ms needs --op-models (the forests know no host)")
    if args.host_probe_ms is not None:
        args.host_probe_ms = _host_probe_ms(args.host_probe_ms)
    if args.op_models is not None:
        if args.predictors is not None:
            raise CliError("give --predictors (forests) or --op-models (replay), not both")
        return _predict_replay(args)
    # tqdm shows no bar where stderr is not a terminal (disable=None); there, skip its
    # import too (about 30 ms of a 2-core CPU: scripts and pipes predict faster).
    interactive = not hasattr(sys.stderr, "isatty") or sys.stderr.isatty()
    with _progress(3, "predict") if interactive else _NoProgress() as bar:
        bar.set_postfix_str("load predictors")
        source = predictor_source(args.predictors)
        predictors = load_predictors(source.directory)
        modes = [args.mode] if args.mode else None
        bar.update()
        if args.ops is not None:
            bar.set_postfix_str(f"read {args.ops}")
            ops = read_ops_table(args.ops)
        else:
            bar.set_postfix_str(f"extract {args.model}")
            ops = _extract(args)
        bar.update()
        bar.set_postfix_str("predict")
        result = predict_networks(predictors, ops, modes)
        bar.update()
    if args.format == "csv":
        sys.stdout.write(result.table.to_csv(index=False))
    elif args.format == "json":
        doc = {
            "predictors": {
                "source": source.label,
                "directory": str(source.directory),
                "gpus": [provenance(predictors[gpu]) for gpu in sorted(predictors)],
            },
            "units": {"time_s": "s", "power_w": "W", "energy_j": "J", "edp_js": "J*s"},
            "predictions": _json_records(result.table),
            "best": _json_records(result.best),
            "per_op_setting": _json_records(result.per_op),
            "extrapolation": _json_records(result.extrapolation),
        }
        print(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(_render_table(result, predictors, source.label))
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from opcost.model.sources import predictor_source, provenance
    from opcost.predict import load_predictors

    source = predictor_source(args.predictors)
    predictors = load_predictors(source.directory)
    rows = [provenance(predictors[gpu]) for gpu in sorted(predictors)]
    if args.format == "json":
        doc = {"source": source.label, "directory": str(source.directory), "gpus": rows}
        print(json.dumps(doc, indent=1))
        return 0

    def lono(r: dict[str, Any], criterion: str) -> str:
        scores = r["lono_mape_pct"]
        return " / ".join(
            _fmt(scores[m][criterion], 3) for m in MODES if criterion in scores.get(m, {})
        )

    table = pd.DataFrame(
        {
            "gpu": [r["gpu"] for r in rows],
            "device": [", ".join(r["devices"]) for r in rows],
            "settings": [",".join(r["settings"]) for r in rows],
            "driver": [", ".join(r["drivers"]) for r in rows],
            "torch": [", ".join(r["torch_versions"]) for r in rows],
            "measured": [" to ".join(dict.fromkeys(r["measured"])) for r in rows],
            "ops": [r["n_ops"] for r in rows],
            "lono_time_pct": [lono(r, "time") for r in rows],
            "lono_energy_pct": [lono(r, "energy") for r in rows],
        }
    )
    print(f"predictors ({source.label}), in {source.directory}:\n")
    print(table.to_string(index=False))
    print("\nlono_*_pct: leave-one-network-out error of whole networks, inference / training")
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
        f"per batch {plan.BATCH_STARTUP_S:g} s. Time limit asked: the profile's runtime per "
        "job, summed over the batches."
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
  opcost predict --ops net.parquet --predictors /data/predictors
  opcost predict --model resnet50 --input 8,3,224,224 --op-models results/op-models""",
    "train": """\
  opcost train --dataset results/dataset/h100.parquet --ops results/ops/*_*.parquet \\
      --gpu h100 --config config/local.yaml""",
    "gpus": """\
  opcost gpus
  opcost gpus --predictors results/predictors --format json""",
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
        "predict a network's time, power and energy on every trained GPU and setting",
        EXAMPLES["predict"],
    )
    pred.add_argument("--model", help=model_help)
    pred.add_argument("--input", help=input_help)
    pred.add_argument("--ops", type=Path, help="op table from 'opcost extract --out'")
    pred.add_argument("--mode", choices=MODES, help="inference or training (default: both)")
    pred.add_argument(
        "--predictors",
        type=Path,
        help=PREDICTORS_HELP,
    )
    pred.add_argument(
        "--op-models",
        type=Path,
        help="predict by replaying the network's calls on a host thread and a GPU stream, "
        "from op models learnt from the op-space study (a directory such as "
        "results/op-models, built by 'snakemake op_models'), instead of summing the "
        "forests' per-op predictions",
    )
    pred.add_argument(
        "--host-probe-ms",
        help="with --op-models: the host-speed probe (ms) of the host to predict for, or "
        "'local' to measure this host's (needs a CUDA GPU here; default: the median of "
        "the hosts that measured the op space, shown in the output)",
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
    gpus.add_argument("--predictors", type=Path, help=PREDICTORS_HELP)
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


if __name__ == "__main__":
    sys.exit(main())
