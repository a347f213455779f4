"""Op models learnt from the op-space study only (opcost.model.opmodel), scored on held-out
sampled configurations and on the networks of the shipped studies, which they never saw.

    python bench/opspace_model.py [GPU ...] [--regressors random_forest,extra_trees,...]
                                  [--budget-min M] [--budget-order measured|random]
                                  [--power-share F] [--save-models DIR]
                                  [--seed N] [--no-transfer] [--split-peers SHARE]

Per GPU configuration (data/op-space/{gpu}; a TF32-off one takes the families it lacks
from its TF32-on twin):

1. **held-out configurations**: 20 % of the sampled op ids (seed 0) are left out; per
   family and regressor, the median |error| and MAPE of GPU kernel time, and the
   thesis's baseline (the same regressor on the log of the GPU time, no roofline);
   the same for those that round 1 sampled first (space-filling: the op space as
   sampled, where the adaptive rounds crowd the configurations the models missed);
   and the busy power of every power window, predicted by the models fitted without
   its op id (5 folds of the op ids with a window; ``--no-power`` skips it);
2. **network ops**: the isolated, traced ops of data/hopper and data/hopper-large
   (``gpu_time_s``), predicted by the model (the first of ``--regressors``) fitted on
   all samples;
3. **networks**: each network predicted as ``opcost predict --op-models`` does (its
   calls replayed from their predicted host and GPU times, opcost.predict_replay), for
   the host it was measured on (its host probe, where the probe was measured in the
   network's own job; else the op space's host), against the time per step of its trace
   job's timed loop on that host (``trace_wall_time_s``); also both ways, and against
   the 1-s window (``time_s``, other hosts and days); its energy against
   ``energy_j``; and the replay of its *measured* isolated ops against the same
   reference. Per mode and batch: MAPE and median signed error;
4. **choice**: per network and mode, the configuration with the least measured and
   predicted time and energy, between the H100 and the H200 and among all configurations
   given (:func:`opcost.validate.predictions.configuration_choice`): right in how many of
   the cases whose measured best wins by more than ``CLEAR_MARGIN``, beside the constant
   baseline (always the configuration most often best), and in the cases that baseline
   gets wrong; over all cases, and over those whose GPU sets the pace on every
   configuration compared (measured: the network's GPU kernel time at least its host
   time), where the choice of GPU decides the time.

``--budget-min M`` trains on what ``M`` minutes of each configuration's measuring hold
(the held-out samples stay the whole study's): what a study of ``M`` GPU-minutes per
configuration buys; ``--budget-order measured`` keeps the rows measured first (the study
stopped early), ``random`` op ids at random (every round thinned alike).
``--power-share F`` trains the busy power on a share ``F`` of the power windows (op ids
at random, seed 1; the held-out windows stay all of them): what fewer windows cost.
``--save-models DIR`` writes the fitted op models for ``bench/unseen_networks.py
--op-models DIR``. ``--seed N`` seeds the forests; ``--no-transfer`` learns a peer's
samples against the peer's base time instead of carrying them over to the
configuration's GPU (opcost.model.peer_transfer; ``bench/peer_transfer.py`` scores both).
``--split-peers SHARE`` trains on what a study would hold that measured each configuration
both GPUs of a TF32 setting measured on one of them only, ``SHARE`` of them on both
(:func:`split_peers`, as a round's ``split_peers: SHARE`` splits it in the pipeline):
what measuring a round on one GPU costs in accuracy. With both,
the split comes first and ``M`` minutes of each configuration's share are kept.

``--out DIR`` writes ``ops.csv`` (held-out samples and network ops: family, mode, spec, measured and
predicted GPU time) and ``networks.csv``; ``--figures DIR`` draws both (PNG).
"""

from __future__ import annotations

import argparse
import glob
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from opcost import opspace_split
from opcost import replay as rp
from opcost.config import schema_defaults
from opcost.model import op_power, op_tables, opmodel
from opcost.model.opmodel_format import save_op_model
from opcost.opspace_workflow import op_space_data_inputs
from opcost.predict_replay import replay_networks
from opcost.train import TrainConfig, make_regressor
from opcost.validate.predictions import choice_scores, configuration_choice
from opcost.validate.replay import _isolated_steps, call_sequences

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("hopper", "hopper-large")
#: A measured best that wins by less than this is a tie: the choice is not scored there.
CLEAR_MARGIN = 0.05
#: A study's budget, steps applied in turn to each configuration's table:
#: ``("split", share)`` (:func:`split_peers`), then ``("minutes", minutes, order)``
#: (opcost.model.op_tables.within_budget); None for the whole study.
Budget = tuple[tuple, ...] | None


@cache
def load(gpu: str, budget: Budget = None) -> pd.DataFrame:
    """A configuration's op-space table; with a ``budget``, only the rows a study split
    between the GPUs would hold (:func:`split_peers`), and of those the rows that many
    minutes of its measuring hold (opcost.model.op_tables.within_budget)."""
    files = sorted(glob.glob(str(REPO / f"data/op-space/{gpu}/*.parquet")))
    table = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    for step in budget or ():
        if step[0] == "split":
            table = split_peers(table, load(peer_of(gpu)), gpu < peer_of(gpu), float(step[1]))
        else:
            table = op_tables.within_budget(table, float(step[1]), step[2])
    return table


def peer_of(gpu: str) -> str:
    """The one configuration of another GPU with the same numerics, as ``snakemake
    op_models`` finds it (opcost.model.op_tables.peers_of)."""
    names = {
        Path(p).parent.name for p in op_space_data_inputs(REPO / "data/op-space", gpu)["peers"]
    }
    if len(names) != 1:
        raise SystemExit(f"--split-peers needs one peer of {gpu}, found {sorted(names)}")
    return names.pop()


def split_peers(table: pd.DataFrame, peer: pd.DataFrame, first: bool, share: float):
    """The rows of ``table`` a study would hold that measured each configuration both GPUs
    measured on one of them only, as ``split_peers: share`` splits a round
    (opcost.opspace_split): per round and family, ``share`` of them, spread evenly over
    its sequence, and those with a power window on both, as the pairs a peer's samples
    are carried over by (opcost.model.peer_transfer); the rest taken in turn (``first``:
    this configuration takes the first of each two)."""
    ranks = split_ranks_by_op(share)
    shared = set(table["op_id"]) & set(peer["op_id"])
    rank = table["op_id"].map(ranks).fillna(opspace_split.EVERY_PEER).astype("int64")
    mine = opspace_split.takes(rank, 0 if first else 1, 2)
    return table[mine | ~table["op_id"].isin(shared)]


@cache
def split_ranks_by_op(share: float) -> dict[str, int]:
    """Each committed round's ``split_rank`` per op id (data/op-space's samples tables,
    opcost.opspace_split.split_ranks), the first round that sampled it deciding."""
    out: dict[str, int] = {}
    round_ = 1
    while (path := samples_path(round_)).exists():
        t = pd.read_parquet(path, columns=["op_id", "family", "power"])
        ranks = opspace_split.split_ranks(t["family"], t["power"], share)
        for op_id, r in zip(t["op_id"], ranks, strict=True):
            out.setdefault(op_id, int(r))
        round_ += 1
    return out


def samples_path(round_: int) -> Path:
    """The committed samples table of op-space round ``round_`` (data/op-space)."""
    name = "samples.parquet" if round_ == 1 else f"samples-r{round_}.parquet"
    return REPO / "data/op-space" / name


def sampled_rounds() -> dict[str, int]:
    """The round that first sampled each op id of the committed op-space study."""
    paths = (REPO / "data/op-space").glob("samples*.parquet")
    tables = [pd.read_parquet(p, columns=["op_id", "round"]) for p in paths]
    return pd.concat(tables).groupby("op_id")["round"].min().astype(int).to_dict()


def sources(
    gpu: str, pool: bool, budget: Budget = None
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """``(twin, peers)`` as ``snakemake op_models`` gives them to the op models of ``gpu``
    (opcost.opspace_workflow.op_space_data_inputs: with ``pool``, the other GPUs' tables of the
    same TF32 setting, and the twin's with its peers'), each configuration's table as
    :func:`load` reads it, within ``budget`` each."""
    inputs = op_space_data_inputs(REPO / "data/op-space", gpu, pool)

    def tables(paths: list[str]) -> pd.DataFrame | None:
        names = list(dict.fromkeys(Path(p).parent.name for p in paths))
        if not names:
            return None
        return pd.concat([load(n, budget) for n in names], ignore_index=True)

    return tables(inputs["twin"]), tables(inputs["peers"])


#: The forests' seed (``--seed``; the config schema's default) and whether a peer's samples
#: are carried over to a configuration's GPU (``--no-transfer``: learnt against the peer's
#: base time, opcost.model.peer_transfer).
SEED = schema_defaults("op_space", "model")["seed"]
TRANSFER = True


def fit(table, gpu: str, make, twin, peers) -> opmodel.OpModel:
    """``opmodel.fit`` with the peers' samples carried over or not (:data:`TRANSFER`)."""
    return opmodel.fit(table, gpu, make, twin=twin, peers=peers, transfer_peers=TRANSFER)


def maker(regressor: str):
    """Fresh regressors as ``snakemake op_models`` makes them (the config schema's
    ``op_space.model`` defaults), of kind ``regressor``, seeded with :data:`SEED`."""
    model = schema_defaults("op_space", "model")
    cfg = TrainConfig(
        regressor=regressor,
        n_estimators=model["n_estimators"],
        min_samples_leaf=model["min_samples_leaf"],
        seed=SEED,
    )
    return lambda: make_regressor(cfg, n_jobs=2)


def held_out(
    gpu: str, regressors: list[str], pool: bool = True, budget: Budget = None
) -> pd.DataFrame:
    """GPU time of the held-out op ids (20 % of the whole study's, seed 0), predicted by
    the models fitted on the rest (within ``budget`` of each configuration), and by
    the thesis's baseline."""
    whole = load(gpu)
    table, (twin, peers) = load(gpu, budget), sources(gpu, pool, budget)
    ids = whole["op_id"].unique()
    hold = set(np.random.default_rng(0).choice(ids, len(ids) // 5, replace=False))
    test = op_tables.training_rows(whole[whole["op_id"].isin(hold)])
    test = test[test["gpu_time_s"] > 0]
    rest = lambda t: None if t is None else t[~t["op_id"].isin(hold)]  # noqa: E731
    rounds = sampled_rounds()
    out = []
    for reg in regressors:
        model = fit(rest(table), gpu, maker(reg), rest(twin), rest(peers))
        pred = model.predict(test[["spec", "mode", "op_type"]], isolated=True)["gpu_time_s"]
        pred = pred.to_numpy()
        base = baseline(rest(table), test, maker(reg))
        for name, p in ((reg, pred), (f"{reg} on log time (baseline)", base)):
            measured = test["gpu_time_s"].to_numpy()
            out.append(
                pd.DataFrame(
                    {
                        "gpu": gpu,
                        "model": name,
                        "family": test["family"],
                        "round": test["op_id"].map(rounds).to_numpy(),
                        "mode": test["mode"],
                        "spec": test["spec"],
                        "measured_s": measured,
                        "predicted_s": p,
                        "err": p / measured - 1,
                    }
                )  # fmt: skip
            )
    return pd.concat(out, ignore_index=True)


def without_windows(table: pd.DataFrame | None, share: float) -> pd.DataFrame | None:
    """``table`` as if only ``share`` of its op ids with a power window had one (the
    others drawn at random, seed 1, lose their window's columns)."""
    if table is None or share >= 1:
        return table
    windowed = table.loc[table["power_w"].notna(), "op_id"].unique()
    drop = np.random.default_rng(1).permutation(windowed)[: round((1 - share) * len(windowed))]
    out = table.copy()
    out.loc[out["op_id"].isin(set(drop)), ["power_w", "power_window_s", "power_time_s"]] = np.nan
    return out


def held_out_power(
    gpu: str,
    regressor: str,
    folds: int = 5,
    pool: bool = True,
    budget: Budget = None,
    power_share: float = 1.0,
) -> pd.DataFrame:
    """Busy power of every power window, predicted by the models fitted without its op id
    (within ``budget`` of each configuration, on ``power_share`` of the windows): the op
    ids with a window in ``folds`` random folds (seed 0), one fit per fold
    (opcost.model.op_power.busy_power_errors)."""
    whole = load(gpu)
    table, (twin, peers) = load(gpu, budget), sources(gpu, pool, budget)
    table, twin, peers = (without_windows(t, power_share) for t in (table, twin, peers))
    windowed = op_power.power_windows(op_tables.training_rows(whole))["op_id"].unique()
    order = np.random.default_rng(0).permutation(windowed)
    out = []
    for k in range(folds):
        hold = set(order[k::folds])
        rest = lambda t, h=hold: None if t is None else t[~t["op_id"].isin(h)]  # noqa: E731
        model = fit(rest(table), gpu, maker(regressor), rest(twin), rest(peers))
        test = op_tables.training_rows(whole[whole["op_id"].isin(hold)])
        out.append(op_power.busy_power_errors(model, test))
    return pd.concat(out, ignore_index=True).assign(gpu=gpu)


def baseline(train: pd.DataFrame, test: pd.DataFrame, make) -> np.ndarray:
    """The thesis's method on the same samples: per family, log GPU time, no roofline."""
    train = op_tables.training_rows(train)
    train = train[train["gpu_time_s"] > 0]
    pred = np.full(len(test), np.nan)
    for fam, part in train.groupby("family"):
        sel = (test["family"] == fam).to_numpy()
        if not sel.any():
            continue
        schema = opmodel.build_schema(part["op_type"])
        fit = make().fit(
            opmodel.features(part, schema, np.ones(len(part))),
            np.log(part["gpu_time_s"].to_numpy()),
        )
        pred[sel] = np.exp(fit.predict(opmodel.features(test[sel], schema, np.ones(sel.sum()))))
    return pred


def _replay(
    seq: list[str], ops: pd.DataFrame, training: bool, gap_s: float, net: pd.Series
) -> tuple[pd.DataFrame, rp.Replay]:
    """A network's step replayed from its ops' host and GPU times (``ops`` by op_id)."""
    steps = _isolated_steps(seq, ops, training)
    return steps, rp.replay(
        list(steps["host"]), list(steps["gpu"]), list(steps["n"]),
        kernel_gap_s=gap_s,
        sync_s=float(net["sync_s"]) if pd.notna(net["sync_s"]) else 0.0,
        repeats=int(net["trace_number_per_run"] or 1),
    )  # fmt: skip


def networks(gpu: str, model: opmodel.OpModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The networks' isolated ops predicted, and each network predicted as ``opcost
    predict --op-models`` does (opcost.predict_replay), for the host it was measured on
    (its host probe) and for the op space's host, against its measured time per step."""
    ops_out, nets_out = [], []
    for study in STUDIES:
        path = REPO / f"data/{study}/{gpu}/dataset/{gpu}.parquet"
        if not path.exists():
            continue
        d = pd.read_parquet(path)
        o = d[(d["kind"] == "op") & d["gpu_time_s"].notna()]
        p = model.predict(o[["spec", "mode", "op_type"]], isolated=True)
        p.index = o.index
        ops_out.append(
            pd.DataFrame(
                {
                    "gpu": gpu,
                    "study": study,
                    "family": p["family"],
                    "mode": o["mode"],
                    "spec": o["spec"],
                    "measured_s": o["gpu_time_s"],
                    "predicted_s": p["gpu_time_s"],
                }
            )  # fmt: skip
        )
        tables = {
            f.stem: pd.read_parquet(f)
            for f in sorted((REPO / f"data/{study}/ops").glob("*_*.parquet"))
        }
        seqs = call_sequences(sorted((REPO / f"data/{study}/ops").glob("*_*.parquet")))
        # A probe measured in each network's own job follows its host; one probe for a
        # whole run (the batch-1-and-8 traces) does not, and the op space's host stands in.
        probes = d.loc[d["kind"] == "network", "host_probe_s"].to_numpy()
        per_job_probe = bool((probes != probes[0]).any())
        for _, net in d[d["kind"] == "network"].iterrows():
            mode, name = net["mode"], net["model_input"]
            table = tables.get(name)
            if table is None:
                continue
            table = table.assign(model_input=name)
            own = replay_networks({gpu: model}, table, [mode], host_probe_s=net["host_probe_s"])
            base = replay_networks({gpu: model}, table, [mode])
            mine, b = own.table.iloc[0], base.table.iloc[0]
            r = mine if per_job_probe else b
            measured = o[o["mode"] == mode].drop_duplicates("op_id").set_index("op_id")
            seq = seqs.get(name)
            iso = np.nan
            if seq and set(seq) <= set(measured.index):
                gap = float(o["launch_gap_s"].median())
                iso = _replay(seq, measured, mode == "training", gap, net)[1].time_s
            wall = net["trace_wall_time_s"]
            batch = int(name.rsplit("_", 1)[1].split("x")[0])
            nets_out.append(
                {"gpu": gpu, "setting": "default", "model_input": name, "mode": mode,
                 "batch": batch, "bound": r["bound"],
                 "time": r["time_s"] / wall - 1,
                 "time_own_probe": mine["time_s"] / wall - 1,
                 "time_op_space_host": b["time_s"] / wall - 1,
                 "probe": "network's" if per_job_probe else "op space's",
                 "time_window": r["time_s"] / net["time_s"] - 1,
                 "energy": r["energy_j"] / net["energy_j"] - 1,
                 "time_pred_s": r["time_s"], "time_s": wall, "window_time_s": net["time_s"],
                 "energy_pred_j": r["energy_j"], "energy_j": net["energy_j"],
                 "time_iso_s": iso, "host_probe_s": net["host_probe_s"],
                 "measured_bound": "gpu" if net["gpu_time_s"] >= net["host_time_s"] else "host",
                 "n_ops_unseen": int(r["n_extrapolated"])}
            )  # fmt: skip
    return pd.concat(ops_out, ignore_index=True), pd.DataFrame(nets_out)


def choice(nets: pd.DataFrame, gpus: list[str], gpu_bound: bool = False) -> None:
    """Print the choice scores among ``gpus`` (module docstring, item 4); with
    ``gpu_bound``, only of the network-mode cases whose GPU sets the pace on every one of
    them (where the host does, the GPU barely matters)."""
    nets = nets[nets["gpu"].isin(gpus)]
    if gpu_bound:
        bound = nets.groupby(["model_input", "mode"])["measured_bound"].transform(
            lambda b: (b == "gpu").all()
        )
        nets = nets[bound]
    picks = configuration_choice(nets)
    if picks.empty:
        return
    which = ", GPU-bound on all" if gpu_bound else ""
    print(f"\nchoice among {', '.join(gpus)}{which}: {len(picks)} network-mode cases")
    scores = choice_scores(picks, CLEAR_MARGIN)
    for what in ("fastest", "least_energy"):
        if what not in scores:
            print(f"  {what}: no case whose best wins by more than {CLEAR_MARGIN:.0%}")
            continue
        s = scores[what]
        print(
            f"  {what}: clear cases (margin > {CLEAR_MARGIN:.0%}) {s['clear']}; "
            f"predicted right {s['right']} ({s['right'] / s['clear']:.0%}); constant baseline "
            f"'{s['constant']}' right {s['constant_right']} "
            f"({s['constant_right'] / s['clear']:.0%}); in the {s['missed']} cases it gets "
            f"wrong, predicted right {s['right_where_missed']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", nargs="*", default=["h100", "h200", "h100-notf32", "h200-notf32"])
    parser.add_argument("--regressors", default="random_forest,extra_trees,gradient_boosting")
    parser.add_argument(
        "--no-pool", action="store_true",
        help="each configuration's models from its own samples only (pool_gpus false)",
    )  # fmt: skip
    parser.add_argument("--no-power", action="store_true", help="skip the held-out busy power")
    parser.add_argument("--power-folds", type=int, default=5)
    parser.add_argument(
        "--power-share",
        type=float,
        default=1.0,
        help="train the busy power on this share of the power windows (op ids at random)",
    )
    parser.add_argument("--out", type=Path, help="write ops.csv and networks.csv here")
    parser.add_argument("--figures", type=Path, help="draw the two figures (PNG) here")
    parser.add_argument(
        "--budget-min",
        type=float,
        help="train on what this many minutes of each configuration's measuring hold "
        "(the held-out samples stay those of the whole study)",
    )
    parser.add_argument(
        "--budget-order",
        choices=("measured", "random"),
        default="measured",
        help="measured: the rows measured first (the study stopped early); random: op ids "
        "at random, every round thinned alike",
    )
    parser.add_argument(
        "--save-models",
        type=Path,
        help="write each configuration's op models, fitted on all its samples, to DIR/GPU "
        "(for bench/unseen_networks.py --op-models DIR)",
    )
    parser.add_argument(
        "--split-peers",
        type=float,
        metavar="SHARE",
        help="train on what a study measuring each configuration both GPUs measured on one "
        "of them would hold, SHARE of them on both (the held-out samples stay the whole "
        "study's)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="the forests' seed")
    parser.add_argument(
        "--no-transfer",
        action="store_true",
        help="learn a peer's samples against the peer's base time instead of carrying them "
        "over (opcost.model.peer_transfer)",
    )
    args = parser.parse_args()
    globals().update(SEED=args.seed, TRANSFER=not args.no_transfer)
    steps = [] if args.split_peers is None else [("split", args.split_peers)]
    if args.budget_min is not None:
        steps.append(("minutes", args.budget_min, args.budget_order))
    budget = tuple(steps) or None
    regs = args.regressors.split(",")
    all_nets, all_ops = [], []
    for gpu in args.gpus:
        h = held_out(gpu, regs, not args.no_pool, budget)
        all_ops.append(h[h["model"] == regs[0]].assign(source="held-out samples"))
        print(f"\n== {gpu}: held-out sampled configurations, GPU time ==")
        print(
            h.groupby(["model", "family"])["err"]
            .agg(n="size", median_abs=lambda e: e.abs().median(), mape=lambda e: e.abs().mean())
            .round(3)
            .to_string()
        )
        for name, g in h.groupby("model"):
            print(f"{name:45s} median |err| {100 * g['err'].abs().median():5.1f} %  "
                  f"MAPE {100 * g['err'].abs().mean():5.1f} %")  # fmt: skip
        first = h[(h["model"] == regs[0]) & (h["round"] == 1)]
        e = first["err"].abs()
        label = f"  of them round 1 (space-filling), n={len(first)}"
        print(f"{label:45s} median |err| {100 * e.median():5.1f} %  MAPE {100 * e.mean():5.1f} %")
        print(
            first.groupby("family")["err"]
            .agg(n="size", median_abs=lambda e: e.abs().median(), mape=lambda e: e.abs().mean())
            .round(3)
            .to_string()
        )
        if not args.no_power:
            w = held_out_power(
                gpu, regs[0], args.power_folds, not args.no_pool, budget, args.power_share
            )
            print(f"\n== {gpu}: held-out power windows ({args.power_folds}-fold by op id), "
                  f"busy power, {regs[0]} ==")  # fmt: skip
            print(
                w.groupby(["family"])["err"]
                .agg(n="size", median_abs=lambda e: e.abs().median(), mape=lambda e: e.abs().mean())
                .round(3)
                .to_string()
            )
            a = w["err"].abs()
            print(f"busy power, all windows: n={len(w)}  median |err| {100 * a.median():5.1f} %  "
                  f"MAPE {100 * a.mean():5.1f} %")  # fmt: skip
        twin, peers = sources(gpu, not args.no_pool, budget)
        own = load(gpu, budget)
        print(f"{gpu}: {own['op_id'].nunique()} sampled configurations, "
              f"{own['measure_s'].sum() / 60:.1f} min of measuring")  # fmt: skip
        model = fit(own, gpu, maker(regs[0]), twin, peers)
        if args.save_models:
            save_op_model(model, args.save_models / gpu)
        ops, nets = networks(gpu, model)
        all_ops.append(ops.assign(source="network ops"))
        k = ops[ops["measured_s"] > 0]
        e = k["predicted_s"] / k["measured_s"] - 1
        ratio = k["predicted_s"].sum() / k["measured_s"].sum()
        print(f"network ops ({len(k)}): median |err| {100 * e.abs().median():.1f} %, "
              f"sum of predicted / measured {ratio:.3f}")  # fmt: skip
        signed = (e.groupby([k["family"], k["mode"]]).median() * 100).round(1)
        conv = signed.get("conv", pd.Series(dtype=float)).to_dict()
        print(f"network convolutions, median signed error per mode: {conv} %")
        for (mode, batch), g in nets.groupby(["mode", "batch"]):
            t, en = 100 * g["time"], 100 * g["energy"]
            t0, tw = 100 * g["time_op_space_host"], 100 * g["time_window"]
            t1 = 100 * g["time_own_probe"]
            im = 100 * (g["time_iso_s"] / g["time_s"] - 1)
            print(f"networks {mode:9s} batch {batch:3d} n={len(g):2d}  time MAPE "
                  f"{t.abs().mean():5.1f} % (median {t.median():+6.1f} %, host probe "
                  f"{g['probe'].iloc[0]}; with the network's probe {t1.abs().mean():5.1f} %, "
                  f"the op space's {t0.abs().mean():5.1f} %; against the 1-s window "
                  f"{tw.abs().mean():5.1f} %)"
                  f"  energy MAPE {en.abs().mean():5.1f} %  replay of the measured isolated "
                  f"ops {im.abs().mean():5.1f} % (median {im.median():+6.1f} %)")  # fmt: skip
        all_nets.append(nets)
    nets = pd.concat(all_nets, ignore_index=True)
    print(f"\nall networks: time MAPE {100 * nets['time'].abs().mean():.1f} %, "
          f"energy MAPE {100 * nets['energy'].abs().mean():.1f} %")  # fmt: skip
    pair = [g for g in ("h100", "h200") if g in args.gpus]
    for gpu_bound in (False, True):
        choice(nets, pair, gpu_bound)
        if sorted(args.gpus) != sorted(pair):
            choice(nets, list(args.gpus), gpu_bound)
    ops = pd.concat(all_ops, ignore_index=True)[
        ["gpu", "source", "family", "mode", "spec", "measured_s", "predicted_s"]
    ]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        ops.to_csv(args.out / "ops.csv", index=False)
        nets.to_csv(args.out / "networks.csv", index=False)
    if args.figures:
        draw(ops, nets, args.figures)


def draw(ops: pd.DataFrame, nets: pd.DataFrame, directory: Path) -> None:
    """The op-type and network figures of the issue, as PNG files in ``directory``."""
    from opcost.figures.prediction import opspace_op_types_figure, prediction_networks_figure
    from opcost.figures.style import FigureStyle

    directory.mkdir(parents=True, exist_ok=True)
    style = FigureStyle()
    opspace_op_types_figure(ops, style).savefig(directory / "opspace-op-types.png", dpi=80)
    prediction_networks_figure(
        nets,
        style,
        title="Networks replayed from op-space predictions: predicted against measured",
        predicted_label="replay of predicted ops",
    ).savefig(directory / "opspace-networks.png", dpi=80)


if __name__ == "__main__":
    main()
