"""Prediction-accuracy figures (thesis 5.2): predicted against measured.

The operation-level figures take the held-out operations
(:func:`opcost.validate.predictions.prediction_ops`), :func:`prediction_networks_figure`
the leave-one-network-out networks
(:func:`opcost.validate.predictions.prediction_networks`) or networks replayed from other
predictions; :func:`opspace_op_types_figure` takes the GPU times of op models trained on
the op space (held-out samples and network ops). Each also takes a
:class:`~opcost.figures.style.FigureStyle`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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
    FigureStyle,
    at_reference,
    has_values,
    label_above,
    message_figure,
    network_order,
    network_ticks,
    note,
    panel_title,
    plain_log_ticks,
    tick_label,
    time_energy_grid,
    unit_scale,
)
from opcost.model.op_spec import FAMILIES


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


def prediction_ops_figure(ops: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Predicted against measured time, power and energy of held-out operations.

    One row per GPU configuration and mode, one column per quantity; points coloured by
    operation type; the black line is prediction = measurement. Time and energy on log
    axes. Each panel names its mean absolute percentage error (MAPE) and n.
    """
    style = style or FigureStyle()
    title = "Operation level: predicted against measured (held-out operations)"
    if ops.empty:
        return message_figure(title, "no held-out predictions", style)
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
        note(ax, NO_POWER if quantity != "time" else "no predictions")
        return
    log = quantity != "power"
    factor, unit = unit_scale(measured[ok], QUANTITY_UNIT[quantity]) if log else (1.0, "W")
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
        plain_log_ticks(ax.xaxis)
        plain_log_ticks(ax.yaxis)
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
    label = QUANTITY_LABEL[quantity]
    ax.set_xlabel(f"measured {label} [{unit}]")
    ax.set_ylabel(f"predicted {label} [{unit}]")


def _op_panels(
    fig: Figure, ops: pd.DataFrame, gpus: list[str], suffix: str
) -> Iterator[tuple[Any, int, str, str, pd.DataFrame, str]]:
    """The panels of an operation-level figure: a row per GPU configuration, a column per
    quantity. Yields ``(axes, column index, gpu, quantity, the GPU's rows, the column
    {quantity}_{suffix})`` for each panel with values; notes why the others are empty."""
    axes = fig.subplots(len(gpus), 3, squeeze=False)
    for r, gpu in enumerate(gpus):
        rows = ops[ops["gpu"] == gpu]
        for c, quantity in enumerate(("time", "power", "energy")):
            ax = axes[r][c]
            column = f"{quantity}_{suffix}"
            if column not in rows or not has_values(rows[column]):
                note(ax, NO_POWER if quantity != "time" else "no predictions")
                continue
            yield ax, c, gpu, quantity, rows, column


def prediction_errors_figure(ops: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Distribution of the relative error (predicted / measured - 1) of held-out operations.

    One row per GPU configuration, one column per quantity, one histogram per mode (30
    bins over the panel's errors). Errors beyond -100 % and +200 % are counted in the
    outermost bins.
    """
    style = style or FigureStyle()
    title = "Operation level: distribution of the relative prediction error"
    if ops.empty:
        return message_figure(title, "no held-out predictions", style)
    gpus = sorted(ops["gpu"].unique())
    mode_colors = {"inference": "C0", "training": "C1"}
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(11.0, 1.2 + 2.8 * len(gpus)), layout="constrained")
        for ax, _, gpu, quantity, rows, column in _op_panels(fig, ops, gpus, "rel_err"):
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
                    linestyle=MODE_STYLE[mode],
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
            Line2D([], [], color=mode_colors[m], linestyle=MODE_STYLE[m], label=m) for m in MODES
        ]
        handles.append(Line2D([], [], color="black", linewidth=0.8, label="no error"))
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        fig.suptitle(title)
    return fig


def prediction_op_types_figure(ops: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Absolute percentage error of held-out operations by operation type and mode.

    One row per GPU configuration, one column per quantity; a box per operation type and
    mode (median, quartiles, whiskers at 1.5 IQR) with every operation as a dot, log
    scale. The number after a type is its count of held-out operations.
    """
    style = style or FigureStyle()
    title = "Operation level: prediction error by operation type"
    if ops.empty:
        return message_figure(title, "no held-out predictions", style)
    gpus = sorted(ops["gpu"].unique())
    names = sorted(ops["op_name"].unique())
    mode_colors = {"inference": "#1f77b4", "training": "#ff7f0e"}
    with mpl.rc_context(style.rc()):
        fig = Figure(
            figsize=(11.0, 1.0 + (0.8 + 0.32 * len(names)) * len(gpus)), layout="constrained"
        )
        for ax, c, gpu, quantity, rows, column in _op_panels(fig, ops, gpus, "ape_pct"):
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
            plain_log_ticks(ax.xaxis)
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
    networks: pd.DataFrame,
    style: FigureStyle | None = None,
    *,
    title: str = "Network level: predicted against measured (leave-one-network-out)",
    predicted_label: str = "sum of operation predictions",
) -> Figure:
    """Predicted against measured whole networks: time and energy per iteration.

    One row per GPU configuration and mode (each configuration's reference setting:
    ``default``, else the first by name), time left and energy right; a measured and a
    predicted bar per network; the label over a prediction is its relative error; a ``*``
    after a network's name marks operations its predictors never saw. ``title`` is the
    figure's title, ``predicted_label`` the legend's name of the predicted bars; their
    defaults describe leave-one-network-out predictions (each network predicted by
    predictors trained without its operation measurements).

    Columns of ``networks``, one row per network, GPU configuration, setting and mode:
    ``model_input`` (network and input shape, ``resnet18_4x3x64x64``), ``gpu``,
    ``setting``, ``mode``, ``time_s`` and ``time_pred_s`` (measured and predicted time per
    iteration), ``energy_j`` and ``energy_pred_j`` (per iteration; NaN without power
    data) and ``n_ops_unseen`` (the network's operations its predictors never saw).
    """
    style = style or FigureStyle()
    if networks.empty:
        return message_figure(title, "no network predictions", style)
    part = at_reference(networks)
    with mpl.rc_context(style.rc()):
        fig, axes, panels = time_energy_grid(part, inches_per_network=0.7)
        for r, (gpu, mode, setting) in enumerate(panels.itertuples(index=False)):
            rows = part[(part["gpu"] == gpu) & (part["mode"] == mode)]
            order = network_order(part[part["gpu"] == gpu], "time_s")
            rows = rows.set_index("model_input").reindex(order).dropna(how="all").reset_index()
            for c, (quantity, measured_col, pred_col) in enumerate(
                (("time", "time_s", "time_pred_s"), ("energy", "energy_j", "energy_pred_j"))
            ):
                ax = axes[r][c]
                ax.set_title(panel_title(gpu, mode, setting))
                if not (has_values(rows[measured_col]) or has_values(rows[pred_col])):
                    note(ax, NO_POWER)
                    continue
                factor, unit = unit_scale(
                    [*rows[measured_col], *rows[pred_col]], QUANTITY_UNIT[quantity]
                )
                x = np.arange(len(rows))
                ax.bar(x - 0.2, rows[measured_col] * factor, 0.4, color=COLORS["measured"])
                ax.bar(x + 0.2, rows[pred_col] * factor, 0.4, color=COLORS["predicted"])
                rel = rows[pred_col] / rows[measured_col] - 1
                label_above(ax, x + 0.2, rows[pred_col] * factor, rel)
                names = [
                    tick_label(mi) + ("*" if unseen > 0 else "")
                    for mi, unseen in zip(rows["model_input"], rows["n_ops_unseen"], strict=True)
                ]
                network_ticks(ax, x, names)
                ax.set_ylabel(f"{QUANTITY_LABEL[quantity]} [{unit}]")
                ax.margins(y=0.25)
        handles = [
            Patch(color=COLORS["measured"], label="measured network"),
            Patch(color=COLORS["predicted"], label=predicted_label),
        ]
        if (part["n_ops_unseen"] > 0).any():
            handles.append(Patch(color="none", label="* has operations unseen in training"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
        fig.suptitle(title)
    return fig


#: Marker of each source of ops; other sources take the markers of :data:`_MORE_MARKERS`.
SOURCE_MARKERS = {"held-out samples": "o", "network ops": "x"}
_MORE_MARKERS = ("s", "^", "v", "D", "+")
#: The dashed band around prediction = measurement: ±10 %.
TOLERANCE = 0.10


def _family_order(families: Iterable[str]) -> list[str]:
    present = set(families)
    return [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))


def _source_markers(sources: Iterable[str]) -> dict[str, str]:
    present = set(sources)
    markers = {s: m for s, m in SOURCE_MARKERS.items() if s in present}
    others = sorted(present - set(SOURCE_MARKERS))
    for k, source in enumerate(others):
        markers[source] = _MORE_MARKERS[k % len(_MORE_MARKERS)]
    return markers


def opspace_op_types_figure(ops: pd.DataFrame, style: FigureStyle | None = None) -> Figure:
    """Predicted against measured GPU time per call of op-space op models, per op family.

    Columns of ``ops``, one row per op and GPU configuration: ``gpu`` (the GPU
    configuration), ``family`` (op family, :data:`opcost.model.op_spec.FAMILIES`),
    ``source`` (``held-out samples`` or ``network ops``), ``measured_s`` and ``predicted_s``
    (GPU kernel time per call). One log-log panel per family, four to a row: points coloured
    by GPU configuration, marked by source; the black line is prediction = measurement, the
    dashed ones ±10 %. Each panel names, per source, the median absolute error (|predicted /
    measured - 1|) and n. Rows whose measured or predicted time is missing, infinite or not
    positive are not drawn; a panel says how many it left out.
    """
    style = style or FigureStyle()
    title = "Op models from the op space: predicted against measured GPU time per op family"
    if ops.empty:
        return message_figure(title, "no op predictions", style)
    families = _family_order(ops["family"])
    gpu_colors = {gpu: f"C{i % 10}" for i, gpu in enumerate(sorted(ops["gpu"].unique()))}
    markers = _source_markers(ops["source"])
    n_cols = min(4, len(families))
    n_rows = -(-len(families) // n_cols)
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(3.0 * n_cols + 2.2, 0.9 + 2.9 * n_rows), layout="constrained")
        axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
        for ax in axes[len(families) :]:
            ax.remove()
        for ax, family in zip(axes, families, strict=False):
            _opspace_panel(ax, ops[ops["family"] == family], gpu_colors, markers)
            ax.set_title(family)
        handles = [
            Line2D([], [], marker="o", linestyle="", color=color, label=gpu)
            for gpu, color in gpu_colors.items()
        ]
        handles += [
            Line2D([], [], marker=marker, linestyle="", color=COLORS["measured"], label=source)
            for source, marker in markers.items()
        ]
        handles.append(Line2D([], [], color="black", linewidth=1, label="prediction = measurement"))
        handles.append(Line2D([], [], color="black", linewidth=0.8, linestyle="--", label="±10 %"))
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
        fig.suptitle(title)
    return fig


def _opspace_panel(
    ax: Any, rows: pd.DataFrame, gpu_colors: Mapping[str, Any], markers: Mapping[str, str]
) -> None:
    measured = rows["measured_s"].to_numpy(dtype=float)
    pred = rows["predicted_s"].to_numpy(dtype=float)
    ok = np.isfinite(measured) & np.isfinite(pred) & (measured > 0) & (pred > 0)
    left_out = int((~ok).sum())
    left_text = f"{left_out} left out (time missing or ≤ 0)"
    if not ok.any():
        note(ax, "no positive GPU times" + (f"\n{left_text}" if left_out else ""))
        return
    kept = rows[ok]
    factor, unit = unit_scale([*measured[ok], *pred[ok]], "s")
    for (gpu, source), group in kept.groupby(["gpu", "source"], sort=True):
        ax.scatter(
            group["measured_s"].to_numpy(dtype=float) * factor,
            group["predicted_s"].to_numpy(dtype=float) * factor,
            s=14,
            marker=markers[source],
            color=gpu_colors[gpu],
            alpha=0.7,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _identity(ax, np.concatenate([measured[ok], pred[ok]]) * factor, log=True)
    lo, hi = ax.get_xlim()
    for k in (1 - TOLERANCE, 1 + TOLERANCE):
        ax.plot([lo, hi], [lo * k, hi * k], color="black", linewidth=0.8, linestyle="--")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    lines = []
    for source in markers:
        part = kept[kept["source"] == source]
        if part.empty:
            continue
        err = np.abs(part["predicted_s"] / part["measured_s"] - 1) * 100
        lines.append(f"{source}: {np.median(err):.1f}% (n = {len(part)})")
    if left_out:
        lines.append(left_text)
    ax.text(
        0.03,
        0.97,
        "median |error|\n" + "\n".join(lines),
        transform=ax.transAxes,
        va="top",
        fontsize="x-small",
    )
    ax.set_xlabel(f"measured GPU time [{unit}]")
    ax.set_ylabel(f"predicted GPU time [{unit}]")
