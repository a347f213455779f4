"""Dataset validation figures (thesis 5.1): summed operations against measured networks.

Each takes the dataset-validation table
(:func:`opcost.validate.dataset.dataset_validation`) and a
:class:`~opcost.figures.style.FigureStyle`. Where a GPU configuration has several GPU
settings, :func:`validation_figure` and :func:`network_energy_figure` show its reference
setting (:func:`~opcost.figures.style.reference_settings`); :func:`settings_figure`
shows them all.
"""

from __future__ import annotations

from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from opcost.figures.style import (
    COLORS,
    MODE_STYLE,
    MODES,
    NO_POWER,
    QUANTITY_LABEL,
    QUANTITY_UNIT,
    FigureError,
    FigureStyle,
    at_reference,
    errorbar_kw,
    has_values,
    label_above,
    message_figure,
    network_order,
    network_ticks,
    note,
    panel_title,
    plain_log_ticks,
    provenance,
    reference_settings,
    setting_order,
    tick_label,
    time_energy_grid,
    unit_scale,
)


def validation_figure(
    table: pd.DataFrame, size_class: str, style: FigureStyle | None = None
) -> Figure:
    """Measured against summed time and energy per iteration (thesis tables I and II).

    One row of panels per GPU configuration and mode (at its reference setting), time on
    the left, energy on the right. Per model-input set of the size class: the measured
    network (error bar: its σ), the sum over all operations and the sum over module
    operations only (error bars: σ_S propagated as in :mod:`opcost.validate.dataset`). The label
    over each sum is its relative difference to the measurement.
    """
    style = style or FigureStyle()
    if size_class not in ("small", "large"):
        raise FigureError(f"size_class must be 'small' or 'large', not {size_class!r}")
    title = f"Summed operations against measured networks: {size_class} model-input sets"
    part = at_reference(table)
    part = part[part["size_class"] == size_class]
    if part.empty:
        return message_figure(title, f"no {size_class} model-input sets in this study", style)
    with mpl.rc_context(style.rc()):
        fig, axes, panels = time_energy_grid(part, inches_per_network=0.9)
        for r, (gpu, mode, setting) in enumerate(panels.itertuples(index=False)):
            rows = part[(part["gpu"] == gpu) & (part["mode"] == mode)]
            order = network_order(part[part["gpu"] == gpu], "time_measured_s")
            for c, quantity in enumerate(("time", "energy")):
                _validation_panel(axes[r][c], rows, quantity, order)
                axes[r][c].set_title(panel_title(gpu, mode, setting))
        handles = [
            Patch(color=COLORS["measured"], label="measured network"),
            Patch(color=COLORS["all"], label="sum of all operations"),
            Patch(color=COLORS["module"], label="sum of module operations only"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        subtitle = provenance(part)
        fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""))
    return fig


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
    if quantity == "energy" and not (
        has_values(measured) or has_values(by["all"][f"energy_sum_{unit_key}"])
    ):
        note(ax, NO_POWER)
        return
    values = [*measured, *by["all"][f"{quantity}_sum_{unit_key}"]]
    factor, unit = unit_scale(values, QUANTITY_UNIT[quantity])
    x = np.arange(len(nets))
    width = 0.27
    sigma_measured = all_rows.set_index("model_input")[f"sigma_{measured_col}"].reindex(nets)
    ax.bar(
        x - width,
        measured * factor,
        width,
        yerr=sigma_measured * factor,
        color=COLORS["measured"],
        **errorbar_kw(),
    )
    for offset, inc in ((0.0, "all"), (width, "module")):
        sums = by[inc][f"{quantity}_sum_{unit_key}"]
        ax.bar(
            x + offset,
            sums * factor,
            width,
            yerr=by[inc][f"sigma_{quantity}_sum_{unit_key}"] * factor,
            color=COLORS[inc],
            **errorbar_kw(),
        )
        sigma = by[inc][f"sigma_{quantity}_sum_{unit_key}"].fillna(0)
        label_above(ax, x + offset, (sums + sigma) * factor, by[inc][f"{quantity}_rel_diff"])
    network_ticks(ax, x, [tick_label(n) for n in nets])
    ax.set_ylabel(f"{QUANTITY_LABEL[quantity]} [{unit}]")
    ax.margins(y=0.25)


def network_energy_figure(table: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Energy per iteration of whole networks across GPU configurations (figures 5.1, 5.2).

    Rows: modes; columns: small and large model-input sets; bars: GPU configurations (at
    their reference settings), error bars the measured σ.
    """
    style = style or FigureStyle()
    title = "Energy of whole networks across GPU configurations"
    part = at_reference(table)
    part = part[(part["ops_included"] == "all") & part["network_measured"]]
    if part.empty:
        return message_figure(title, "no whole-network measurements", style)
    if not has_values(part["energy_measured_j"]):
        return message_figure(title, NO_POWER, style)
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
                nets = network_order(part[part["size_class"] == size], "time_measured_s")
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
                        **errorbar_kw(),
                    )
                network_ticks(ax, x, [tick_label(n) for n in nets])
                ax.set_ylabel(f"energy per iteration [{unit}]")
                ax.set_title(f"{mode}, {size} model-input sets")
        handles = [
            Patch(color=colors(k % 10), label=_gpu_label(part, g)) for k, g in enumerate(gpus)
        ]
        fig.legend(
            handles=handles, loc="outside lower center", ncols=min(4, len(gpus)), frameon=False
        )
        subtitle = provenance(part)
        fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""))
    return fig


def _gpu_label(table: pd.DataFrame, gpu: str) -> str:
    rows = table[table["gpu"] == gpu]
    ref = reference_settings(rows).get(gpu, "default")
    return gpu if ref == "default" else f"{gpu} ({ref})"


def settings_figure(table: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Time and energy per iteration against GPU setting, one line per network and mode.

    One row of panels per GPU configuration with more than one setting; settings ordered
    ``default``, locked SM clocks ascending, power limits ascending, each labelled with the
    SM clock measured during its network runs. Log scale: networks differ by orders of
    magnitude.
    """
    style = style or FigureStyle()
    title = "Time and energy against GPU setting"
    part = table[(table["ops_included"] == "all") & table["network_measured"]]
    counts = part.groupby("gpu")["setting"].nunique()
    gpus = sorted(counts[counts > 1].index)
    if not gpus:
        return message_figure(
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
            settings = sorted(rows["setting"].unique(), key=setting_order)
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
                if not has_values(rows[column]):
                    note(ax, NO_POWER)
                    continue
                factor, unit = unit_scale(rows[column], QUANTITY_UNIT[quantity])
                for k, net in enumerate(nets):
                    for mode in MODES:
                        line = rows[(rows["model_input"] == net) & (rows["mode"] == mode)]
                        line = line.sort_values("setting", key=lambda s: s.map(setting_order))
                        if line.empty:
                            continue
                        ax.plot(
                            line["setting"].map(x),
                            line[column] * factor,
                            MODE_STYLE[mode],
                            marker="o",
                            color=colors(k % 10),
                        )
                ax.set_yscale("log")
                plain_log_ticks(ax.yaxis)
                ax.set_xticks(range(len(settings)), labels)
                ax.set_xlabel("GPU setting (measured SM clock)")
                ax.set_ylabel(f"{QUANTITY_LABEL[quantity]} [{unit}]")
                ax.set_title(gpu)
        handles = [
            Line2D([], [], color=colors(k % 10), marker="o", label=n) for k, n in enumerate(nets)
        ]
        handles += [Line2D([], [], color="black", linestyle=MODE_STYLE[m], label=m) for m in MODES]
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
        fig.suptitle(title)
    return fig


def replay_figure(table: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Plain sum (thesis 5.1) and replays against the measured step, per mode.

    x: the time per step the trace job measured; y: predicted over measured, for the
    plain sum of the isolated ops' wall times, the replay of the isolated ops, and the
    replay of the network's own traced breakdown (``opcost.validate.replay``), against
    the trace job's timed loop; and, where the trace pairs its host bursts with their
    wall time, the own breakdown replayed as one burst against that burst's wall time
    (the same steps: the host's drift between moments cancels); filled markers where the
    GPU sets the pace.
    """
    style = style or FigureStyle()
    title = "Networks: plain sum and replay against measurement"
    if table.empty:
        return message_figure(title, "no traced networks (CUDA configurations only)", style)
    modes = [m for m in MODES if m in set(table["mode"])]
    loop = "trace_wall_time_s"
    series = [
        ("plain_sum_trace_wall_time_s", loop, "plain sum (5.1)", "tab:gray", "s"),
        ("replay_isolated_time_s", loop, "replay, isolated ops", "tab:blue", "o"),
        ("replay_own_time_s", loop, "replay, own breakdown", "tab:orange", "^"),
    ]
    if table.get("burst_wall_time_s", pd.Series(dtype=float)).notna().any():
        burst = "replay, own breakdown, a burst against its own wall time"
        series.append(("replay_own_burst_time_s", "burst_wall_time_s", burst, "tab:green", "D"))
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(6.4 * len(modes), 4.2), layout="constrained")
        axes = fig.subplots(1, len(modes), squeeze=False)[0]
        for ax, mode in zip(axes, modes, strict=True):
            rows = table[table["mode"] == mode]
            gpu_bound = rows["gpu_time_s"] >= rows["host_time_s"]
            for column, measured, label, color, marker in series:
                x = rows[measured] * 1e3
                ratio = rows[column] / rows[measured]
                ax.scatter(x[gpu_bound], ratio[gpu_bound], c=color, marker=marker, label=label)
                ax.scatter(
                    x[~gpu_bound],
                    ratio[~gpu_bound],
                    facecolors="none",
                    edgecolors=color,
                    marker=marker,
                )
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel("measured time per step (ms)")
            ax.set_ylabel("predicted / measured")
            ax.set_title(f"{mode} (filled: GPU sets the pace)")
        axes[0].legend()
        fig.suptitle(title)
    return fig
