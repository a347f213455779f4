"""Tests for opcost.model.opmodel against the committed op-space measurements
(data/op-space, H100 and H200, 2026-11-24): GPU time is learnt over the roofline time
plus the shortest kernel, the efficiency stays in (0, 1], the ceilings bound every
sample, views cost no GPU time, and a TF32-off configuration borrows only the families
it lacks from its twin."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.config import schema_defaults
from opcost.model import (
    base_time,
    in_network,
    op_power,
    op_scores,
    op_tables,
    opmodel,
    shapes,
    shares,
)
from opcost.model import roofline as rl
from opcost.train import TrainConfig, make_regressor
from opcost.validate.replay import WAIT_SHARE, busy_power_w, waiting_power_w

DATA = Path(__file__).resolve().parents[1] / "data" / "op-space"


def _load(gpu: str) -> pd.DataFrame:
    files = sorted(glob.glob(str(DATA / gpu / "*.parquet")))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def _round_ids(*rounds: int) -> set[str]:
    """The op ids that op-space rounds ``rounds`` sampled."""
    return set(
        pd.concat([pd.read_parquet(DATA / f"samples-r{r}.parquet") for r in rounds])["op_id"]
    )


def _make():
    return make_regressor(TrainConfig(regressor="extra_trees", n_estimators=10), n_jobs=1)


def _make_shipped():
    """Regressors as ``snakemake op_models`` makes them (``op_space.model`` defaults)."""
    model = schema_defaults("op_space", "model")
    cfg = TrainConfig(
        regressor=model["regressor"],
        n_estimators=model["n_estimators"],
        min_samples_leaf=model["min_samples_leaf"],
        seed=model["seed"],
    )
    return make_regressor(cfg, n_jobs=1)


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    table = _load("h100")
    # Every family, a share of each (the fit stays quick).
    return table.groupby("family", group_keys=False).head(60).reset_index(drop=True)


@pytest.fixture(scope="module")
def model(h100: pd.DataFrame) -> opmodel.OpModel:
    return opmodel.fit(h100, "h100", _make)


def test_gpu_time_and_power_get_the_configured_trees_the_other_targets_a_quarter(
    model: opmodel.OpModel, h100: pd.DataFrame
) -> None:
    # _make asks for 10 trees: GPU time and busy power get 10, host time, kernel counts
    # and the forward shares max(6, 10 // 4) = 6.
    for fam in model.families.values():
        for target, ens in fam.fits.items():
            assert len(ens.roots) == (10 if target == "time" else 6), target
    assert len(model.power_fit.roots) == 10
    many = lambda: make_regressor(TrainConfig(regressor="extra_trees", n_estimators=40), n_jobs=1)  # noqa: E731
    conv = h100[h100["family"] == "conv"].reset_index(drop=True)
    fam = opmodel.fit(conv, "h100", many).families["conv"]
    trees = {t: len(e.roots) for t, e in fam.fits.items()}
    assert trees.pop("time") == 40
    assert {"host", "kernels"} <= set(trees)
    assert set(trees.values()) == {10}


def test_ceilings_bound_every_sample(h100: pd.DataFrame, model: opmodel.OpModel) -> None:
    rows = op_tables.training_rows(h100)
    rows = rows[(rows["gpu_time_s"] > 0) & rows["family"].ne("view")]
    roof = rl.roofline_times_s(list(rows["spec"]), list(rows["mode"]), model.ceilings)
    # No sample beats its roofline time against the ceilings: efficiency <= 1.
    assert np.all(roof <= rows["gpu_time_s"].to_numpy() * (1 + 1e-9))
    # The ceilings are the measured peaks, raised only where a sample went faster.
    assert model.ceilings.matmul_flops_per_s >= model.peaks.matmul_flops_per_s
    assert model.ceilings.memory_bytes_per_s >= model.peaks.memory_bytes_per_s
    assert model.peaks.matmul_flops_per_s == pytest.approx(h100["peak_matmul_flops_per_s"].median())
    # A layer norm's rows: the highest rate a sample achieved, which one meets exactly.
    works = [rl.op_work(json.loads(s), m) for s, m in zip(rows["spec"], rows["mode"], strict=True)]
    rates = np.array([w.rows for w in works]) / rows["gpu_time_s"].to_numpy()
    assert rates.max() > 0
    assert model.ceilings.rows_per_s == pytest.approx(rates.max())
    assert model.peaks.rows_per_s == math.inf  # measure_peaks measures no row rate


def test_layer_norms_have_trees_of_their_own(h100: pd.DataFrame, model) -> None:
    """Layer norms, bounded by their rows, and the other norms, by their bytes, are learnt
    apart: each model holds only its own op types, and each predicts its own."""
    layer = model.families[opmodel.ROW_NORM_MODEL].schema.op_types
    other = model.families["norm"].schema.op_types
    assert "torch.nn.modules.normalization.LayerNorm" in layer
    assert "torch.nn.modules.batchnorm.BatchNorm2d" in other
    assert not set(layer) & set(other)
    assert opmodel.model_key("norm", "torch.nn.functional.layer_norm") == opmodel.ROW_NORM_MODEL
    assert opmodel.model_key("norm", "torch.nn.modules.batchnorm.BatchNorm2d") == "norm"
    assert opmodel.model_key("linear", "torch.nn.modules.linear.Linear") == "linear"
    # Power is learnt per family: the layer norms' windows are the norm family's.
    assert opmodel.ROW_NORM_MODEL not in model.power_families
    norms = h100[h100["family"] == "norm"].drop_duplicates("op_id").head(40)
    p = model.predict(norms[["spec", "mode", "op_type"]], isolated=True)
    assert (p["family"] == "norm").all()
    assert (p["gpu_time_s"] >= p["roofline_time_s"]).all()


def test_prediction_is_roofline_over_efficiency(h100: pd.DataFrame, model) -> None:
    ops = h100[["spec", "mode", "op_type"]].drop_duplicates()
    p = model.predict(ops, isolated=True)  # the op measured alone, as the samples were
    kernels = p["family"].ne("view") & (p["roofline_time_s"] > 0)
    eff = p.loc[kernels, "efficiency"]
    assert (eff > 0).all()
    assert (eff <= 1).all()
    np.testing.assert_allclose(
        p.loc[kernels, "gpu_time_s"], p.loc[kernels, "roofline_time_s"] / eff, rtol=1e-12
    )
    # Views launch no kernels: no GPU time, and host time only.
    views = p["family"].eq("view")
    assert views.any()
    assert (p.loc[views, "gpu_time_s"] == 0).all()
    assert (p["host_time_s"] > 0).all()
    # In training the forward pass is a part of the step, in inference all of it.
    train = (ops["mode"] == "training").to_numpy()
    assert (p.loc[train, "forward_gpu_time_s"] <= p.loc[train, "gpu_time_s"] + 1e-15).all()
    assert (p.loc[~train, "forward_gpu_time_s"] == p.loc[~train, "gpu_time_s"]).all()
    # A call in a network runs no gradient copies for leaf inputs: never slower than the
    # isolated op, never faster than its forward pass; the same in inference.
    net = model.predict(ops)
    assert (net["gpu_time_s"] <= p["gpu_time_s"] * (1 + 1e-12)).all()
    assert (net["gpu_time_s"] >= net["forward_gpu_time_s"] * (1 - 1e-12)).all()
    assert (net.loc[~train, "gpu_time_s"] == p.loc[~train, "gpu_time_s"]).all()
    assert (net.loc[train, "gpu_time_s"] < p.loc[train, "gpu_time_s"]).any()


def test_a_reshape_that_copies_is_predicted_as_the_copy_it_runs(model) -> None:
    """A view-like op that moves bytes runs a copy kernel: a reshape of a permuted map
    (no view of it has the new shape) is predicted by the copy family's models, as the
    ``contiguous`` of the same input; the same reshape of a contiguous input stays free."""
    x = {"dtype": "float32", "param": False, "shape": [8, 7, 8, 7, 8, 96]}
    strided = dict(x, stride=[301056, 43008, 768, 6144, 96, 1])
    reshape = {
        "args": [{"__tensor__": 0}, 8, 56, 56, 96],
        "inputs": [strided],
        "kind": "function",
        "kwargs": {},
        "outputs": [{"dtype": "float32", "shape": [8, 56, 56, 96]}],
        "type": "torch.Tensor.reshape",
    }
    contiguous = dict(reshape, type="torch.Tensor.contiguous", args=[{"__tensor__": 0}])
    contiguous["outputs"] = [{"dtype": "float32", "shape": x["shape"]}]
    viewed = dict(reshape, inputs=[x])
    specs = [
        json.dumps(s, sort_keys=True, separators=(",", ":")) for s in (reshape, contiguous, viewed)
    ]
    p = model.predict(pd.DataFrame({"spec": specs, "mode": "inference"}))
    assert list(p["family"]) == ["copy", "copy", "view"]
    assert p["gpu_time_s"].iloc[0] > 0
    assert p["gpu_time_s"].iloc[0] == pytest.approx(p["gpu_time_s"].iloc[1], rel=0.2)
    assert p["gpu_time_s"].iloc[2] == 0


def test_kernel_floor_is_the_samples_shortest_kernel(h100: pd.DataFrame, model) -> None:
    rows = op_tables.training_rows(h100)
    rows = rows[(rows["gpu_time_s"] > 0) & (rows["n_kernels"] > 0)]
    per_kernel = np.sort((rows["gpu_time_s"] / rows["n_kernels"]).to_numpy())
    # The 1st percentile, by hand: numpy's linear interpolation between order statistics.
    rank = 0.01 * (len(per_kernel) - 1)
    lo = int(math.floor(rank))
    by_hand = per_kernel[lo] + (rank - lo) * (per_kernel[lo + 1] - per_kernel[lo])
    assert model.kernel_floor_s == pytest.approx(by_hand, rel=1e-12)
    # A Hopper kernel takes about a microsecond at the least.
    assert 0.5e-6 < model.kernel_floor_s < 3e-6


def test_base_time_is_roofline_plus_one_floor_per_pass() -> None:
    roof = np.array([0.0, 2e-6, 1e-3])
    base = base_time.base_time_s(roof, np.array([False, True, False]), 1.5e-6)
    np.testing.assert_allclose(base, [1.5e-6, 2e-6 + 3e-6, 1e-3 + 1.5e-6], rtol=1e-12)


def test_a_tiny_op_is_predicted_near_the_floor_not_its_roofline_time(model) -> None:
    # A ReLU over 64 floats: its roofline time (512 bytes moved) is under a nanosecond,
    # but a kernel cannot take less than the floor: the prediction is about the floor.
    spec = json.dumps(
        {"args": [{"__tensor__": 0}], "attrs": {"inplace": False},
         "inputs": [{"dtype": "float32", "param": False, "shape": [1, 64]}],
         "kind": "module", "kwargs": {}, "outputs": [{"dtype": "float32", "shape": [1, 64]}],
         "type": "torch.nn.modules.activation.ReLU"}, sort_keys=True, separators=(",", ":"),
    )  # fmt: skip
    p = model.predict(pd.DataFrame({"spec": [spec], "mode": ["inference"]}))
    assert p["roofline_time_s"].iloc[0] < 1e-8
    assert 0.5 * model.kernel_floor_s < p["gpu_time_s"].iloc[0] < 5 * model.kernel_floor_s


def test_heavier_op_than_any_sample_scales_with_its_work(model: opmodel.OpModel) -> None:
    # A Linear far beyond the sampled widths (8..8192): a forest of log time would predict
    # the largest sample's time; through the roofline, time grows with the work.
    def linear(fin: int, fout: int, batch: int) -> str:
        return json.dumps(
            {"args": [{"__tensor__": 0}], "attrs": {"bias": True, "in_features": fin,
             "out_features": fout}, "inputs": [{"dtype": "float32", "param": False,
             "shape": [batch, fin]}], "kind": "module", "kwargs": {},
             "outputs": [{"dtype": "float32", "shape": [batch, fout]}],
             "type": "torch.nn.modules.linear.Linear"}, sort_keys=True, separators=(",", ":"),
        )  # fmt: skip

    ops = pd.DataFrame(
        {"spec": [linear(16384, 16384, 256), linear(16384, 16384, 1024)], "mode": "inference"}
    )
    p = model.predict(ops)
    assert p["gpu_time_s"].iloc[1] > 2 * p["gpu_time_s"].iloc[0]


def test_tf32_off_borrows_only_the_families_it_lacks() -> None:
    own = _load("h100-notf32").groupby("family", group_keys=False).head(30)
    twin = _load("h100").groupby("family", group_keys=False).head(30)
    m = opmodel.fit(own, "h100-notf32", _make, twin=twin)
    keys = {
        opmodel.model_key(f, t)
        for rows in (own, twin)
        for f, t in zip(rows["family"], rows["op_type"], strict=True)
    }
    assert set(m.families) == keys
    # Its own rows set the peaks: TF32 off, the matmul peak is the FP32 one (~51 TFLOP/s).
    assert (
        m.peaks.matmul_flops_per_s < 0.2 * opmodel.fit(twin, "h100", _make).peaks.matmul_flops_per_s
    )
    assert m.meta["tf32"] is False


def test_busy_power_from_the_power_windows(model: opmodel.OpModel, h100) -> None:
    # P_wait: the median power of samples busy < 10 % of their window, else idle power.
    p = h100[h100["power_w"].notna()]
    low = p.loc[p["gpu_time_s"] / p["power_time_s"] < 0.1, "power_w"]
    expected = low.median() if len(low) else h100["idle_power_w"].median()
    assert model.wait_power_w == pytest.approx(expected)
    busy = model.predict(h100[["spec", "mode", "op_type"]].head(40))["busy_power_w"]
    # An H100 SXM draws between its idle power (~70 W) and its 700 W limit.
    assert busy.between(60, 720).all()


def test_leaf_overhead_from_views_and_the_backward_node() -> None:
    # Two chunks of view samples, probes 2 and 4 ms: backward host 60 and 120 us (30 us a
    # ms of probe), a trivial node 10 and 20 us (5 us a ms): the leaf costs 25 us a ms.
    rows = pd.DataFrame(
        {
            "family": ["view", "view", "view"],
            "mode": ["training", "training", "inference"],
            "host_time_s": [80e-6, 160e-6, 20e-6],
            "forward_host_time_s": [20e-6, 40e-6, 20e-6],
            "host_probe_s": [2e-3, 4e-3, 2e-3],
            "backward_node_s": [10e-6, 20e-6, 10e-6],
        }
    )
    overhead, node = in_network.leaf_overhead(rows)
    assert node == pytest.approx(5e-3)
    assert overhead == pytest.approx(30e-3 - 5e-3)
    assert in_network.leaf_overhead(rows.drop(columns="backward_node_s")) == (0.0, 0.0)


def test_network_calls_do_not_pay_their_leaves(h100: pd.DataFrame, model) -> None:
    m = opmodel.OpModel(
        **{**model.__dict__, "leaf_overhead_ratio": 4e-3, "backward_node_ratio": 2e-3}
    )
    ops = h100[h100["op_type"].str.endswith(("add", "ReLU", "Conv2d"))][["spec", "op_type"]]
    ops = ops.drop_duplicates("spec").assign(mode="training")
    alone = m.predict(ops, isolated=True)
    in_net = m.predict(ops)
    probe = m.host_probe_s
    leaves = np.array([in_network.leaf_inputs(s) for s in ops["spec"]])
    assert set(leaves) >= {1, 2}  # add takes two tensors; ReLU and Conv2d one
    backward = alone["host_time_s"] - alone["forward_host_time_s"]
    expected = alone["forward_host_time_s"] + np.maximum(
        backward - leaves * 4e-3 * probe, np.minimum(backward, 2e-3 * probe)
    )
    np.testing.assert_allclose(in_net["host_time_s"], expected, rtol=1e-12)
    np.testing.assert_allclose(in_net["forward_host_time_s"], alone["forward_host_time_s"])
    # GPU time: an add's leaf gradients are copies a network's call does not run
    # (tests/test_leaf_grads.py); ReLU's and a convolution's are computed, and kept.
    adds = ops["op_type"].str.endswith("add").to_numpy()
    np.testing.assert_allclose(in_net["gpu_time_s"][~adds], alone["gpu_time_s"][~adds])
    assert (in_net["gpu_time_s"][adds] < alone["gpu_time_s"][adds]).all()
    inference = m.predict(ops.assign(mode="inference"))
    np.testing.assert_allclose(
        inference["host_time_s"],
        m.predict(ops.assign(mode="inference"), isolated=True)["host_time_s"],
    )


def test_graph_power_windows_teach_the_busy_power_of_microsecond_kernels() -> None:
    # Round 4 windowed every configuration from a CUDA graph (data/op-space/README.md).
    # Half of its configurations held out: their measured busy power where kernels run
    # under 5 us each, against the model fitted on the rest, and on the rest less round 4
    # and the convolutions' power rounds 16 and 17, also windowed from CUDA graphs
    # (windows of GPU-bound configurations only, whose kernels are long).
    table = _load("h100")
    round_4 = sorted(pd.read_parquet(DATA / "samples-r4.parquet")["op_id"])
    graphed = {*round_4, *_round_ids(16, 17)}
    held = set(round_4[::2])
    with_graphs = opmodel.fit(table[~table["op_id"].isin(held)], "h100", _make)
    without = opmodel.fit(table[~table["op_id"].isin(graphed)], "h100", _make)
    h = table[table["op_id"].isin(held) & table["power_w"].notna() & table["gpu_time_s"].gt(0)]
    h = h[h["gpu_time_s"] < 5e-6 * h["n_kernels"]]
    assert len(h) >= 40
    t, g = h["power_time_s"], h["gpu_time_s"].clip(upper=h["power_time_s"])

    def ratio(m: opmodel.OpModel) -> float:
        busy = (h["power_w"] * t - m.wait_power_w * (t - g)) / g
        pred = m.predict(h[["spec", "mode", "op_type"]])["busy_power_w"].to_numpy()
        return float(np.median(pred / busy.to_numpy()))

    assert abs(ratio(with_graphs) - 1) < 0.15
    assert ratio(without) > 1.5  # long kernels' power, taken for short ones


def test_busy_power_is_learnt_only_from_windows_the_kernels_keep_busy() -> None:
    # A window busy 10-50 % of its time: changing its power changes no busy prediction.
    h100 = _load("h100")
    share = h100["gpu_time_s"] / h100["power_time_s"]
    mid = h100["power_w"].notna() & share.between(WAIT_SHARE, op_power.BUSY_SHARE * 0.999)
    assert mid.any()
    noisy = h100.assign(power_w=h100["power_w"].where(~mid, 5000.0))
    ops = h100[["spec", "mode", "op_type"]].head(40)
    a = opmodel.fit(h100, "h100", _make).predict(ops)["busy_power_w"]
    b = opmodel.fit(noisy, "h100", _make).predict(ops)["busy_power_w"]
    np.testing.assert_allclose(a.to_numpy(), b.to_numpy())


def test_a_windows_busy_power_counts_the_time_its_kernels_keep_the_gpu_busy() -> None:
    windows = pd.DataFrame(
        {
            "power_w": [300.0, 300.0],
            "power_time_s": [1.0, 1.0],
            "gpu_time_s": [0.8, 0.8],
            "gpu_busy_time_s": [0.5, np.nan],  # overlapping kernels; not recorded
        }
    )
    busy = op_power.window_busy_power_w(windows, 100.0)
    # (300 * 1 - 100 * (1 - 0.5)) / 0.5 and (300 * 1 - 100 * (1 - 0.8)) / 0.8.
    np.testing.assert_allclose(busy, [500.0, 350.0])


def test_busy_power_knows_how_much_of_the_gpu_a_convolution_fills() -> None:
    """alexnet's float32 convolutions of one image (data/hopper, isolated, H100 with TF32
    off, windows the kernels keep busy) draw 190-290 W while they run: their grids fill
    few SMs. The power model, which sees the op's shape, predicts them within a third in
    median (models as shipped); without the shape it predicted about 400 W (twice), as
    for a full GPU."""
    model = opmodel.fit(_load("h100-notf32"), "h100-notf32", _make_shipped)
    assert set(shapes.SHAPE_FEATURES) <= set(op_power.power_columns(model.power_families))
    repo = DATA.parents[1]
    ops = pd.read_parquet(repo / "data/hopper/ops/alexnet_1x3x224x224.parquet")
    d = pd.read_parquet(repo / "data/hopper/h100-notf32/dataset/h100-notf32.parquet")
    d = d[(d["kind"] == "op") & (d["mode"] == "inference")]
    convs = d[d["op_id"].isin(ops["op_id"]) & d["op_type"].str.endswith("Conv2d")]
    convs = convs[convs["gpu_time_s"] >= 0.85 * convs["time_s"]]
    assert len(convs) >= 3
    measured = busy_power_w(convs, waiting_power_w(d))
    assert measured.between(150, 300).all()
    predicted = model.predict(convs[["spec", "mode", "op_type"]])["busy_power_w"]
    ratio = predicted.to_numpy() / measured.to_numpy()
    assert 0.67 < np.median(ratio) < 1.33, ratio
    assert (ratio < 1.9).all(), ratio


def _busy_by_hand(rows: pd.DataFrame) -> pd.Series:
    """Each power window's busy power, ``(P t - P_wait (t - g)) / g``, ``g`` the kernels'
    busy time (their summed time where not recorded), ``P_wait`` the median power of the
    windows busy under 10 % of their time (else idle power), indexed by (op id, mode)."""
    p = rows[rows["status"].eq("ok") & rows["power_w"].notna()]
    low = p.loc[p["gpu_time_s"] / p["power_time_s"] < WAIT_SHARE, "power_w"]
    wait = low.median() if len(low) else rows["idle_power_w"].median()
    p = p[p["gpu_time_s"] >= 0.5 * p["power_time_s"]]
    busy = p["gpu_busy_time_s"].fillna(p["gpu_time_s"]).clip(upper=p["power_time_s"])
    watts = (p["power_w"] * p["power_time_s"] - wait * (p["power_time_s"] - busy)) / busy
    return pd.Series(watts.to_numpy(), index=pd.MultiIndex.from_arrays([p["op_id"], p["mode"]]))


def test_power_windows_both_gpus_measured_give_each_family_its_ratio() -> None:
    h100, h200 = _load("h100"), _load("h200")
    ratios, overall, pairs = op_power.peer_ratios(h100, h200)
    a, b = _busy_by_hand(h100), _busy_by_hand(h200)
    a, b = a[~a.index.duplicated()], b[~b.index.duplicated()]
    both = a.index.intersection(b.index)
    family = h200.drop_duplicates(["op_id", "mode"]).set_index(["op_id", "mode"])["family"]
    log_ratio = np.log(a.loc[both] / b.loc[both])
    by_family = log_ratio.groupby(family.loc[both].to_numpy())
    assert pairs == len(both) > 700  # the power rounds 4, 16 and 17, both GPUs
    assert overall == pytest.approx(math.exp(log_ratio.median()))
    expected = {f: math.exp(r.median()) for f, r in by_family if len(r) >= 20}
    assert ratios == pytest.approx(expected)
    assert {"conv", "norm", "activation"} <= set(ratios)
    # One die: an op's busy power on the two GPUs is within a sixth.
    assert all(0.85 < r < 1.15 for r in ratios.values())


def test_power_windows_only_the_peer_measured_teach_the_busy_power() -> None:
    """The H200 alone measured power windows of the norms of a network's stage (rounds 31
    and 34) and of pooling, attention, activations and elementwise ops (round 32). The
    H100's busy-power model learns them at the H200's busy power times the family's ratio
    of the windows both GPUs measured; alone it knows norms from generator 1's only."""
    h100, h200 = _load("h100"), _load("h200")
    carried = op_power.peer_windows(h100, h200)
    own_keys = keys(op_power.power_windows(h100))
    assert not keys(carried) & own_keys
    assert _round_ids(31, 32, 34) <= set(carried["op_id"])
    ratios, overall, _ = op_power.peer_ratios(h100, h200)
    by_hand = _busy_by_hand(h200)
    by_hand = by_hand[~by_hand.index.duplicated()]  # a configuration two rounds drew: the first
    by_hand = by_hand.loc[list(zip(carried["op_id"], carried["mode"], strict=True))]
    scale = carried["family"].map(lambda f: ratios.get(f, overall)).to_numpy()
    np.testing.assert_allclose(carried["busy_power_w"], by_hand.to_numpy() * scale, rtol=1e-9)

    # Half the norms held out of the H200's table: the H100's model learns their
    # neighbours through the ratio, and predicts them closer than alone.
    ids = np.array(sorted(_round_ids(31, 34)))
    held = set(np.random.default_rng(0).choice(ids, len(ids) // 2, replace=False))
    norms = carried[carried["op_id"].isin(held)]
    expected = norms["busy_power_w"].to_numpy()

    def error(model: opmodel.OpModel) -> float:
        pred = model.predict(norms[["spec", "mode", "op_type"]])["busy_power_w"].to_numpy()
        return float(np.median(np.abs(pred / expected - 1)))

    alone = error(opmodel.fit(h100, "h100", _make))  # 14 %
    pooled = error(opmodel.fit(h100, "h100", _make, peers=h200[~h200["op_id"].isin(held)]))
    assert pooled < 0.1  # 8 %
    assert pooled < 0.7 * alone


def test_the_busy_share_is_learnt_where_kernels_overlap() -> None:
    """Grouped convolutions whose kernels cuDNN runs on several streams at once keep the
    GPU busy for less than their summed kernel time (round 15 records both, TF32 off);
    the model predicts that share, never above 1, and 1 where no sample recorded it."""
    files = ["2.parquet", "r13-0.parquet", "r15-0.parquet", "r15-1.parquet"]
    table = pd.concat([pd.read_parquet(DATA / "h100-notf32" / f) for f in files])
    table = table.reset_index(drop=True)
    model = opmodel.fit(table, "h100-notf32", _make)
    assert "busy" in model.families["conv"].fits
    assert "busy" not in model.families["linear"].fits  # no linear sample records it
    rows = table[(table["status"] == "ok") & (table["gpu_time_s"] > 0)]
    p = model.predict(rows[["spec", "mode", "op_type"]], isolated=True)
    measured = (rows["gpu_busy_time_s"] / rows["gpu_time_s"]).to_numpy()
    predicted = (p["gpu_busy_time_s"] / p["gpu_time_s"]).to_numpy()
    fwd = (p["forward_gpu_busy_time_s"] / p["forward_gpu_time_s"]).to_numpy()
    assert (predicted <= 1.0).all()
    np.testing.assert_allclose(fwd, predicted, rtol=1e-12)
    recorded = np.isfinite(measured)
    overlap = recorded & (measured < 0.6)
    serial = recorded & (measured > 0.999)
    assert overlap.sum() >= 30
    assert np.median(predicted[overlap]) < 0.75
    assert np.median(predicted[serial]) > 0.97
    no_record = (p["family"] == "linear").to_numpy()
    np.testing.assert_array_equal(predicted[no_record], 1.0)


def test_the_graph_share_is_learnt_where_a_graph_runs_kernels_at_once() -> None:
    """From a CUDA graph, cuDNN's per-group kernels of a grouped convolution run at once
    where eager launches leave them apart: rounds 16-17 and 35 (H200, TF32 off) windowed
    their samples from graphs. The model predicts a call's busy time from a graph, never
    above its eager busy time, short where the windows were, and equal to it for a
    family with fewer graphed windows than ``MIN_GRAPH_WINDOWS`` (round 47's linear
    layers: 2)."""
    files = ["r16-0.parquet", "r17-0.parquet", "r35-0.parquet", "r47-0.parquet"]
    table = pd.concat([pd.read_parquet(DATA / "h200-notf32" / f) for f in files])
    table = table.reset_index(drop=True)
    model = opmodel.fit(table, "h200-notf32", _make)
    assert "graph" in model.families["conv"].fits
    rows = table[(table["status"] == "ok") & (table["gpu_time_s"] > 0)]
    p = model.predict(rows[["spec", "mode", "op_type"]], isolated=True)
    predicted = (p["graph_busy_time_s"] / p["gpu_busy_time_s"]).to_numpy()
    fwd = (p["forward_graph_busy_time_s"] / p["forward_gpu_busy_time_s"]).to_numpy()
    assert (predicted <= 1.0).all()
    np.testing.assert_allclose(fwd, predicted, rtol=1e-12)
    # A call of a few kernels a pass runs them one after the other, from a graph too.
    few = shares.kernels_per_pass(p.assign(mode=rows["mode"].to_numpy())) <= 8
    assert few.sum() >= 100
    np.testing.assert_array_equal(predicted[few], 1.0)
    measured = shares.graph_share(rows)
    conv = (p["family"] == "conv").to_numpy()
    at_once = conv & (measured < 0.5)
    serial = conv & (measured >= 1.0)
    assert at_once.sum() >= 20
    assert np.median(predicted[at_once]) < 0.7
    assert np.median(predicted[serial]) > 0.95
    assert "graph" not in model.families["linear"].fits
    np.testing.assert_array_equal(predicted[(p["family"] == "linear").to_numpy()], 1.0)


def _conv_spec(n: int, cin: int, cout: int, hw: int) -> str:
    from opcost import opspace

    params = {
        "batch": n, "cin": cin, "cout": cout, "kernel": 1, "stride": 1, "dilation": 1,
        "groups": 1, "spatial": hw, "bias": False, "channels_last": False,
    }  # fmt: skip
    return json.dumps(opspace.build("conv", params), sort_keys=True)


def test_a_family_knows_its_sampled_sizes_and_names_an_op_beyond_them(model, h100) -> None:
    conv = model.families["conv"]
    # The ranges are the samples' own: the implicit GEMM's m (output pixels x batch) of
    # the family's training rows, by hand from their specs.
    rows = op_tables.training_rows(h100)
    ms = [shapes.shape_features(s)[shapes.SHAPE_FEATURES.index("log_gemm_m")] for s in
          rows.loc[rows["family"] == "conv", "spec"]]  # fmt: skip
    assert conv.ranges["log_gemm_m"] == pytest.approx((min(ms), max(ms)))
    lo_m = round(math.exp(conv.ranges["log_gemm_m"][0]))
    assert lo_m > 1
    # A squeeze-and-excitation convolution: 1x1 on a 1x1 map at batch 1, so m = 1.
    flags = conv.outside(_conv_spec(1, 960, 240, 1))
    assert flags == [f"gemm_m 1 (sampled {lo_m}-{math.exp(conv.ranges['log_gemm_m'][1]):.0f})"]
    # One inside every sampled range: nothing to say.
    assert conv.outside(_conv_spec(8, 256, 256, 14)) == []


# -- pooling the GPUs' samples (op_space.model.pool_gpus) -----------------------------------


def keys(table: pd.DataFrame) -> set[tuple[str, str]]:
    """A table's samples as (configuration, mode) pairs."""
    return set(zip(table["op_id"], table["mode"], strict=True))


def _tables() -> dict[str, pd.DataFrame]:
    def read(gpu: str) -> pd.DataFrame:
        files = glob.glob(str(DATA / gpu / "*.parquet"))
        return pd.concat([pd.read_parquet(f, columns=["tf32", "gpu_name", "dtype"]) for f in files])

    return {gpu: read(gpu) for gpu in ("h100", "h200", "h100-notf32", "h200-notf32")}


def test_a_configurations_peers_run_its_numerics_on_another_gpu() -> None:
    tables = _tables()
    assert op_tables.peers_of(tables, "h100") == ["h200"]
    assert op_tables.peers_of(tables, "h200-notf32") == ["h100-notf32"]
    # Another configuration of the same GPU is no peer (it is a twin, or the same).
    same_gpu = {**tables, "h100-again": tables["h100"]}
    assert op_tables.peers_of(same_gpu, "h100") == ["h200"]


def test_pooled_rows_keep_a_configurations_own_measurement_and_add_what_only_a_peer_measured():
    own = _load("h200-notf32")
    peer = _load("h100-notf32")
    twin = pd.concat([_load("h200"), _load("h100")], ignore_index=True)
    mine, pooled = op_tables.pooled_rows(own, twin, peer)
    only_peer = keys(op_tables.training_rows(peer)) - keys(op_tables.training_rows(own))
    # Rounds 8, 10, 11, 13 and 15 were measured on the H100 alone (data/op-space/README.md).
    h100_only = _round_ids(8, 10, 11, 13, 15)
    # (the power rounds 16 and 17 drew two of them again: those the H200 measured itself)
    assert {op for op, _ in only_peer} == h100_only - set(own["op_id"])
    learnt = pooled[pooled["_train"]]
    assert keys(learnt[learnt["gpu_name"] != own["gpu_name"].iloc[0]]) == only_peer
    assert len(learnt) == len(mine) + len(only_peer)  # no configuration twice
    # The families TF32 leaves alone come from the TF32-on twin of its own GPU.
    lacking = learnt[~learnt["_measured"]]
    assert set(lacking["gpu_name"]) == {own["gpu_name"].iloc[0]}
    assert lacking["tf32"].eq(False).all()
    # Every peer's row stays, to set its GPU's ceilings and kernel floor.
    assert pooled["_measured"].sum() == len(op_tables.training_rows(own)) + len(
        op_tables.training_rows(peer)
    )
    # Without peers nothing is pooled.
    alone, pooled_alone = op_tables.pooled_rows(own, _load("h200"), None)
    assert len(alone) == pooled_alone["_train"].sum() == len(mine)


def test_a_cudnn_benchmark_configuration_takes_all_but_its_convolutions_from_its_twin():
    h200 = _load("h200")
    convs = h200[h200["family"] == "conv"].head(40).assign(cudnn_benchmark=True)
    mine, pooled = op_tables.pooled_rows(convs, h200, None)
    ok = op_tables.training_rows(h200)
    assert keys(mine[mine["family"] == "conv"]) == keys(op_tables.training_rows(convs))
    assert len(mine) == len(op_tables.training_rows(convs)) + (ok["family"] != "conv").sum()
    assert mine["cudnn_benchmark"].all()
    assert mine["tf32"].all()
    assert pooled["_train"].sum() == len(mine)


def test_a_configuration_learns_the_samples_only_its_peer_measured() -> None:
    # A quarter of the H200's convolutions (TF32 on) left out of its table, all measured
    # on the H100. Pooled with the H100's table, the H200's model learns them from the
    # H100's measurements (the same kernels, a median 4 % apart on the two GPUs, averaged
    # in leaves of 3 with their neighbours); alone, from its neighbours only (a median
    # 19 % off, docs/op-space.md).
    h200, h100 = _load("h200"), _load("h100")
    h200 = h200[h200["op_id"].isin(set(h100["op_id"]))]  # not the H200's power rounds
    conv = h200["family"] == "conv"
    ids = np.array(sorted(h200.loc[conv, "op_id"].unique()))
    held = set(np.random.default_rng(0).choice(ids, len(ids) // 4, replace=False))
    test = op_tables.training_rows(h200[h200["op_id"].isin(held)])
    test = test[test["gpu_time_s"] > 0]
    rest = h200[~h200["op_id"].isin(held)]

    def error(m: opmodel.OpModel) -> float:
        pred = m.predict(test[["spec", "mode", "op_type"]], isolated=True)["gpu_time_s"].to_numpy()
        return float(np.median(np.abs(pred / test["gpu_time_s"].to_numpy() - 1)))

    def bias(m: opmodel.OpModel) -> float:
        pred = m.predict(test[["spec", "mode", "op_type"]], isolated=True)["gpu_time_s"].to_numpy()
        return float(np.median(pred / test["gpu_time_s"].to_numpy() - 1))

    alone = error(opmodel.fit(rest, "h200", _make))
    pooled = opmodel.fit(rest, "h200", _make, peers=h100)
    only_h100 = keys(op_tables.training_rows(h100)) - keys(op_tables.training_rows(rest))
    assert keys(test) <= only_h100  # with round 9, which the H100 alone measured
    assert pooled.meta["pooled_samples"] == pooled.meta["samples"] + len(only_h100)
    assert error(pooled) < 0.7 * alone
    # Carried over through the convolutions both GPUs measured, the H100's samples are
    # the H200's within a few per cent (a median 2 % off); learnt against the H100's own
    # base time (its ceilings and kernel floor, which depend on the samples each GPU
    # measured), 10 % (bench/peer_transfer.py: up to 8 % too fast in median).
    base = opmodel.fit(rest, "h200", _make, peers=h100, transfer_peers=False)
    assert pooled.meta["carried_over"]["conv<-NVIDIA H100 80GB HBM3"]["pairs"] > 1000
    assert abs(bias(pooled)) < 0.02
    assert error(pooled) < 0.5 * error(base)


def test_held_out_configurations_are_held_out_of_the_peers_too(h100: pd.DataFrame) -> None:
    # A peer that measured exactly what the configuration did (a copy, as if on another
    # GPU): had its held-out configurations stayed in training, they would be predicted
    # from themselves, within a few per cent.
    clone = h100.assign(gpu_name="another GPU")
    alone = op_scores.held_out_errors(h100, "h100", _make, fraction=0.25)
    pooled = op_scores.held_out_errors(h100, "h100", _make, peers=clone, fraction=0.25)
    a, p = (e["all"]["gpu_time_median_abs_error_pct"] for e in (alone, pooled))
    assert p == pytest.approx(a, rel=0.25)
    assert p > 3.0
