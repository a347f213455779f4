"""What every figure shares: the style, saving, units, notes and panel helpers.

:class:`FigureStyle` is the config's ``figures`` section (:func:`style_from_config`; its
defaults are the config schema's); :func:`save_figure` writes a figure as PDF and PNG.
Figures are built without ``pyplot``: no global state, no GUI backend.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from opcost.config import schema_defaults
from opcost.errors import OpcostError
from opcost.names import parse_setting

MODES = ("inference", "training")
MODE_STYLE = {"inference": "-", "training": "--"}
NO_POWER = "no power data (CPU: time only)"
#: Units by the power of ten they stand for, largest first.
_PREFIXES = ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
QUANTITY_LABEL = {"time": "time per iteration", "energy": "energy per iteration", "power": "power"}
QUANTITY_UNIT = {"time": "s", "energy": "J", "power": "W"}
COLORS = {
    "measured": "#4d4d4d",
    "all": "#1f77b4",
    "module": "#9ecae1",
    "predicted": "#ff7f0e",
}


class FigureError(OpcostError, ValueError):
    """A figure cannot be drawn from its inputs; the message says which and why."""


@dataclass(frozen=True)
class FigureStyle:
    """Style of every figure (config ``figures``): PNG resolution and base font size.

    Fields left out take the config schema's defaults.
    """

    dpi: int = field(default_factory=lambda: int(schema_defaults("figures")["dpi"]))
    font_size: float = field(default_factory=lambda: float(schema_defaults("figures")["font_size"]))

    def rc(self) -> dict[str, Any]:
        """Matplotlib settings applied while a figure is drawn and saved."""
        return {
            "font.size": self.font_size,
            "axes.titlesize": self.font_size,
            "axes.labelsize": self.font_size,
            "legend.fontsize": self.font_size * 0.85,
            "xtick.labelsize": self.font_size * 0.85,
            "ytick.labelsize": self.font_size * 0.85,
            "figure.titlesize": self.font_size * 1.1,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "pdf.fonttype": 42,  # TrueType in the PDF: text stays editable and searchable
        }


def style_from_config(config: Mapping[str, Any]) -> FigureStyle:
    """The figure style of a config's ``figures`` section (schema defaults where absent)."""
    section = config.get("figures") or {}
    default = FigureStyle()
    return FigureStyle(
        dpi=int(section.get("dpi", default.dpi)),
        font_size=float(section.get("font_size", default.font_size)),
    )


def save_figure(
    fig: Figure, pdf_path: str | Path, png_path: str | Path, style: FigureStyle
) -> None:
    """Write ``fig`` as PDF and PNG (at ``style.dpi``), creating their folders.

    The PDF carries no creation date, so an unchanged figure gives an identical file.
    """
    for path in (pdf_path, png_path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with mpl.rc_context(style.rc()):
        fig.savefig(pdf_path, format="pdf", metadata={"CreationDate": None})
        fig.savefig(png_path, format="png", dpi=style.dpi)


def unit_scale(values: Iterable[float], base_unit: str) -> tuple[float, str]:
    """A factor and unit that print ``values`` (in ``base_unit``) with 1 to 3 leading digits.

    >>> unit_scale([0.0021, 0.0135], "s")
    (1000.0, 'ms')
    """
    finite = [abs(v) for v in values if v is not None and np.isfinite(v) and v != 0]
    if not finite:
        return 1.0, base_unit
    top = float(f"{max(finite):.3g}")  # 0.9999e-3 s prints as 1 ms, not 1e+03 µs
    for size, prefix in _PREFIXES:
        if top >= size:
            return 1 / size, prefix + base_unit
    return 1 / _PREFIXES[-1][0], _PREFIXES[-1][1] + base_unit


def note(ax: Any, text: str) -> None:
    """Replace a panel's content by a message (no data, CPU, nothing to compare)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def message_figure(title: str, text: str, style: FigureStyle) -> Figure:
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(6.4, 2.4), layout="constrained")
        ax = fig.subplots()
        note(ax, text)
        ax.set_title(title)
    return fig


def tick_label(model_input: str) -> str:
    """``resnet18_4x3x64x64`` -> ``resnet18`` over ``4x3x64x64``."""
    model, _, shape = model_input.rpartition("_")
    return f"{model}\n{shape}" if model else model_input


#: Above this many networks on one axis their labels stand upright, in a smaller font.
UPRIGHT_LABELS_ABOVE = 12


def network_ticks(ax: Any, x: Iterable[float], labels: list[str]) -> None:
    """Label the bars of ``x`` with ``labels``, upright where there are many."""
    ax.set_xticks(list(x), labels)
    if len(labels) > UPRIGHT_LABELS_ABOVE:
        ax.tick_params(axis="x", labelrotation=90, labelsize="x-small")


def setting_order(setting: str) -> tuple[int, int, str]:
    try:
        parsed = parse_setting(setting)
    except ValueError:
        return (3, 0, setting)
    rank = {"default": 0, "sm": 1, "pl": 2}[parsed.kind]
    return (rank, parsed.value or 0, setting)


def reference_settings(table: pd.DataFrame) -> dict[str, str]:
    """Each GPU configuration's reference setting: ``default``, else the first by name."""
    out = {}
    for gpu, settings in table.groupby("gpu")["setting"]:
        names = set(settings)
        out[gpu] = "default" if "default" in names else sorted(names)[0]
    return out


def at_reference(table: pd.DataFrame) -> pd.DataFrame:
    ref = reference_settings(table)
    return table[table["setting"] == table["gpu"].map(ref)]


def panel_title(gpu: str, mode: str, setting: str) -> str:
    title = f"{gpu}, {mode}"
    if setting != "default":
        title += f", setting {setting}"
    return title


def label_above(ax: Any, xs: Iterable[float], tops: Iterable[float], rel: Iterable[float]) -> None:
    """Write each relative difference (``+50%``) above its bar and error bar."""
    for x, top, value in zip(xs, tops, rel, strict=True):
        if np.isfinite(value) and np.isfinite(top):
            ax.annotate(
                f"{value:+.0%}",
                (x, top),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                rotation=90,
                fontsize="x-small",
            )


def errorbar_kw() -> dict[str, Any]:
    return {"capsize": 3, "error_kw": {"elinewidth": 1, "ecolor": "black"}}


def has_values(values: pd.Series) -> bool:
    return bool(np.isfinite(values.to_numpy(dtype=float)).any())


def _date(unix_s: float) -> str:
    if unix_s is None or not np.isfinite(unix_s):
        return "date unknown"
    return datetime.fromtimestamp(float(unix_s), UTC).strftime("%Y-%m-%d")


def provenance(table: pd.DataFrame) -> str:
    """``NVIDIA H100 80GB HBM3, 2026-11-22`` for a figure's subtitle (where recorded)."""
    parts = []
    if "gpu_name" in table.columns:
        names = sorted({n for n in table["gpu_name"] if isinstance(n, str)})
        parts += names
    if "measured_at_unix_s" in table.columns and has_values(table["measured_at_unix_s"]):
        days = sorted({_date(t) for t in table["measured_at_unix_s"] if np.isfinite(t)})
        parts.append(days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}")
    return ", ".join(parts)


def network_order(table: pd.DataFrame, column: str) -> list[str]:
    """Model-input sets by their mean ``column`` over the table (same order in every panel)."""
    return list(table.groupby("model_input")[column].mean().sort_values().index)


def plain_log_ticks(axis: Any) -> None:
    """Log-axis ticks as plain numbers (20, 0.3), not powers of ten (2 × 10^1).

    Of the minor ticks only the 2s and 5s (20, 50, 200, ...) are labelled, and only on axes
    spanning at most 2.5 decades, so that labels never run into each other.
    """

    def minor(value: float, _: Any) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if value <= 0 or lo <= 0 or math.log10(hi / lo) > 2.5:
            return ""  # wide axes: the powers of ten suffice
        mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
        return f"{value:g}" if round(mantissa, 6) in (2.0, 5.0) else ""

    axis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(mpl.ticker.FuncFormatter(minor))


def time_energy_grid(
    part: pd.DataFrame, inches_per_network: float
) -> tuple[Figure, Any, pd.DataFrame]:
    """A figure of one row per GPU configuration and mode, time left and energy right.

    Returns the figure, its axes (rows x 2) and the rows' (gpu, mode, setting). Call it
    inside the style's ``rc_context``.
    """
    panels = part[["gpu", "mode", "setting"]].drop_duplicates().sort_values(["gpu", "mode"])
    n_nets = part["model_input"].nunique()
    fig = Figure(
        figsize=(max(6.4, 2 * (1.0 + inches_per_network * n_nets)), 0.9 + 2.6 * len(panels)),
        layout="constrained",
    )
    return fig, fig.subplots(len(panels), 2, squeeze=False), panels
