"""Networks replayed from their ops (``opcost.replay``) against their measured time.

Per GPU configuration, setting, mode and traced network, three predictions of its time
per step beside the time per step measured where it was traced (``trace_wall_time_s``:
the profiling job's own window where that job traced, else the trace job's loop on the
same host) and what the profiling job measured (``time_s``, a 1-s window, possibly
another host when traced apart):

* ``plain_sum_time_s``: the thesis's sum (5.1) of the isolated ops' wall times;
* ``replay_isolated_time_s``: the replay of the network's call sequence (extraction's
  positions; training: the forward calls, then their backward passes in reverse), each op
  with its isolated trace's host and GPU time;
* ``replay_own_time_s``: the replay of the network's own traced breakdown, its spans'
  host times scaled to the untraced host time of each pass;
* ``replay_own_burst_time_s``: the same replay of one host burst (``host_burst_steps``
  steps from an idle device, then a synchronisation), beside the bursts' own wall time
  (``burst_wall_time_s``): host time and wall time of the same steps, so the host's
  speed, which moves between the bursts and the timed loop, cancels, and what is left is
  the replay model's own error.

A network traced with CUDA graphs also has its measured graph step (``graph_time_s``,
``graph_energy_j``) beside two graph replays (:func:`opcost.replay.graph_replay`: no host
time, kernels back to back): ``replay_isolated_graph_time_s`` from the isolated ops' GPU
times and kernels, and ``replay_own_graph_time_s`` from the network's own eager kernel
time and kernels (its traced step, not the breakdown, whose annotation turns fused fast
paths off); ``replay_isolated_graph_energy_j`` as below, the graph's gaps as waiting.

An op's or a span's GPU stream is busy for the union of its kernels' intervals
(``gpu_busy_time_s``, ``gpu_busy_s``) where its trace records it, else for their summed
durations: the two differ where kernels run on several streams at once (cuDNN's grouped
convolutions), which one stream would count one after another. Every replay takes the
device's gap between kernels as the median of the configuration's ops' traces
(``launch_gap_s``): a network whose streams wait on each other measures a longer one of
its own (3.5 µs against about 1.3 for regnet_x_400mf at batch 64 with TF32 off on an
H100). Kernels that run at once share their gaps (:func:`opcost.replay.gapped_kernels`).

Energy replays the isolated ops: each op's busy power times its GPU time, plus the power
the GPU draws while it waits times the rest of the step. An op's busy power follows from
its 1-s window: ``P_op t_op = P_busy g + P_wait (t_op - g)``. ``P_wait`` is the median
window power of the configuration's ops that keep the GPU busiest for less than
``WAIT_SHARE`` of their time (the GPU idling between launches, clocks up).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from opcost import replay as rp
from opcost.io import read_parquet

#: Ops whose GPU-busy share is below this give the waiting power.
WAIT_SHARE = 0.1
_KEYS = ["gpu", "setting", "mode"]


def call_sequences(paths: Iterable[str | Path]) -> dict[str, list[str]]:
    """Each model-input set's op ids in call order, from its op table's ``positions``."""
    out = {}
    for path in paths:
        table = read_parquet(path, ["model_input", "op_id", "positions"])
        calls = sorted(
            (int(p), oid)
            for oid, positions in zip(table["op_id"], table["positions"], strict=True)
            for p in str(positions).split(",")
        )
        if len(table):
            out[str(table["model_input"].iloc[0])] = [oid for _, oid in calls]
    return out


def busy_s(table: pd.DataFrame, busy: str, summed: str) -> pd.Series:
    """The time the GPU is busy: column ``busy`` (a union of kernel intervals) where it is
    recorded, else ``summed`` (the kernels' durations added up)."""
    summed_s = pd.to_numeric(table[summed], errors="coerce")
    if busy not in table:
        return summed_s
    busy_col = pd.to_numeric(table[busy], errors="coerce")
    return busy_col.where(busy_col.notna(), summed_s)


def waiting_power_w(ops: pd.DataFrame) -> float:
    """``P_wait`` of one configuration and mode (module docstring)."""
    share = busy_s(ops, "gpu_busy_time_s", "gpu_time_s") / ops["time_s"]
    low = ops.loc[share < WAIT_SHARE, "power_w"].dropna()
    return float(low.median()) if len(low) else math.nan


def busy_power_w(ops: pd.DataFrame, p_wait: float) -> pd.Series:
    """Each op's power while its kernels run (module docstring); NaN without kernels."""
    g = busy_s(ops, "gpu_busy_time_s", "gpu_time_s")
    t = ops["time_s"]
    p = (ops["power_w"] * t - p_wait * (t - g).clip(lower=0)) / g
    return p.where(g > 0)


def _isolated_steps(seq: list[str], ops: pd.DataFrame, training: bool) -> pd.DataFrame:
    """The replayed step's entries: per call its host, GPU time, kernels and op id."""
    o = ops.reindex(seq)
    gpu = busy_s(o, "gpu_busy_time_s", "gpu_time_s")
    n = rp.gapped_kernels(o["n_kernels"], gpu, o["gpu_time_s"])
    if not training:
        return pd.DataFrame({"host": o["host_time_s"], "gpu": gpu, "n": n}).reset_index()
    fwd_gpu = busy_s(o, "forward_gpu_busy_time_s", "forward_gpu_time_s")
    fwd_n = rp.gapped_kernels(o["forward_n_kernels"], fwd_gpu, o["forward_gpu_time_s"])
    fwd = pd.DataFrame({"host": o["forward_host_time_s"], "gpu": fwd_gpu, "n": fwd_n})
    r = o.iloc[::-1]
    bwd = pd.DataFrame(
        {
            "host": r["host_time_s"] - r["forward_host_time_s"],
            "gpu": (gpu - fwd_gpu).to_numpy()[::-1],
            "n": (n - fwd_n)[::-1],
        }
    )
    return pd.concat([fwd.reset_index(), bwd.reset_index()], ignore_index=True)


def _net_gpu_s(net: pd.Series) -> tuple[float, float]:
    """A network's GPU time in its forward pass and in its step: busy time where its
    trace records it, else the kernels' durations summed."""
    fwd, whole = net.get("forward_gpu_busy_time_s"), net.get("gpu_busy_time_s")
    if fwd is not None and whole is not None and pd.notna(fwd) and pd.notna(whole):
        return float(fwd), float(whole)
    return float(net["forward_gpu_time_s"]), float(net["gpu_time_s"])


def _scaled(values: pd.Series, forward: pd.Series, fwd_total: float, total: float) -> pd.Series:
    """``values`` scaled per pass so that the forward spans add up to ``fwd_total`` and
    the backward spans to ``total - fwd_total`` (a pass of zero is left as it is)."""
    fwd_sum = float(values[forward].sum())
    bwd_sum = float(values[~forward].sum())
    scale_fwd = fwd_total / fwd_sum if fwd_sum > 0 else 1.0
    scale_bwd = (total - fwd_total) / bwd_sum if bwd_sum > 0 else 1.0
    return values * np.where(forward, scale_fwd, scale_bwd)


def _own(net: pd.Series, spans: pd.DataFrame, repeats: int, kernel_gap_s: float) -> rp.Replay:
    """The network's breakdown replayed, each pass's spans scaled so that their host
    times add up to the pass's untraced host time, and their GPU times to the pass's
    GPU time in the unannotated trace. The spans tile each traced pass and are its mean
    over the traced steps, so their own sums are what they are scaled from (the record's
    traced host times are medians: a slow first traced step would skew the scale). The
    GPU scale undoes what annotating the calls changes (attention's fused path off) and
    kernels of consecutive calls that overlap on several streams, which no span holds;
    for the same reason the kernels that take the device's gap (``kernel_gap_s``) are
    each pass's share (:func:`opcost.replay.gapped_kernels` of the pass's busy and summed
    kernel time)."""
    spans = spans.sort_values("index")
    forward = spans["phase"] == "forward"
    host = _scaled(spans["host_s"], forward, net["forward_host_time_s"], net["host_time_s"])
    fwd_busy, busy = _net_gpu_s(net)
    gpu = _scaled(busy_s(spans, "gpu_busy_s", "gpu_s"), forward, fwd_busy, busy)
    fwd_sum, summed = float(net["forward_gpu_time_s"]), float(net["gpu_time_s"])
    n = spans["n_kernels"].to_numpy(dtype=float)
    kernels = np.where(
        forward,
        rp.gapped_kernels(n, fwd_busy, fwd_sum),
        rp.gapped_kernels(n, busy - fwd_busy, summed - fwd_sum),
    )
    return rp.replay(
        list(host),
        list(gpu),
        list(kernels),
        kernel_gap_s=kernel_gap_s,
        sync_s=_or0(net["sync_s"]),
        repeats=repeats,
    )


def _or0(x: float) -> float:
    return 0.0 if x is None or pd.isna(x) else float(x)


def replay_validation(
    dataset: pd.DataFrame, sequences: dict[str, list[str]], breakdown: pd.DataFrame
) -> pd.DataFrame:
    """One row per traced network (module docstring)."""
    rows = []
    traced = dataset[dataset["gpu_time_s"].notna()]
    for (gpu, setting, mode), part in traced.groupby(_KEYS, sort=True):
        ops = part[part["kind"] == "op"].set_index("op_id")
        gap = float(ops["launch_gap_s"].median()) if ops["launch_gap_s"].notna().any() else 0.0
        p_wait = waiting_power_w(ops)
        p_busy = busy_power_w(ops, p_wait)
        nets = part[part["kind"] == "network"]
        nets_gpu = busy_s(nets, "gpu_busy_time_s", "gpu_time_s")
        for index, net in nets.iterrows():
            seq = sequences.get(net["model_input"])
            if not seq or not set(seq) <= set(ops.index):
                continue
            steps = _isolated_steps(seq, ops, mode == "training")
            repeats = int(net["trace_number_per_run"])
            iso = rp.replay(
                list(steps["host"]),
                list(steps["gpu"]),
                list(steps["n"]),
                kernel_gap_s=gap,
                sync_s=_or0(net["sync_s"]),
                repeats=repeats,
            )
            busy_j = float((steps["gpu"] * p_busy.reindex(steps["op_id"]).to_numpy()).sum())
            gpu_sum = float(steps["gpu"].sum())
            energy = rp.step_energy_j(busy_j, p_wait, iso.time_s, gpu_sum)
            spans = breakdown[
                (breakdown["gpu"] == gpu)
                & (breakdown["setting"] == setting)
                & (breakdown["mode"] == mode)
                & (breakdown["model_input"] == net["model_input"])
            ]
            own = _own(net, spans, repeats, gap) if len(spans) else None
            burst = net.get("host_burst_steps")
            paired = len(spans) and pd.notna(net.get("burst_wall_time_s")) and pd.notna(burst)
            own_burst = _own(net, spans, int(burst), gap).time_s if paired else math.nan
            iso_graph = rp.graph_replay(list(steps["gpu"]), list(steps["n"]))
            own_graph = rp.graph_replay([nets_gpu[index]], [net["n_kernels"]])
            graph_energy = rp.step_energy_j(busy_j, p_wait, iso_graph.time_s, gpu_sum)
            rows.append(
                {
                    "gpu": gpu,
                    "setting": setting,
                    "mode": mode,
                    "model_input": net["model_input"],
                    "time_s": net["time_s"],
                    "trace_wall_time_s": net["trace_wall_time_s"],
                    "host_time_s": net["host_time_s"],
                    "gpu_time_s": net["gpu_time_s"],
                    "plain_sum_time_s": float(ops["time_s"].reindex(seq).sum()),
                    "plain_sum_trace_wall_time_s": float(
                        ops["trace_wall_time_s"].reindex(seq).sum()
                    ),
                    "replay_isolated_time_s": iso.time_s,
                    "replay_isolated_bound": iso.bound,
                    "replay_own_time_s": own.time_s if own else math.nan,
                    "replay_own_bound": own.bound if own else None,
                    "burst_wall_time_s": net.get("burst_wall_time_s", math.nan),
                    "replay_own_burst_time_s": own_burst,
                    "energy_j": net["energy_j"],
                    "plain_sum_energy_j": float(ops["energy_j"].reindex(seq).sum()),
                    "replay_isolated_energy_j": energy,
                    "waiting_power_w": p_wait,
                    "graph_time_s": net.get("graph_time_s", math.nan),
                    "replay_isolated_graph_time_s": iso_graph.time_s,
                    "replay_own_graph_time_s": own_graph.time_s,
                    "graph_energy_j": net.get("graph_energy_j", math.nan),
                    "replay_isolated_graph_energy_j": graph_energy,
                    "host_probe_s": net["host_probe_s"],
                    "host_cpu": net["host_cpu"],
                }
            )
    return pd.DataFrame(rows)
