"""Op models learnt from the op-space study only (opcost.model.opmodel), scored on held-out
sampled configurations and on the networks of the shipped studies, which they never saw.

    python bench/opspace_model.py [GPU ...] [--regressors random_forest,extra_trees,...]

Per GPU configuration (data/op-space/{gpu}; a TF32-off one takes the families it lacks
from its TF32-on twin):

1. **held-out configurations**: 20 % of the sampled op ids (seed 0) are left out; per
   family and regressor, the median |error| and MAPE of GPU kernel time, and the
   thesis's baseline (the same regressor on the log of the GPU time, no roofline);
2. **network ops**: the isolated, traced ops of data/hopper and data/hopper-large
   (``gpu_time_s``), predicted by the model (the first of ``--regressors``) fitted on
   all samples;
3. **networks**: each network's step replayed (opcost.replay) from its ops' predicted
   host and GPU times, against its measured time per step (``time_s``), and its energy
   (busy power x GPU time + waiting power x the rest) against ``energy_j``; per mode
   and batch. Prints MAPE and median signed error;
4. **choice**: per network and mode, the configuration with the least measured and
   predicted time and energy, between the H100 and the H200 and among all configurations
   given (:func:`opcost.validate.predictions.configuration_choice`): right in how many of
   the cases whose measured best wins by more than ``CLEAR_MARGIN``, beside the constant
   baseline (always the configuration most often best), and in the cases that baseline
   gets wrong.

``--out DIR`` writes ``ops.csv`` (held-out samples and network ops: family, measured and
predicted GPU time) and ``networks.csv``; ``--figures DIR`` draws both (PNG).
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

import numpy as np
import pandas as pd

from opcost import replay as rp
from opcost.model import opmodel
from opcost.train import TrainConfig, make_regressor
from opcost.validate.predictions import configuration_choice
from opcost.validate.replay import _isolated_steps, call_sequences

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("hopper", "hopper-large")
#: A measured best that wins by less than this is a tie: the choice is not scored there.
CLEAR_MARGIN = 0.05


def load(gpu: str) -> pd.DataFrame:
    files = sorted(glob.glob(str(REPO / f"data/op-space/{gpu}/*.parquet")))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def maker(regressor: str):
    cfg = TrainConfig(regressor=regressor, n_estimators=100, min_samples_leaf=2)
    return lambda: make_regressor(cfg, n_jobs=2)


def held_out(gpu: str, regressors: list[str]) -> pd.DataFrame:
    table, twin = load(gpu), load(gpu.replace("-notf32", "")) if "notf32" in gpu else None
    ids = table["op_id"].unique()
    hold = set(np.random.default_rng(0).choice(ids, len(ids) // 5, replace=False))
    test = opmodel.training_rows(table[table["op_id"].isin(hold)])
    test = test[test["gpu_time_s"] > 0]
    out = []
    for reg in regressors:
        model = opmodel.fit(table[~table["op_id"].isin(hold)], gpu, maker(reg), twin=twin)
        pred = model.predict(test[["spec", "mode", "op_type"]])["gpu_time_s"].to_numpy()
        base = baseline(table[~table["op_id"].isin(hold)], test, maker(reg))
        for name, p in ((reg, pred), (f"{reg} on log time (baseline)", base)):
            measured = test["gpu_time_s"].to_numpy()
            out.append(
                pd.DataFrame(
                    {
                        "gpu": gpu,
                        "model": name,
                        "family": test["family"],
                        "measured_s": measured,
                        "predicted_s": p,
                        "err": p / measured - 1,
                    }
                )  # fmt: skip
            )
    return pd.concat(out, ignore_index=True)


def baseline(train: pd.DataFrame, test: pd.DataFrame, make) -> np.ndarray:
    """The thesis's method on the same samples: per family, log GPU time, no roofline."""
    train = opmodel.training_rows(train)
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
    ops_out, nets_out = [], []
    for study in STUDIES:
        path = REPO / f"data/{study}/{gpu}/dataset/{gpu}.parquet"
        if not path.exists():
            continue
        d = pd.read_parquet(path)
        o = d[(d["kind"] == "op") & d["gpu_time_s"].notna()]
        p = model.predict(o[["spec", "mode", "op_type"]])
        p.index = o.index
        ops_out.append(
            pd.DataFrame(
                {
                    "gpu": gpu,
                    "study": study,
                    "family": p["family"],
                    "mode": o["mode"],
                    "measured_s": o["gpu_time_s"],
                    "predicted_s": p["gpu_time_s"],
                }
            )  # fmt: skip
        )
        seqs = call_sequences(sorted((REPO / f"data/{study}/ops").glob("*_*.parquet")))
        for mode in ("inference", "training"):
            sel = (o["mode"] == mode).to_numpy()
            pm = p[sel].assign(op_id=o.loc[sel, "op_id"].to_numpy()).drop_duplicates("op_id")
            pm = pm.set_index("op_id")
            measured = o[sel].drop_duplicates("op_id").set_index("op_id")
            for _, net in d[(d["kind"] == "network") & (d["mode"] == mode)].iterrows():
                seq = seqs.get(net["model_input"])
                if not seq or not set(seq) <= set(pm.index):
                    continue

                gap = float(o["launch_gap_s"].median())
                steps, r = _replay(seq, pm, mode == "training", gap, net)
                _, iso = _replay(seq, measured, mode == "training", gap, net)
                busy = pm["busy_power_w"].reindex(steps["op_id"]).to_numpy()
                energy = float(np.nansum(steps["gpu"].to_numpy() * busy))
                energy += model.wait_power_w * max(r.time_s - float(steps["gpu"].sum()), 0.0)
                batch = int(net["model_input"].rsplit("_", 1)[1].split("x")[0])
                nets_out.append(
                    {"gpu": gpu, "setting": "default", "model_input": net["model_input"],
                     "mode": mode, "batch": batch,
                     "time": r.time_s / net["time_s"] - 1,
                     "energy": energy / net["energy_j"] - 1,
                     "time_pred_s": r.time_s, "time_s": net["time_s"],
                     "energy_pred_j": energy, "energy_j": net["energy_j"],
                     "time_iso_s": iso.time_s, "n_ops_unseen": 0, "bound": r.bound}
                )  # fmt: skip
    return pd.concat(ops_out, ignore_index=True), pd.DataFrame(nets_out)


def choice(nets: pd.DataFrame, gpus: list[str]) -> None:
    """Print the choice scores among ``gpus`` (module docstring, item 4)."""
    picks = configuration_choice(nets[nets["gpu"].isin(gpus)])
    if picks.empty:
        return
    print(f"\nchoice among {', '.join(gpus)}: {len(picks)} network-mode cases")
    for what in ("fastest", "least_energy"):
        clear = picks[picks[f"{what}_margin"] > CLEAR_MARGIN]
        if clear.empty:
            print(f"  {what}: no case whose best wins by more than {CLEAR_MARGIN:.0%}")
            continue
        constant = clear[f"measured_{what}"].value_counts().index[0]
        right = (clear[f"predicted_{what}"] == clear[f"measured_{what}"]).to_numpy()
        base = (clear[f"measured_{what}"] == constant).to_numpy()
        print(
            f"  {what}: clear cases (margin > {CLEAR_MARGIN:.0%}) {len(clear)}; "
            f"predicted right {right.sum()} ({right.mean():.0%}); constant baseline "
            f"'{constant}' right {base.sum()} ({base.mean():.0%}); in the "
            f"{(~base).sum()} cases it gets wrong, predicted right {right[~base].sum()}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", nargs="*", default=["h100", "h200", "h100-notf32", "h200-notf32"])
    parser.add_argument("--regressors", default="random_forest,extra_trees,gradient_boosting")
    parser.add_argument("--out", type=Path, help="write ops.csv and networks.csv here")
    parser.add_argument("--figures", type=Path, help="draw the two figures (PNG) here")
    args = parser.parse_args()
    regs = args.regressors.split(",")
    all_nets, all_ops = [], []
    for gpu in args.gpus:
        h = held_out(gpu, regs)
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
        twin = load(gpu.replace("-notf32", "")) if "notf32" in gpu else None
        model = opmodel.fit(load(gpu), gpu, maker(regs[0]), twin=twin)
        ops, nets = networks(gpu, model)
        all_ops.append(ops.assign(source="network ops"))
        k = ops[ops["measured_s"] > 0]
        e = k["predicted_s"] / k["measured_s"] - 1
        ratio = k["predicted_s"].sum() / k["measured_s"].sum()
        print(f"network ops ({len(k)}): median |err| {100 * e.abs().median():.1f} %, "
              f"sum of predicted / measured {ratio:.3f}")  # fmt: skip
        for (mode, batch), g in nets.groupby(["mode", "batch"]):
            t, en = 100 * g["time"], 100 * g["energy"]
            iso = 100 * (g["time_pred_s"] / g["time_iso_s"] - 1)
            im = 100 * (g["time_iso_s"] / g["time_s"] - 1)
            print(f"networks {mode:9s} batch {batch:3d} n={len(g):2d}  time MAPE "
                  f"{t.abs().mean():5.1f} % (median {t.median():+6.1f} %)"
                  f"  energy MAPE {en.abs().mean():5.1f} %  time vs the replay of the "
                  f"measured ops MAPE {iso.abs().mean():5.1f} %, of those ops "
                  f"{im.abs().mean():5.1f} % (median {im.median():+6.1f} %)")  # fmt: skip
        all_nets.append(nets)
    nets = pd.concat(all_nets, ignore_index=True)
    print(f"\nall networks: time MAPE {100 * nets['time'].abs().mean():.1f} %, "
          f"energy MAPE {100 * nets['energy'].abs().mean():.1f} %")  # fmt: skip
    pair = [g for g in ("h100", "h200") if g in args.gpus]
    choice(nets, pair)
    if sorted(args.gpus) != sorted(pair):
        choice(nets, list(args.gpus))
    ops = pd.concat(all_ops, ignore_index=True)[
        ["gpu", "source", "family", "measured_s", "predicted_s"]
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
