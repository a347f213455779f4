"""The thesis's figures, drawn from the pipeline's tables (chapters 3.2.3, 3.3 and 5).

Every figure function takes data (tables, records) and a :class:`FigureStyle` and returns
a :class:`matplotlib.figure.Figure`; :func:`render` reads a rule's input files, draws the
named figure and writes it as PDF (thesis) and PNG (screens). Figures are built without
``pyplot``, so no global state or GUI backend is involved.

Figures (name: what; inputs):

==================== ====================================================== ================
name                 what                                                   input files
==================== ====================================================== ================
proportionality      iterations against total runtime, the fit through the  ``record``
                     origin and where proportionality breaks (figure 3.1)
power_trace          power over alternating idle and benchmark runs (3.3)   ``csv``, ``record``
startup_effect       back-to-back runs overlaid, with each run's 3σ channel ``csv``, ``record``
validation           measured against summed time and energy per network,   ``validation``
                     one row per GPU configuration and mode (tables I, II);
                     option ``size_class``: ``small`` or ``large``
network_energy       energy of whole networks across GPU configurations     ``validation``
                     (figures 5.1, 5.2)
settings             time and energy against GPU setting, per network       ``validation``
prediction_ops       predicted against measured time, power and energy of   ``ops``
                     held-out operations, with the identity line
prediction_errors    distribution of the relative prediction error          ``ops``
prediction_op_types  absolute percentage error by operation type            ``ops``
prediction_networks  predicted (summed) against measured whole networks,    ``networks``
                     leave-one-network-out (figures 5.3-5.11)
==================== ====================================================== ================

Where a GPU configuration has several GPU settings, the validation, energy and network
prediction figures show its *reference setting*: ``default`` if it was measured, else the
first in name order; the ``settings`` figure shows them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from opcost import sweep
from opcost.config import Study
from opcost.errors import OpcostError
from opcost.names import parse_setting
from opcost.tables import read_parquet

MODES = ("inference", "training")
_MODE_STYLE = {"inference": "-", "training": "--"}
_NO_POWER = "no power data (CPU: time only)"
#: Units by the power of ten they stand for, largest first.
_PREFIXES = ((1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
_QUANTITY_LABEL = {"time": "time per iteration", "energy": "energy per iteration", "power": "power"}
_QUANTITY_UNIT = {"time": "s", "energy": "J", "power": "W"}
_COLORS = {
    "measured": "#4d4d4d",
    "all": "#1f77b4",
    "module": "#9ecae1",
    "predicted": "#ff7f0e",
}


class FigureError(OpcostError, ValueError):
    """A figure cannot be drawn from its inputs; the message says which and why."""


@dataclass(frozen=True)
class FigureStyle:
    """Style of every figure (config ``figures``): PNG resolution and base font size."""

    dpi: int = 150
    font_size: float = 10.0

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


# --- helpers -------------------------------------------------------------------------


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


def _note(ax: Any, text: str) -> None:
    """Replace a panel's content by a message (no data, CPU, nothing to compare)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def _message_figure(title: str, text: str, style: FigureStyle) -> Figure:
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(6.4, 2.4), layout="constrained")
        ax = fig.subplots()
        _note(ax, text)
        ax.set_title(title)
    return fig


def _tick_label(model_input: str) -> str:
    """``resnet18_4x3x64x64`` -> ``resnet18`` over ``4x3x64x64``."""
    model, _, shape = model_input.rpartition("_")
    return f"{model}\n{shape}" if model else model_input


def _setting_order(setting: str) -> tuple[int, int, str]:
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


def _at_reference(table: pd.DataFrame) -> pd.DataFrame:
    ref = reference_settings(table)
    return table[table["setting"] == table["gpu"].map(ref)]


def _panel_title(gpu: str, mode: str, setting: str) -> str:
    title = f"{gpu}, {mode}"
    if setting != "default":
        title += f", setting {setting}"
    return title


def _label_above(ax: Any, xs: Iterable[float], tops: Iterable[float], rel: Iterable[float]) -> None:
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


def _errorbar_kw() -> dict[str, Any]:
    return {"capsize": 3, "error_kw": {"elinewidth": 1, "ecolor": "black"}}


def _has(values: pd.Series) -> bool:
    return bool(np.isfinite(values.to_numpy(dtype=float)).any())


def _date(unix_s: float) -> str:
    if unix_s is None or not np.isfinite(unix_s):
        return "date unknown"
    return datetime.fromtimestamp(float(unix_s), UTC).strftime("%Y-%m-%d")


def _provenance(table: pd.DataFrame) -> str:
    """``NVIDIA H100 80GB HBM3, 2026-11-22`` for a figure's subtitle (where recorded)."""
    parts = []
    if "gpu_name" in table.columns:
        names = sorted({n for n in table["gpu_name"] if isinstance(n, str)})
        parts += names
    if "measured_at_unix_s" in table.columns and _has(table["measured_at_unix_s"]):
        days = sorted({_date(t) for t in table["measured_at_unix_s"] if np.isfinite(t)})
        parts.append(days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}")
    return ", ".join(parts)


# --- dataset validation (thesis 5.1) ------------------------------------------------


def validation_figure(
    table: pd.DataFrame, size_class: str, style: FigureStyle = FigureStyle()
) -> Figure:
    """Measured against summed time and energy per iteration (thesis tables I and II).

    One row of panels per GPU configuration and mode (at its reference setting), time on
    the left, energy on the right. Per model-input set of the size class: the measured
    network (error bar: its σ), the sum over all operations and the sum over module
    operations only (error bars: σ_S propagated as in :mod:`opcost.validate`). The label
    over each sum is its relative difference to the measurement.
    """
    if size_class not in ("small", "large"):
        raise FigureError(f"size_class must be 'small' or 'large', not {size_class!r}")
    title = f"Summed operations against measured networks: {size_class} model-input sets"
    part = _at_reference(table)
    part = part[part["size_class"] == size_class]
    if part.empty:
        return _message_figure(title, f"no {size_class} model-input sets in this study", style)
    with mpl.rc_context(style.rc()):
        fig, axes, panels = _time_energy_grid(part, inches_per_network=0.9)
        for r, (gpu, mode, setting) in enumerate(panels.itertuples(index=False)):
            rows = part[(part["gpu"] == gpu) & (part["mode"] == mode)]
            order = _network_order(part[part["gpu"] == gpu], "time_measured_s")
            for c, quantity in enumerate(("time", "energy")):
                _validation_panel(axes[r][c], rows, quantity, order)
                axes[r][c].set_title(_panel_title(gpu, mode, setting))
        handles = [
            Patch(color=_COLORS["measured"], label="measured network"),
            Patch(color=_COLORS["all"], label="sum of all operations"),
            Patch(color=_COLORS["module"], label="sum of module operations only"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        subtitle = _provenance(part)
        fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""))
    return fig


def _network_order(table: pd.DataFrame, column: str) -> list[str]:
    """Model-input sets by their mean ``column`` over the table (same order in every panel)."""
    return list(table.groupby("model_input")[column].mean().sort_values().index)


def _plain_log_ticks(axis: Any) -> None:
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


def _time_energy_grid(
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


def _validation_panel(ax: Any, rows: pd.DataFrame, quantity: str, order: list[str]) -> None:
    unit_key = "s" if quantity == "time" else "j"
    measured_col = f"{quantity}_measured_{unit_key}"
    all_rows = rows[rows["ops_included"] == "all"]
    nets = [n for n in order if n in set(all_rows["model_input"])]
    by = {
        inc: rows[rows["ops_included"] == inc].set_index("model_input").reindex(nets)
        for inc in ("all", "module")
    }
    measured = all_rows.set_index("model_input")[measured_col].reindex(nets)
    if quantity == "energy" and not (_has(measured) or _has(by["all"][f"energy_sum_{unit_key}"])):
        _note(ax, _NO_POWER)
        return
    values = [*measured, *by["all"][f"{quantity}_sum_{unit_key}"]]
    factor, unit = unit_scale(values, _QUANTITY_UNIT[quantity])
    x = np.arange(len(nets))
    width = 0.27
    sigma_measured = all_rows.set_index("model_input")[f"sigma_{measured_col}"].reindex(nets)
    ax.bar(
        x - width,
        measured * factor,
        width,
        yerr=sigma_measured * factor,
        color=_COLORS["measured"],
        **_errorbar_kw(),
    )
    for offset, inc in ((0.0, "all"), (width, "module")):
        sums = by[inc][f"{quantity}_sum_{unit_key}"]
        ax.bar(
            x + offset,
            sums * factor,
            width,
            yerr=by[inc][f"sigma_{quantity}_sum_{unit_key}"] * factor,
            color=_COLORS[inc],
            **_errorbar_kw(),
        )
        sigma = by[inc][f"sigma_{quantity}_sum_{unit_key}"].fillna(0)
        _label_above(ax, x + offset, (sums + sigma) * factor, by[inc][f"{quantity}_rel_diff"])
    ax.set_xticks(x, [_tick_label(n) for n in nets])
    ax.set_ylabel(f"{_QUANTITY_LABEL[quantity]} [{unit}]")
    ax.margins(y=0.25)


def network_energy_figure(table: pd.DataFrame, style: FigureStyle = FigureStyle()) -> Figure:
    """Energy per iteration of whole networks across GPU configurations (figures 5.1, 5.2).

    Rows: modes; columns: small and large model-input sets; bars: GPU configurations (at
    their reference settings), error bars the measured σ.
    """
    title = "Energy of whole networks across GPU configurations"
    part = _at_reference(table)
    part = part[(part["ops_included"] == "all") & part["network_measured"]]
    if part.empty:
        return _message_figure(title, "no whole-network measurements", style)
    if not _has(part["energy_measured_j"]):
        return _message_figure(title, _NO_POWER, style)
    modes = [m for m in MODES if m in set(part["mode"])]
    sizes = [s for s in ("small", "large") if s in set(part["size_class"])]
    gpus = sorted(part["gpu"].unique())
    colors = mpl.colormaps["tab10"]
    with mpl.rc_context(style.rc()):
        n_nets = max(part[part["size_class"] == s]["model_input"].nunique() for s in sizes)
        fig = Figure(
            figsize=(
                max(6.4, len(sizes) * (1.2 + 0.5 * n_nets * max(1, len(gpus)) / 2)),
                0.9 + 2.6 * len(modes),
            ),
            layout="constrained",
        )
        axes = fig.subplots(len(modes), len(sizes), squeeze=False)
        for r, mode in enumerate(modes):
            for c, size in enumerate(sizes):
                ax = axes[r][c]
                rows = part[(part["mode"] == mode) & (part["size_class"] == size)]
                nets = _network_order(part[part["size_class"] == size], "time_measured_s")
                factor, unit = unit_scale(rows["energy_measured_j"], "J")
                width = 0.8 / len(gpus)
                x = np.arange(len(nets))
                for k, gpu in enumerate(gpus):
                    g = rows[rows["gpu"] == gpu].set_index("model_input").reindex(nets)
                    ax.bar(
                        x + (k - (len(gpus) - 1) / 2) * width,
                        g["energy_measured_j"] * factor,
                        width,
                        yerr=g["sigma_energy_measured_j"] * factor,
                        color=colors(k % 10),
                        **_errorbar_kw(),
                    )
                ax.set_xticks(x, [_tick_label(n) for n in nets])
                ax.set_ylabel(f"energy per iteration [{unit}]")
                ax.set_title(f"{mode}, {size} model-input sets")
        handles = [
            Patch(color=colors(k % 10), label=_gpu_label(part, g)) for k, g in enumerate(gpus)
        ]
        fig.legend(
            handles=handles, loc="outside lower center", ncols=min(4, len(gpus)), frameon=False
        )
        subtitle = _provenance(part)
        fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""))
    return fig


def _gpu_label(table: pd.DataFrame, gpu: str) -> str:
    rows = table[table["gpu"] == gpu]
    ref = reference_settings(rows).get(gpu, "default")
    return gpu if ref == "default" else f"{gpu} ({ref})"


def settings_figure(table: pd.DataFrame, style: FigureStyle = FigureStyle()) -> Figure:
    """Time and energy per iteration against GPU setting, one line per network and mode.

    One row of panels per GPU configuration with more than one setting; settings ordered
    ``default``, locked SM clocks ascending, power limits ascending, each labelled with the
    SM clock measured during its network runs. Log scale: networks differ by orders of
    magnitude.
    """
    title = "Time and energy against GPU setting"
    part = table[(table["ops_included"] == "all") & table["network_measured"]]
    counts = part.groupby("gpu")["setting"].nunique()
    gpus = sorted(counts[counts > 1].index)
    if not gpus:
        return _message_figure(
            title,
            "every GPU configuration of this study has one GPU setting: nothing to compare.\n"
            "Add settings such as sm1410 or pl300 (config: gpus.<name>.settings).",
            style,
        )
    nets = sorted(part["model_input"].unique())
    colors = mpl.colormaps["tab10"]
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(9.0, 0.9 + 3.0 * len(gpus)), layout="constrained")
        axes = fig.subplots(len(gpus), 2, squeeze=False)
        for r, gpu in enumerate(gpus):
            rows = part[part["gpu"] == gpu]
            settings = sorted(rows["setting"].unique(), key=_setting_order)
            clocks = rows.groupby("setting")["sm_clock_mhz"].mean()
            labels = [
                f"{s}\n{clocks[s]:.0f} MHz" if np.isfinite(clocks.get(s, np.nan)) else s
                for s in settings
            ]
            x = {s: i for i, s in enumerate(settings)}
            for c, (quantity, column) in enumerate(
                (("time", "time_measured_s"), ("energy", "energy_measured_j"))
            ):
                ax = axes[r][c]
                if not _has(rows[column]):
                    _note(ax, _NO_POWER)
                    continue
                factor, unit = unit_scale(rows[column], _QUANTITY_UNIT[quantity])
                for k, net in enumerate(nets):
                    for mode in MODES:
                        line = rows[(rows["model_input"] == net) & (rows["mode"] == mode)]
                        line = line.sort_values("setting", key=lambda s: s.map(_setting_order))
                        if line.empty:
                            continue
                        ax.plot(
                            line["setting"].map(x),
                            line[column] * factor,
                            _MODE_STYLE[mode],
                            marker="o",
                            color=colors(k % 10),
                        )
                ax.set_yscale("log")
                _plain_log_ticks(ax.yaxis)
                ax.set_xticks(range(len(settings)), labels)
                ax.set_xlabel("GPU setting (measured SM clock)")
                ax.set_ylabel(f"{_QUANTITY_LABEL[quantity]} [{unit}]")
                ax.set_title(gpu)
        handles = [
            Line2D([], [], color=colors(k % 10), marker="o", label=n) for k, n in enumerate(nets)
        ]
        handles += [Line2D([], [], color="black", linestyle=_MODE_STYLE[m], label=m) for m in MODES]
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
        fig.suptitle(title)
    return fig


# --- prediction accuracy (thesis 5.2) ------------------------------------------------


def _op_colors(names: Iterable[str]) -> dict[str, Any]:
    cmap = mpl.colormaps["tab20"]
    return {name: cmap(i % 20) for i, name in enumerate(sorted(set(names)))}


def _identity(ax: Any, values: np.ndarray, log: bool) -> None:
    finite = values[np.isfinite(values) & ((values > 0) if log else True)]
    if not finite.size:
        return
    lo, hi = finite.min(), finite.max()
    if log:
        lo, hi = lo / 1.5, hi * 1.5
    else:
        pad = 0.05 * (hi - lo or hi or 1)
        lo, hi = lo - pad, hi + pad
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="prediction = measurement")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


def prediction_ops_figure(ops: pd.DataFrame, style: FigureStyle = FigureStyle()) -> Figure:
    """Predicted against measured time, power and energy of held-out operations.

    One row per GPU configuration and mode, one column per quantity; points coloured by
    operation type; the black line is prediction = measurement. Time and energy on log
    axes. Each panel names its mean absolute percentage error (MAPE) and n.
    """
    title = "Operation level: predicted against measured (held-out operations)"
    if ops.empty:
        return _message_figure(title, "no held-out predictions", style)
    panels = ops[["gpu", "mode"]].drop_duplicates().sort_values(["gpu", "mode"])
    colors = _op_colors(ops["op_name"])
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(11.0, 0.9 + 3.1 * len(panels)), layout="constrained")
        axes = fig.subplots(len(panels), 3, squeeze=False)
        for r, (gpu, mode) in enumerate(panels.itertuples(index=False)):
            rows = ops[(ops["gpu"] == gpu) & (ops["mode"] == mode)]
            for c, quantity in enumerate(("time", "power", "energy")):
                _scatter_panel(axes[r][c], rows, quantity, colors)
                axes[r][c].set_title(f"{gpu}, {mode}: {quantity}")
        handles = [
            Line2D([], [], marker="o", linestyle="", color=col, label=name)
            for name, col in colors.items()
        ]
        handles.append(Line2D([], [], color="black", label="prediction = measurement"))
        fig.legend(
            handles=handles, loc="outside right upper", frameon=False, title="operation type"
        )
        fig.suptitle(title)
    return fig


def _scatter_panel(ax: Any, rows: pd.DataFrame, quantity: str, colors: Mapping[str, Any]) -> None:
    measured_col, pred_col = {
        "time": ("time_s", "time_pred_s"),
        "power": ("power_w", "power_pred_w"),
        "energy": ("energy_j", "energy_pred_j"),
    }[quantity]
    measured = rows[measured_col].to_numpy(dtype=float)
    pred = rows[pred_col].to_numpy(dtype=float)
    ok = np.isfinite(measured) & np.isfinite(pred)
    if not ok.any():
        _note(ax, _NO_POWER if quantity != "time" else "no predictions")
        return
    log = quantity != "power"
    factor, unit = unit_scale(measured[ok], _QUANTITY_UNIT[quantity]) if log else (1.0, "W")
    for name, group in rows[ok].groupby("op_name"):
        ax.scatter(
            group[measured_col] * factor,
            group[pred_col] * factor,
            s=14,
            color=colors[name],
            alpha=0.85,
            linewidths=0,
        )
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis)
        _plain_log_ticks(ax.yaxis)
    _identity(ax, np.concatenate([measured[ok], pred[ok]]) * factor, log)
    ape = np.abs(pred[ok] / measured[ok] - 1) * 100
    ax.text(
        0.03,
        0.97,
        f"MAPE {np.mean(ape):.1f}%\nn = {ok.sum()}",
        transform=ax.transAxes,
        va="top",
        fontsize="small",
    )
    label = _QUANTITY_LABEL[quantity]
    ax.set_xlabel(f"measured {label} [{unit}]")
    ax.set_ylabel(f"predicted {label} [{unit}]")


def prediction_errors_figure(ops: pd.DataFrame, style: FigureStyle = FigureStyle()) -> Figure:
    """Distribution of the relative error (predicted / measured - 1) of held-out operations.

    One row per GPU configuration, one column per quantity, one histogram per mode (30
    bins over the panel's errors). Errors beyond -100 % and +200 % are counted in the
    outermost bins.
    """
    title = "Operation level: distribution of the relative prediction error"
    if ops.empty:
        return _message_figure(title, "no held-out predictions", style)
    gpus = sorted(ops["gpu"].unique())
    mode_colors = {"inference": "C0", "training": "C1"}
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(11.0, 1.2 + 2.8 * len(gpus)), layout="constrained")
        axes = fig.subplots(len(gpus), 3, squeeze=False)
        for r, gpu in enumerate(gpus):
            rows = ops[ops["gpu"] == gpu]
            for c, quantity in enumerate(("time", "power", "energy")):
                ax = axes[r][c]
                column = f"{quantity}_rel_err"
                if column not in rows or not _has(rows[column]):
                    _note(ax, _NO_POWER if quantity != "time" else "no predictions")
                    continue
                err_all = np.clip(rows[column].dropna().to_numpy() * 100, -100, 200)
                lo, hi = min(err_all.min(), 0.0), max(err_all.max(), 0.0)
                bins = np.linspace(lo, hi + 1e-9, 31)
                medians = []
                for mode in MODES:
                    err = rows.loc[rows["mode"] == mode, column].dropna().to_numpy() * 100
                    if not err.size:
                        continue
                    ax.hist(
                        np.clip(err, -100, 200),
                        bins=bins,
                        histtype="step",
                        linewidth=1.5,
                        linestyle=_MODE_STYLE[mode],
                        color=mode_colors[mode],
                    )
                    medians.append(f"{mode}: {np.median(np.abs(err)):.1f}% (n = {err.size})")
                ax.axvline(0, color="black", linewidth=0.8)
                ax.text(
                    0.98,
                    0.97,
                    "median |error|\n" + "\n".join(medians),
                    transform=ax.transAxes,
                    ha="right",
                    va="top",
                    fontsize="x-small",
                )
                ax.yaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
                ax.margins(y=0.35)
                ax.set_xlabel(f"relative error of {quantity} [%]")
                ax.set_ylabel("operations")
                ax.set_title(f"{gpu}: {quantity}")
        handles = [
            Line2D([], [], color=mode_colors[m], linestyle=_MODE_STYLE[m], label=m) for m in MODES
        ]
        handles.append(Line2D([], [], color="black", linewidth=0.8, label="no error"))
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        fig.suptitle(title)
    return fig


def prediction_op_types_figure(ops: pd.DataFrame, style: FigureStyle = FigureStyle()) -> Figure:
    """Absolute percentage error of held-out operations by operation type and mode.

    One row per GPU configuration, one column per quantity; a box per operation type and
    mode (median, quartiles, whiskers at 1.5 IQR) with every operation as a dot, log
    scale. The number after a type is its count of held-out operations.
    """
    title = "Operation level: prediction error by operation type"
    if ops.empty:
        return _message_figure(title, "no held-out predictions", style)
    gpus = sorted(ops["gpu"].unique())
    names = sorted(ops["op_name"].unique())
    mode_colors = {"inference": "#1f77b4", "training": "#ff7f0e"}
    with mpl.rc_context(style.rc()):
        fig = Figure(
            figsize=(11.0, 1.0 + (0.8 + 0.32 * len(names)) * len(gpus)), layout="constrained"
        )
        axes = fig.subplots(len(gpus), 3, squeeze=False)
        for r, gpu in enumerate(gpus):
            rows = ops[ops["gpu"] == gpu]
            for c, quantity in enumerate(("time", "power", "energy")):
                ax = axes[r][c]
                column = f"{quantity}_ape_pct"
                if column not in rows or not _has(rows[column]):
                    _note(ax, _NO_POWER if quantity != "time" else "no predictions")
                    continue
                for k, mode in enumerate(MODES):
                    data, positions = [], []
                    for i, name in enumerate(names):
                        ape = rows.loc[
                            (rows["mode"] == mode) & (rows["op_name"] == name), column
                        ].dropna()
                        ape = ape[ape > 0]
                        if len(ape):
                            data.append(ape.to_numpy())
                            positions.append(i + (k - 0.5) * 0.35)
                    if data:
                        ax.boxplot(
                            data,
                            positions=positions,
                            widths=0.3,
                            orientation="horizontal",
                            patch_artist=True,
                            boxprops={"facecolor": mode_colors[mode], "alpha": 0.6},
                            medianprops={"color": "black"},
                            showfliers=False,
                            manage_ticks=False,
                        )
                        # Every operation as a dot too: a type may have one or two.
                        for values, y in zip(data, positions, strict=True):
                            ax.scatter(
                                values,
                                np.full(len(values), y),
                                s=10,
                                color=mode_colors[mode],
                                edgecolors="black",
                                linewidths=0.4,
                                zorder=3,
                            )
                ax.set_xscale("log")
                _plain_log_ticks(ax.xaxis)
                counts = rows.groupby("op_name")["op_id"].nunique()
                labels = [f"{n} ({counts.get(n, 0)})" for n in names]
                ax.set_yticks(range(len(names)), labels if c == 0 else [""] * len(names))
                ax.set_ylim(-0.7, len(names) - 0.3)
                ax.set_xlabel(f"absolute error of {quantity} [%]")
                ax.set_title(f"{gpu}: {quantity}")
        handles = [Patch(color=mode_colors[m], alpha=0.6, label=m) for m in MODES]
        fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
        fig.suptitle(title)
    return fig


def prediction_networks_figure(
    networks: pd.DataFrame, style: FigureStyle = FigureStyle()
) -> Figure:
    """Predicted (summed operation predictions) against measured whole networks.

    Leave-one-network-out: each network is predicted by predictors trained without its
    operation measurements. One row per GPU configuration and mode (reference setting),
    time and energy per iteration; the label over a prediction is its relative error; a
    ``*`` after a network's name marks operations its predictors never saw.
    """
    title = "Network level: predicted against measured (leave-one-network-out)"
    if networks.empty:
        return _message_figure(title, "no network predictions", style)
    part = _at_reference(networks)
    with mpl.rc_context(style.rc()):
        fig, axes, panels = _time_energy_grid(part, inches_per_network=0.7)
        for r, (gpu, mode, setting) in enumerate(panels.itertuples(index=False)):
            rows = part[(part["gpu"] == gpu) & (part["mode"] == mode)]
            order = _network_order(part[part["gpu"] == gpu], "time_s")
            rows = rows.set_index("model_input").reindex(order).dropna(how="all").reset_index()
            for c, (quantity, measured_col, pred_col) in enumerate(
                (("time", "time_s", "time_pred_s"), ("energy", "energy_j", "energy_pred_j"))
            ):
                ax = axes[r][c]
                ax.set_title(_panel_title(gpu, mode, setting))
                if not (_has(rows[measured_col]) or _has(rows[pred_col])):
                    _note(ax, _NO_POWER)
                    continue
                factor, unit = unit_scale(
                    [*rows[measured_col], *rows[pred_col]], _QUANTITY_UNIT[quantity]
                )
                x = np.arange(len(rows))
                ax.bar(x - 0.2, rows[measured_col] * factor, 0.4, color=_COLORS["measured"])
                ax.bar(x + 0.2, rows[pred_col] * factor, 0.4, color=_COLORS["predicted"])
                rel = rows[pred_col] / rows[measured_col] - 1
                _label_above(ax, x + 0.2, rows[pred_col] * factor, rel)
                names = [
                    _tick_label(mi) + ("*" if unseen > 0 else "")
                    for mi, unseen in zip(rows["model_input"], rows["n_ops_unseen"], strict=True)
                ]
                ax.set_xticks(x, names)
                ax.set_ylabel(f"{_QUANTITY_LABEL[quantity]} [{unit}]")
                ax.margins(y=0.25)
        handles = [
            Patch(color=_COLORS["measured"], label="measured network"),
            Patch(color=_COLORS["predicted"], label="sum of operation predictions"),
        ]
        if (part["n_ops_unseen"] > 0).any():
            handles.append(Patch(color="none", label="* has operations unseen in training"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
        fig.suptitle(title)
    return fig


# --- method figures (thesis 3.2.3, 3.3) ---------------------------------------------


def _op_description(record: Mapping[str, Any]) -> str:
    spec = record.get("spec") or {}
    shapes = [tuple(i.get("shape", ())) for i in spec.get("inputs", [])]
    op = str(record.get("op_type", "?")).rsplit(".", 1)[-1]
    shape = ", ".join("x".join(str(d) for d in s) for s in shapes)
    where = record.get("gpu_name") or record.get("device", "?")
    return f"{op} ({shape}) of {record.get('model_input', '?')}, {record.get('mode', '?')}, {where}"


def proportionality_figure(record: Mapping[str, Any], style: FigureStyle = FigureStyle()) -> Figure:
    """Iterations against total runtime, the fit t_tot = a N, and where it breaks (fig. 3.1).

    Left: total runtime of every measurement against its iterations (log-log), the fitted
    line and the 5σ outliers. Right: the relative residual against total runtime, the
    5σ channel and the threshold below which proportionality breaks.
    """
    table = sweep.proportionality_table(record)
    fit = sweep.fit_proportionality(table["iterations"], table["total_time_s"])
    n = table["iterations"].to_numpy(dtype=float)
    t = table["total_time_s"].to_numpy(dtype=float)
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(11.0, 4.2), layout="constrained")
        left, right = fig.subplots(1, 2)
        factor, unit = unit_scale(t, "s")
        normal = ~fit.outlier
        left.scatter(
            n[normal & fit.fitted],
            t[normal & fit.fitted] * factor,
            s=16,
            label="fitted measurement",
        )
        left.scatter(
            n[normal & ~fit.fitted],
            t[normal & ~fit.fitted] * factor,
            s=16,
            facecolors="none",
            edgecolors="C0",
            label="measurement (not fitted)",
        )
        left.scatter(
            n[fit.outlier],
            t[fit.outlier] * factor,
            s=28,
            marker="x",
            color="C3",
            label=f"outlier (> {fit.outlier_sigmas:g} σ)",
        )
        grid = np.geomspace(n.min(), n.max(), 100)
        left.plot(
            grid,
            fit.time_per_iteration_s * grid * factor,
            color="black",
            linewidth=1,
            label=f"fit t = a·N, a = {_si(fit.time_per_iteration_s, 's')}",
        )
        if np.isfinite(fit.threshold_s):
            left.axhline(
                fit.threshold_s * factor,
                color="C3",
                linestyle=":",
                label=f"proportionality breaks below {_si(fit.threshold_s, 's')}",
            )
        left.set_xscale("log")
        left.set_yscale("log")
        left.set_xlabel("iterations N")
        left.set_ylabel(f"total runtime t_tot [{unit}]")
        left.legend(loc="upper left", frameon=False)
        right.scatter(t[normal] * factor, fit.residual_rel[normal] * 100, s=16, label="measurement")
        right.scatter(
            t[fit.outlier] * factor,
            fit.residual_rel[fit.outlier] * 100,
            s=28,
            marker="x",
            color="C3",
            label="outlier",
        )
        band = fit.outlier_sigmas * fit.sigma_rel * 100
        right.axhspan(
            -band,
            band,
            color="C0",
            alpha=0.12,
            label=f"±{fit.outlier_sigmas:g} σ (σ = {fit.sigma_rel * 100:.2g}%)",
        )
        if np.isfinite(fit.threshold_s):
            right.axvline(fit.threshold_s * factor, color="C3", linestyle=":", label="threshold")
        right.set_xscale("log")
        _plain_log_ticks(right.xaxis)
        _plain_log_ticks(left.xaxis)
        _plain_log_ticks(left.yaxis)
        if np.nanmax(np.abs(fit.residual_rel * 100)) > 20 * band:
            # Outliers far beyond the channel: linear within it, logarithmic outside.
            right.set_yscale("symlog", linthresh=max(band, 1e-3))
            right.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        right.set_xlabel(f"total runtime t_tot [{unit}]")
        right.set_ylabel("t_tot / (a·N) − 1 [%]")
        right.legend(loc="upper right", frameon=False)
        fig.suptitle(f"Proportionality of runtime and iterations\n{_op_description(record)}")
    return fig


def _si(value: float, unit: str) -> str:
    factor, scaled_unit = unit_scale([value], unit)
    return f"{value * factor:.3g} {scaled_unit}"


def power_trace_figure(trace: sweep.PowerTrace, style: FigureStyle = FigureStyle()) -> Figure:
    """Power over alternating idle and benchmark runs (thesis 3.3).

    The power samples of the alternating part of the power-trace sweep against seconds
    since its start; light shading: a run's warm-up, dark shading: its timed region.
    """
    title = "Power over alternating idle and benchmark runs"
    if trace.samples is None:
        return _message_figure(title, _NO_POWER, style)
    events = trace.events
    part = events[events["part"] == "alternating"]
    if part.empty:
        return _message_figure(title, "the record has no alternating runs", style)
    t0, t1 = part["start_unix_s"].min(), part["end_unix_s"].max()
    s = trace.samples[(trace.samples["unix_s"] >= t0) & (trace.samples["unix_s"] <= t1)]
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        ax = fig.subplots()
        for run in part[part["phase"] == "run"].itertuples(index=False):
            ax.axvspan(
                run.start_unix_s - t0,
                run.timed_start_unix_s - t0,
                color="C1",
                alpha=0.15,
                linewidth=0,
            )
            ax.axvspan(
                run.timed_start_unix_s - t0,
                run.timed_end_unix_s - t0,
                color="C1",
                alpha=0.35,
                linewidth=0,
            )
        ax.plot(s["unix_s"] - t0, s["power_w"], color="C0", linewidth=1, marker=".", markersize=2)
        ax.set_xlabel("time since start [s]")
        ax.set_ylabel(f"power ({trace.power_field}) [W]")
        handles = [
            Line2D(
                [],
                [],
                color="C0",
                marker=".",
                label=f"{trace.power_field}, every {trace.record.get('power_interval_ms', '?')} ms",
            ),
            Patch(color="C1", alpha=0.15, label="warm-up (not timed)"),
            Patch(color="C1", alpha=0.35, label="timed benchmark"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        ax.set_ylim(bottom=0)
        fig.suptitle(f"{title}\n{_op_description(trace.record)}")
    return fig


def channel(power_w: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The 3σ channel of (3.1)-(3.3): mean, σ (ddof 1) and which samples it keeps."""
    mean = float(np.mean(power_w))  # (3.1)
    sigma = float(np.std(power_w, ddof=1)) if len(power_w) > 1 else math.nan  # (3.2)
    keep = np.abs(power_w - mean) <= 3 * sigma if len(power_w) > 1 else np.ones(len(power_w), bool)
    return mean, sigma, keep  # (3.3), with <= as opcost.evaluate


def startup_figure(trace: sweep.PowerTrace, style: FigureStyle = FigureStyle()) -> Figure:
    """Back-to-back benchmark runs overlaid: the startup effect and the 3σ channel (3.3).

    Each run's samples against seconds since the run started (its warm-up first); the
    dotted vertical line marks the start of its timed region; the dashed lines are its
    channel W̄ ± 3σ_W over the samples in the timed region (3.1-3.3), crosses the samples
    the evaluation drops. Left: the whole runs; right: their first moments, where the
    startup effect is.
    """
    title = "Startup effect: benchmark runs overlaid, with the 3σ channel"
    if trace.samples is None:
        return _message_figure(title, _NO_POWER, style)
    runs = trace.events[(trace.events["part"] == "overlay") & (trace.events["phase"] == "run")]
    if runs.empty:
        return _message_figure(title, "the record has no back-to-back runs", style)
    samples = trace.samples
    offsets = runs["timed_start_unix_s"] - runs["start_unix_s"]
    lengths = runs["end_unix_s"] - runs["start_unix_s"]
    zoom_s = float(min(lengths.max(), offsets.max() + max(0.5, 0.1 * lengths.max())))
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(11.0, 4.6), layout="constrained")
        axes = fig.subplots(1, 2)
        handles = []
        for k, run in enumerate(runs.itertuples(index=False)):
            color = f"C{k % 10}"
            s = samples[
                (samples["unix_s"] >= run.start_unix_s) & (samples["unix_s"] <= run.end_unix_s)
            ]
            x = s["unix_s"].to_numpy() - run.start_unix_s
            w = s["power_w"].to_numpy()
            timed = (
                (s["unix_s"] >= run.timed_start_unix_s) & (s["unix_s"] <= run.timed_end_unix_s)
            ).to_numpy()
            label = f"run {k + 1}"
            keep = None
            if timed.sum() >= 2:
                mean, sigma, keep = channel(w[timed])  # as opcost.evaluate: (3.1)-(3.3)
                label += f": {int((~keep).sum())} of {len(keep)} timed samples outside 3σ"
            for ax in axes:
                ax.plot(x, w, color=color, linewidth=1, alpha=0.9, drawstyle="steps-post")
                ax.axvline(
                    run.timed_start_unix_s - run.start_unix_s,
                    color=color,
                    linestyle=":",
                    linewidth=0.8,
                )
                if keep is not None:
                    for level in (mean - 3 * sigma, mean + 3 * sigma):
                        ax.axhline(level, color=color, linestyle="--", linewidth=0.8, alpha=0.8)
                    ax.scatter(x[timed][~keep], w[timed][~keep], marker="x", color=color, s=24)
            handles.append(Line2D([], [], color=color, label=label))
        handles += [
            Line2D([], [], color="gray", linestyle="--", label="W̄ ± 3σ of the timed samples"),
            Line2D([], [], color="gray", linestyle=":", label="timed region starts"),
            Line2D(
                [], [], color="gray", marker="x", linestyle="", label="dropped by the 3σ filter"
            ),
        ]
        axes[1].set_xlim(0, zoom_s)
        axes[0].set_title("whole runs")
        axes[1].set_title(f"first {zoom_s:.2g} s")
        for ax in axes:
            ax.set_xlabel("time since the run started [s]")
            ax.set_ylabel(f"power ({trace.power_field}) [W]")
        fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
        fig.suptitle(f"{title}\n{_op_description(trace.record)}")
    return fig


# --- rendering from files ----------------------------------------------------------


def _validation(inputs: Mapping[str, str]) -> pd.DataFrame:
    return read_parquet(inputs["validation"])


def _trace(inputs: Mapping[str, str]) -> sweep.PowerTrace:
    return sweep.read_power_trace(inputs["csv"], inputs["record"])


_FIGURES: dict[str, Callable[[Mapping[str, str], FigureStyle, Mapping[str, Any]], Figure]] = {
    "proportionality": lambda i, s, o: proportionality_figure(
        sweep.read_record(i["record"], "proportionality"), s
    ),
    "power_trace": lambda i, s, o: power_trace_figure(_trace(i), s),
    "startup_effect": lambda i, s, o: startup_figure(_trace(i), s),
    "validation": lambda i, s, o: validation_figure(_validation(i), o["size_class"], s),
    "network_energy": lambda i, s, o: network_energy_figure(_validation(i), s),
    "settings": lambda i, s, o: settings_figure(_validation(i), s),
    "prediction_ops": lambda i, s, o: prediction_ops_figure(read_parquet(i["ops"]), s),
    "prediction_errors": lambda i, s, o: prediction_errors_figure(read_parquet(i["ops"]), s),
    "prediction_op_types": lambda i, s, o: prediction_op_types_figure(read_parquet(i["ops"]), s),
    "prediction_networks": lambda i, s, o: prediction_networks_figure(
        read_parquet(i["networks"]), s
    ),
}
FIGURE_NAMES: tuple[str, ...] = tuple(_FIGURES)


def render(
    name: str,
    inputs: Mapping[str, str],
    pdf_path: str | Path,
    png_path: str | Path,
    style: FigureStyle = FigureStyle(),
    options: Mapping[str, Any] | None = None,
) -> None:
    """Draw figure ``name`` from its input files and write it as PDF and PNG.

    Args:
        name: one of :data:`FIGURE_NAMES`.
        inputs: the rule's named inputs (see the module docstring for each figure's).
        pdf_path, png_path: where to write.
        style: resolution and font size.
        options: figure options (``size_class`` for ``validation``).

    Raises:
        FigureError: unknown figure name or a missing input or option.
    """
    if name not in _FIGURES:
        raise FigureError(f"unknown figure {name!r}; known: {', '.join(FIGURE_NAMES)}")
    try:
        fig = _FIGURES[name](inputs, style, options or {})
    except KeyError as e:
        raise FigureError(f"figure {name!r} needs the input or option {e}") from e
    save_figure(fig, pdf_path, png_path, style)


def figure_targets(study: Study) -> list[str]:
    """The tables and figures of a study's ``rule all`` (figures as PDF and PNG).

    The settings figure only where a GPU configuration has more than one setting; the
    method figures (proportionality, power traces) not at all: they need a GPU run of
    their own (docs/validation.md).
    """
    names = [
        "validation_small",
        "validation_large",
        "network_energy",
        "prediction_ops",
        "prediction_errors",
        "prediction_op_types",
        "prediction_networks",
    ]
    if any(len(g.settings) > 1 for g in study.gpus.values()):
        names.append("settings")
    return [
        "results/validation/dataset_validation.parquet",
        "results/validation/prediction_metrics.parquet",
        *(f"results/figures/{name}.{ext}" for name in names for ext in ("pdf", "png")),
    ]


def style_from_config(config: Mapping[str, Any]) -> FigureStyle:
    """The figure style of a config's ``figures`` section (schema defaults where absent)."""
    section = config.get("figures") or {}
    return FigureStyle(
        dpi=int(section.get("dpi", FigureStyle.dpi)),
        font_size=float(section.get("font_size", FigureStyle.font_size)),
    )
