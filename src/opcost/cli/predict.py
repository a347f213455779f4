"""``opcost predict``: a network's time, power and energy on every GPU configuration, from
the op models' replay of its calls (the default) or the thesis's forests' per-op sum
(``opcost gpus``, which configurations answer: :mod:`opcost.cli.gpus`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd

from opcost.cli.common import (
    MAX_LISTED,
    CliError,
    _extract,
    _fmt,
    _json_records,
    _NoProgress,
    _progress,
    _short_type,
)


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


#: The table of a network's predictions: per shown column, its heading, the prediction
#: column and the factor numbers are shown at (None: the values as they are).
FOREST_COLUMNS = (
    ("mode", "mode", None), ("gpu", "gpu", None), ("setting", "setting", None),
    ("time_ms", "time_s", 1e3), ("power_w", "power_w", 1), ("energy_j", "energy_j", 1),
    ("edp_js", "edp_js", 1),
)  # fmt: skip
REPLAY_COLUMNS = (
    ("mode", "mode", None), ("gpu", "gpu", None), ("time_ms", "time_s", 1e3),
    ("host_ms", "host_time_s", 1e3), ("gpu_ms", "gpu_busy_s", 1e3), ("pace", "bound", None),
    ("power_w", "power_w", 1), ("energy_j", "energy_j", 1), ("graph_ms", "graph_time_s", 1e3),
    ("graph_j", "graph_energy_j", 1),
)  # fmt: skip


def _shown(group: pd.DataFrame, columns: Sequence[tuple[str, str, float | None]]) -> str:
    """One network's rows as the table shows them (``columns``: :data:`FOREST_COLUMNS`,
    :data:`REPLAY_COLUMNS`), numbers to 4 significant digits, then the ``best`` marks."""
    show = {
        heading: group[column]
        if factor is None
        else group[column].map(lambda v, f=factor: _fmt(None if v is None else v * f))
        for heading, column, factor in columns
    }
    return pd.DataFrame({**show, "best": _best_marks(group)}).to_string(index=False)


def _render_table(result: Any, predictors: dict[str, Any], source: str) -> str:
    from opcost.model.sources import provenance_line

    lines = [f"predictors ({source}):"]
    lines += [f"  {provenance_line(predictors[gpu])}" for gpu in sorted(predictors)]
    lines.append("")
    table = result.table
    for network, group, n_ops, n_calls, heading in _networks(table):
        lines.append(heading)
        lines += ["", _shown(group, FOREST_COLUMNS), ""]
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


#: The share of a network's predicted GPU time in grouped convolutions from which the
#: output says the prediction is less sure (docs/results.md, "Networks never trained on").
GROUPED_CONV_NOTE_SHARE = 0.2


def _grouped_conv_line(mode: str, group: pd.DataFrame) -> str | None:
    """A caution where grouped convolutions hold :data:`GROUPED_CONV_NOTE_SHARE` or more of
    the predicted GPU time on some configuration, else None."""
    share = group["grouped_conv_share"]
    if not share.max() >= GROUPED_CONV_NOTE_SHARE:
        return None
    return (
        f"less sure, {mode}: grouped convolutions are {_fmt(100 * share.min(), 2)}-"
        f"{_fmt(100 * share.max(), 2)} % of the predicted GPU time; cuDNN runs each either "
        "as one kernel or as kernels a group, at rates many times apart, and their "
        "shapes do not tell which; torch.backends.cudnn.benchmark = True, which times "
        "cuDNN's kernels instead of guessing, often runs them much faster "
        '(docs/results.md, "Networks never trained on")'
    )


def _host_probe_ms(text: str) -> float:
    """``--host-probe-ms``: a positive number of ms, or ``local``: this host's probe
    (:func:`opcost.host_probe.host_probe_s` on its CUDA GPU, as the op space measured it)."""
    if text.strip().lower() == "local":
        import torch

        if not torch.cuda.is_available():
            raise CliError(
                "--host-probe-ms local measures this host issuing work to a CUDA GPU, and "
                "there is none here; give the probe of the host to predict for in ms"
            )
        from opcost import host_probe

        host_probe.host_probe_s("cuda")  # the first dispatches warm the CUDA context up
        return host_probe.host_probe_s("cuda") * 1e3
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise CliError(f"--host-probe-ms must be a positive number of ms or 'local', not {text!r}")
    return value


def _op_models_heading(source: Any) -> str:
    """``op models (where from), in DIR:``; without the first part where it is DIR."""
    where = str(source.directory)
    return f"op models{'' if source.label == where else f' ({source.label}),'} in {where}:"


def _render_replay(
    result: Any, models: dict[str, Any], source: Any, probe_s: float, given: bool
) -> str:
    lines = [_op_models_heading(source)]
    lines += [f"  {_op_model_line(models[gpu])}" for gpu in sorted(models)]
    whose = (
        "given"
        if given
        else "the median of the op-space hosts'; --host-probe-ms MS or local for yours"
    )
    lines.append(
        f"host times for one host on every GPU: host probe {_fmt(probe_s * 1e3, 3)} ms ({whose})"
    )
    lines.append(
        "each network's calls replayed on a host thread and a GPU stream (--forests: the "
        "thesis's forests, per-op predictions summed)"
    )
    lines.append("")
    table = result.table
    for network, group, n_ops, n_calls, heading in _networks(table):
        lines.append(heading)
        lines += ["", _shown(group, REPLAY_COLUMNS), ""]
        lines.append("graph_ms, graph_j: run from a CUDA graph, without the host's share")
        best = result.best[result.best["network"] == network]
        for mode, b in best.groupby("mode", sort=False):
            parts = _best_parts(b, ("time", "energy"), with_setting=False)
            lines.append(f"best for {mode}: " + "; ".join(parts))
            in_mode = group[group["mode"] == mode]
            lines.append(_pace_line(str(mode), in_mode))
            grouped = _grouped_conv_line(str(mode), in_mode)
            lines += [grouped] if grouped else []
        flags = result.extrapolation[result.extrapolation["network"] == network]
        lines += _extrapolation_lines(flags, n_ops, n_calls, "unlike any sampled")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _predict_replay(args: argparse.Namespace, source: Any) -> int:
    """The default ``opcost predict``: the op models' replay of the network's calls."""
    from opcost.model.opmodel_format import load_op_models
    from opcost.predict import read_ops_table
    from opcost.predict_replay import common_probe_s, replay_networks

    models = load_op_models(source.directory)
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
                "source": source.label,
                "directory": str(source.directory),
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
        sys.stdout.write(_render_replay(result, models, source, probe_s, given))
    return 0


#: Said on stderr where no op models can be had and the forests answer instead.
NO_OP_MODELS = (
    "opcost: no op models (none given, none in results/op-models, and no op-space data "
    "in an opcost checkout to build them from: 'snakemake op_models' builds them); "
    "answering with the forests"
)


def _forests_asked(args: argparse.Namespace) -> bool:
    """Whether the command line asks for the forests: ``--forests`` or ``--predictors DIR``."""
    return args.forests or args.predictors is not None


def _op_models(args: argparse.Namespace) -> Any:
    """The op models' source (:func:`opcost.model.sources.op_model_source`), None where
    the forests answer: :func:`_forests_asked`, or no op models to be had (said on
    stderr). Refuses options of the one given to the other."""
    from opcost.model.sources import op_model_source

    forests = _forests_asked(args)
    if forests and args.op_models is not None:
        raise CliError("give --predictors or --forests (forests) or --op-models (replay), not both")
    if forests:
        return None
    source = op_model_source(args.op_models, log=lambda line: print(line, file=sys.stderr))
    if source is None:
        print(NO_OP_MODELS, file=sys.stderr)
    return source


def cmd_predict(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.ops is None):
        raise CliError("give either --model (with --input) or --ops FILE")
    if args.model is not None and args.input is None:
        raise CliError("--model needs --input, e.g. --input 32,3,224,224")
    if args.host_probe_ms is not None and _forests_asked(args):
        raise CliError("--host-probe-ms is for the op models' replay; the forests know no host")
    source = _op_models(args)
    if source is None:
        return _predict_forests(args)
    if args.host_probe_ms is not None:
        args.host_probe_ms = _host_probe_ms(args.host_probe_ms)
    return _predict_replay(args, source)


def _predict_forests(args: argparse.Namespace) -> int:
    """``opcost predict --forests``: the thesis's forests, their per-op predictions summed."""
    from opcost.model.sources import predictor_source, provenance
    from opcost.predict import load_predictors, predict_networks, read_ops_table

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
