"""The op models' training job (rule ``train_op_models``): fit one GPU configuration's
op models on its op-space chunk tables, score them on held-out samples, save them.

Apart from :mod:`opcost.workflow`, whose helpers every stage script imports: the modules
this job uses (the regressors of :mod:`opcost.train` among them) are then no code of
those stages, and a change to them reruns this job alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opcost.errors import OpcostError
from opcost.io import write_atomic


class OpModelDataError(OpcostError, ValueError):
    """Op-space chunk tables without a usable sample to train on."""


def run_train_op_models(
    gpu: str,
    chunks: list[str],
    twin: list[str],
    settings: dict[str, Any],
    directory: str | Path,
    log: str | Path,
    threads: int = 1,
    peers: Sequence[str] = (),
) -> dict[str, Any]:
    """Fit the op models of ``gpu`` on its chunk tables (families it lacks from the
    ``twin``'s), pooled with its ``peers``' (other GPUs', :func:`opcost.model.opmodel.fit`),
    score them on held-out sampled configurations, and save both
    (:func:`opcost.model.opmodel_format.save_op_model`, the chunk tables as sources).
    Writes a short summary to ``log``; returns the held-out errors."""
    from opcost.model import op_scores, op_tables, opmodel
    from opcost.model.opmodel_format import save_op_model
    from opcost.train import TrainConfig, make_regressor

    started = time.time()
    table = op_tables.read_chunks(list(chunks))
    twin_table = op_tables.read_chunks(list(twin)) if twin else None
    peer_table = op_tables.read_chunks(list(peers)) if peers else None
    usable = op_tables.training_rows(table) if "status" in table else table.iloc[:0]
    if usable.empty:
        raise OpModelDataError(
            f"op models of {gpu}: no usable sample (status ok) in its {len(chunks)} chunk "
            f"table(s) {chunks[0] if chunks else ''}...; measure them again or leave the "
            "configuration out of the op-space data"
        )
    cfg = TrainConfig(
        regressor=settings["regressor"],
        n_estimators=settings["n_estimators"],
        min_samples_leaf=settings["min_samples_leaf"],
        seed=settings["seed"],
    )

    def make() -> Any:
        return make_regressor(cfg, n_jobs=threads)

    model = opmodel.fit(table, gpu, make, twin=twin_table, peers=peer_table)
    metrics = op_scores.held_out_errors(
        table,
        gpu,
        make,
        twin=twin_table,
        peers=peer_table,
        fraction=settings["holdout_fraction"],
        seed=settings["seed"],
    )
    save_op_model(model, directory, sources=[*chunks, *twin, *peers], metrics=metrics)
    pooled = model.meta["pooled_samples"] - model.meta["samples"]
    lines = [
        f"op models of {gpu}: {model.meta['samples']} samples ({len(usable)} its own, "
        f"{len(chunks)} chunk tables{f', twin {len(twin)}' if twin else ''}"
        f"{f', and {pooled} only its peers measured ({len(peers)} tables)' if peers else ''}), "
        f"{len(model.families)} families, {settings['regressor']} "
        f"x{settings['n_estimators']}, {time.time() - started:.1f} s",
        f"held out ({metrics['held_out_fraction']:g} of the op ids): median |error| of "
        "GPU time / host time per call",
    ]
    carried = model.meta.get("carried_over", {})
    if carried:
        lines.insert(
            1,
            "GPU time carried over from the peers by the samples both measured "
            "(opcost.model.peer_transfer): "
            + ", ".join(
                f"{k.split('<-')[0]} x{c['median_ratio']:.3f} ({c['pairs']} pairs)"
                for k, c in carried.items()
            ),
        )
    scores = {**metrics["families"], **({"all": metrics["all"]} if "all" in metrics else {})}
    for family, s in scores.items():
        lines.append(
            f"  {family:12s} n={s['n']:5d}  gpu {s['gpu_time_median_abs_error_pct']:6.1f} %  "
            f"host {s['host_time_median_abs_error_pct']:6.1f} %"
        )
    power = metrics.get("busy_power")
    if power:
        lines.append("held out: busy power of the power windows, median |error| / MAPE")
        for family, s in {**power["families"], "all": power["all"]}.items():
            lines.append(
                f"  {family:12s} n={s['n']:5d}  {s['median_abs_error_pct']:6.1f} %  "
                f"{s['mape_pct']:6.1f} %"
            )
    write_atomic(log, "\n".join(lines) + "\n")
    return metrics


def train_op_models_job(
    wildcards: Any, input: Any, output: Any, params: Any, log: Any, threads: int
) -> None:
    """Entry point of rule ``train_op_models``: :func:`run_train_op_models`."""
    run_train_op_models(
        wildcards.gpu,
        list(input.chunks),
        list(input.twin),
        params.model,
        Path(output.manifest).parent,
        log[0],
        threads=threads,
        peers=list(input.peers),
    )
