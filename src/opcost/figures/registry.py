"""The figure registry: each figure's drawing, input files, options, variants and rule.

:data:`FIGURES` holds one :class:`FigureEntry` per figure. workflow/rules/figures.smk
makes one rule ``figure_<name>`` per entry (output ``results/figures/<stem>.{pdf,png}``,
report caption ``workflow/report/<name>.rst``), whose script calls :func:`render`;
:func:`figure_targets` is what ``rule all`` builds of them.

To add a figure: write its drawing function in the module of its chapter and add one
entry to :data:`FIGURES` (and its caption file).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from opcost import sweep_record
from opcost.config import Study
from opcost.figures.method import power_trace_figure, proportionality_figure, startup_figure
from opcost.figures.prediction import (
    prediction_errors_figure,
    prediction_networks_figure,
    prediction_op_types_figure,
    prediction_ops_figure,
)
from opcost.figures.style import FigureError, FigureStyle, save_figure
from opcost.figures.validation import (
    network_energy_figure,
    replay_figure,
    settings_figure,
    validation_figure,
)
from opcost.io import read_parquet

DATASET_VALIDATION = "results/validation/dataset_validation.parquet"
PREDICTION_OPS = "results/validation/prediction_ops.parquet"
PREDICTION_NETWORKS = "results/validation/prediction_networks.parquet"
REPLAY = "results/validation/replay.parquet"
#: The tables ``rule all`` builds besides the figures.
TABLES = (DATASET_VALIDATION, "results/validation/prediction_metrics.parquet")

#: Report categories (sections of the Snakemake report).
METHOD, DATASET, PREDICTION = "Measurement method", "Dataset validation", "Prediction accuracy"
#: Draws a figure from a rule's named input files, a style and the figure's options.
Draw = Callable[[Mapping[str, str], FigureStyle, Mapping[str, Any]], Figure]


def _always(study: Study) -> bool:
    return True


def _traced(study: Study) -> bool:
    """Whether the study has traces (a CUDA configuration): only then is there a replay."""
    return any(g.device == "cuda" for g in study.evaluated_gpus.values())


@dataclass(frozen=True)
class FigureEntry:
    """One figure and its rule.

    Attributes:
        name: the figure's name; its rule is ``figure_<name>``.
        draw: draws it from the rule's named input files.
        inputs: the rule's named input files, given the study.
        category: its section of the Snakemake report.
        variants: wildcard -> its values (one figure per value, e.g. ``size``: small,
            large); the output stem is ``<name>_{<wildcard>}``.
        options: option passed to ``draw`` -> the wildcard it takes its value from.
        in_all: whether ``rule all`` builds it (every variant) for a study.
    """

    name: str
    draw: Draw
    inputs: Callable[[Study], dict[str, str]]
    category: str
    variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)
    in_all: Callable[[Study], bool] = _always
    #: Whether it draws a run of the study's own GPU (a sweep): no rule without one.
    own_gpu: bool = False

    @property
    def stem(self) -> str:
        return self.name + "".join(f"_{{{wildcard}}}" for wildcard in self.variants)

    def output(self, ext: str) -> str:
        return f"results/figures/{self.stem}.{ext}"

    @property
    def log(self) -> str:
        return f"logs/figures/{self.stem}.log"

    @property
    def wildcard_constraints(self) -> dict[str, str]:
        return {wildcard: "|".join(values) for wildcard, values in self.variants.items()}

    def options_for(self, wildcards: Any) -> dict[str, str]:
        """The options of the job with these wildcards (a rule's ``params.options``)."""
        return {option: getattr(wildcards, w) for option, w in self.options.items()}

    def stems(self) -> list[str]:
        """Every variant's output stem (``validation_small``, ``validation_large``)."""
        names, values = list(self.variants), list(self.variants.values())
        return [
            self.stem.format(**dict(zip(names, combo, strict=True)))
            for combo in itertools.product(*values)
        ]


def _sweep_files(**files: str) -> Callable[[Study], dict[str, str]]:
    """Files of the sweep's GPU configuration, ``results/sweep/{gpu}/<file>``."""

    def inputs(study: Study) -> dict[str, str]:
        cfg = sweep_record.SweepConfig.from_config(study.config.get("sweep"))
        gpu = sweep_record.sweep_gpu(study, cfg)
        return {key: f"results/sweep/{gpu}/{name}" for key, name in files.items()}

    return inputs


def _never(study: Study) -> bool:
    # The sweep figures need a GPU run of their own (docs/sweep.md).
    return False


def _several_settings(study: Study) -> bool:
    return any(len(g.settings) > 1 for g in study.evaluated_gpus.values())


def _on_trace(
    name: str, figure: Callable[[sweep_record.PowerTrace, FigureStyle], Figure]
) -> FigureEntry:
    """A figure of the power-trace sweep (not in ``rule all``: it needs a GPU run)."""
    files = _sweep_files(csv="power_trace.csv", record="power_trace.json")
    return FigureEntry(
        name,
        lambda i, s, o: figure(sweep_record.read_power_trace(i["csv"], i["record"]), s),
        files,
        METHOD,
        in_all=_never,
        own_gpu=True,
    )


def _on_table(
    name: str,
    figure: Callable[[pd.DataFrame, FigureStyle], Figure],
    key: str,
    path: str,
    category: str,
    **kwargs: Any,
) -> FigureEntry:
    """A figure of one table: input ``key`` is the file ``path``."""
    return FigureEntry(
        name,
        lambda i, s, o: figure(read_parquet(i[key]), s),
        lambda study: {key: path},
        category,
        **kwargs,
    )


FIGURES: tuple[FigureEntry, ...] = (
    FigureEntry(
        "proportionality",
        lambda i, s, o: proportionality_figure(
            sweep_record.read_record(i["record"], "proportionality"), s
        ),
        _sweep_files(record="proportionality.json"),
        METHOD,
        in_all=_never,
        own_gpu=True,
    ),
    _on_trace("power_trace", power_trace_figure),
    _on_trace("startup_effect", startup_figure),
    FigureEntry(
        "validation",
        lambda i, s, o: validation_figure(read_parquet(i["validation"]), o["size_class"], s),
        lambda study: {"validation": DATASET_VALIDATION},
        DATASET,
        variants={"size": ("small", "large")},
        options={"size_class": "size"},
    ),
    _on_table("network_energy", network_energy_figure, "validation", DATASET_VALIDATION, DATASET),
    _on_table(
        "settings",
        settings_figure,
        "validation",
        DATASET_VALIDATION,
        DATASET,
        in_all=_several_settings,
    ),
    _on_table("replay", replay_figure, "replay", REPLAY, DATASET, in_all=_traced),
    _on_table("prediction_ops", prediction_ops_figure, "ops", PREDICTION_OPS, PREDICTION),
    _on_table("prediction_errors", prediction_errors_figure, "ops", PREDICTION_OPS, PREDICTION),
    _on_table("prediction_op_types", prediction_op_types_figure, "ops", PREDICTION_OPS, PREDICTION),
    _on_table(
        "prediction_networks",
        prediction_networks_figure,
        "networks",
        PREDICTION_NETWORKS,
        PREDICTION,
    ),
)


def study_figures(study: Study) -> list[FigureEntry]:
    """The figures a study has rules for: all but the sweeps' where it profiles no GPU
    configuration of its own (it only includes measurements)."""
    return [entry for entry in FIGURES if study.gpus or not entry.own_gpu]


def figure_entry(name: str) -> FigureEntry:
    """The entry named ``name``.

    Raises:
        FigureError: no figure of that name.
    """
    for entry in FIGURES:
        if entry.name == name:
            return entry
    known = ", ".join(e.name for e in FIGURES)
    raise FigureError(f"unknown figure {name!r}; known: {known}")


def render(
    name: str,
    inputs: Mapping[str, str],
    pdf_path: str | Path,
    png_path: str | Path,
    style: FigureStyle | None = None,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Draw figure ``name`` from its input files and write it as PDF and PNG.

    Args:
        name: a figure of :data:`FIGURES`.
        inputs: the rule's named input files (the entry's ``inputs``).
        pdf_path, png_path: where to write.
        style: resolution and font size (default: the config schema's).
        options: figure options (``size_class`` for ``validation``).

    Raises:
        FigureError: unknown figure name or a missing input or option.
    """
    draw = figure_entry(name).draw
    style = style or FigureStyle()
    try:
        fig = draw(inputs, style, options or {})
    except KeyError as e:
        raise FigureError(f"figure {name!r} needs the input or option {e}") from e
    save_figure(fig, pdf_path, png_path, style)


def figure_targets(study: Study) -> list[str]:
    """The tables and figures of a study's ``rule all`` (figures as PDF and PNG).

    The settings figure only where a GPU configuration has more than one setting; the
    method figures not at all: they need a GPU run of their own (docs/sweep.md).
    """
    stems = [stem for entry in FIGURES if entry.in_all(study) for stem in entry.stems()]
    return [*TABLES, *(f"results/figures/{stem}.{ext}" for stem in stems for ext in ("pdf", "png"))]
