"""Measurement-method figures (thesis 3.2.3, 3.3), drawn from the sweep records.

:func:`proportionality_figure` takes a proportionality record
(:func:`opcost.sweep_record.read_record`); :func:`power_trace_figure` and :func:`startup_figure`
a :class:`opcost.sweep_record.PowerTrace`. :func:`channel` is the evaluation's 3σ filter of the
power samples, (3.1)-(3.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from opcost import sweep_record
from opcost.figures.style import (
    NO_POWER,
    FigureStyle,
    message_figure,
    plain_log_ticks,
    unit_scale,
)


def _op_description(record: Mapping[str, Any]) -> str:
    spec = record.get("spec") or {}
    shapes = [tuple(i.get("shape", ())) for i in spec.get("inputs", [])]
    op = str(record.get("op_type", "?")).rsplit(".", 1)[-1]
    shape = ", ".join("x".join(str(d) for d in s) for s in shapes)
    where = record.get("gpu_name") or record.get("device", "?")
    return f"{op} ({shape}) of {record.get('model_input', '?')}, {record.get('mode', '?')}, {where}"


def proportionality_figure(record: Mapping[str, Any], style: FigureStyle | None = None) -> Figure:
    """Iterations against total runtime, the fit t_tot = a N, and where it breaks (fig. 3.1).

    Left: total runtime of every measurement against its iterations (log-log), the fitted
    line and the 5σ outliers. Right: the relative residual against total runtime, the
    5σ channel and the threshold below which proportionality breaks.
    """
    style = style or FigureStyle()
    table = sweep_record.proportionality_table(record)
    fit = sweep_record.fit_proportionality(table["iterations"], table["total_time_s"])
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
        plain_log_ticks(right.xaxis)
        plain_log_ticks(left.xaxis)
        plain_log_ticks(left.yaxis)
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


def power_trace_figure(trace: sweep_record.PowerTrace, style: FigureStyle | None = None) -> Figure:
    """Power over alternating idle and benchmark runs (thesis 3.3).

    The power samples of the alternating part of the power-trace sweep against seconds
    since its start; light shading: a run's warm-up, dark shading: its timed region.
    """
    style = style or FigureStyle()
    title = "Power over alternating idle and benchmark runs"
    if trace.samples is None:
        return message_figure(title, NO_POWER, style)
    events = trace.events
    part = events[events["part"] == "alternating"]
    if part.empty:
        return message_figure(title, "the record has no alternating runs", style)
    t0, t1 = part["start_unix_s"].min(), part["end_unix_s"].max()
    s = trace.samples[(trace.samples["unix_s"] >= t0) & (trace.samples["unix_s"] <= t1)]
    with mpl.rc_context(style.rc()):
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        ax = fig.subplots()
        for run in part[part["phase"] == "run"].itertuples(index=False):
            # Warm-up light, the timed region darker.
            for start, end, alpha in (
                (run.start_unix_s, run.timed_start_unix_s, 0.15),
                (run.timed_start_unix_s, run.timed_end_unix_s, 0.35),
            ):
                ax.axvspan(start - t0, end - t0, color="C1", alpha=alpha, linewidth=0)
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


def startup_figure(trace: sweep_record.PowerTrace, style: FigureStyle | None = None) -> Figure:
    """Back-to-back benchmark runs overlaid: the startup effect and the 3σ channel (3.3).

    Each run's samples against seconds since the run started (its warm-up first); the
    dotted vertical line marks the start of its timed region; the dashed lines are its
    channel W̄ ± 3σ_W over the samples in the timed region (3.1-3.3), crosses the samples
    the evaluation drops. Left: the whole runs; right: their first moments, where the
    startup effect is.
    """
    style = style or FigureStyle()
    title = "Startup effect: benchmark runs overlaid, with the 3σ channel"
    if trace.samples is None:
        return message_figure(title, NO_POWER, style)
    runs = trace.events[(trace.events["part"] == "overlay") & (trace.events["phase"] == "run")]
    if runs.empty:
        return message_figure(title, "the record has no back-to-back runs", style)
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
