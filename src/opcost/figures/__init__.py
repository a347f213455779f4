"""The thesis's figures, drawn from the pipeline's tables and the sweep records.

One module per chapter draws its figures (:mod:`~opcost.figures.method`: 3.2.3 and 3.3,
:mod:`~opcost.figures.validation`: 5.1, :mod:`~opcost.figures.prediction`: 5.2); every
figure function takes data and a :class:`FigureStyle` and returns a
:class:`matplotlib.figure.Figure`. :mod:`~opcost.figures.registry` lists the figures, with
the files each reads, and :func:`render` draws one from its files as PDF and PNG:

    render("network_energy", {"validation": "dataset_validation.parquet"},
           "network_energy.pdf", "network_energy.png", style_from_config(config))

Torch-free: drawing never imports the measuring code.
"""

from opcost.figures.method import (
    channel,
    power_trace_figure,
    proportionality_figure,
    startup_figure,
)
from opcost.figures.prediction import (
    opspace_op_types_figure,
    prediction_errors_figure,
    prediction_networks_figure,
    prediction_op_types_figure,
    prediction_ops_figure,
)
from opcost.figures.registry import (
    FIGURES,
    FigureEntry,
    figure_entry,
    figure_targets,
    render,
    study_figures,
)
from opcost.figures.style import (
    FigureError,
    FigureStyle,
    reference_settings,
    save_figure,
    style_from_config,
    unit_scale,
)
from opcost.figures.validation import network_energy_figure, settings_figure, validation_figure

FIGURE_NAMES: tuple[str, ...] = tuple(entry.name for entry in FIGURES)

__all__ = [
    "FIGURES",
    "FIGURE_NAMES",
    "FigureEntry",
    "FigureError",
    "FigureStyle",
    "channel",
    "figure_entry",
    "figure_targets",
    "network_energy_figure",
    "opspace_op_types_figure",
    "power_trace_figure",
    "prediction_errors_figure",
    "prediction_networks_figure",
    "prediction_op_types_figure",
    "prediction_ops_figure",
    "proportionality_figure",
    "reference_settings",
    "render",
    "save_figure",
    "settings_figure",
    "startup_figure",
    "study_figures",
    "style_from_config",
    "unit_scale",
    "validation_figure",
]
