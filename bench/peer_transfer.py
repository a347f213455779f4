"""How well a configuration's op models know the samples only its peer measured.

    python bench/peer_transfer.py [OWN:PEER ...] [--share 0.25] [--seed 0]
        [--measured tests/data/peer_transfer]

For each pair (default ``h200:h100`` and ``h200-notf32:h100-notf32``), a quarter of the
op ids both GPUs measured (``--share``, at random, ``--seed``) is taken out of OWN's
op-space table (``data/op-space``) and stays in PEER's, as the samples of rounds 8-15
did, which the H100 alone measured. OWN's models are fitted three ways and predict the
GPU time OWN measured for those samples:

- **held out of both**: the samples are in neither table (what OWN's models know of
  them from their neighbours alone);
- **peer's base time**: PEER's measurements learnt against PEER's own base time (its
  ceilings and kernel floor), as ``opmodel.fit(..., transfer_peers=False)`` does;
- **carried over**: PEER's measurements carried over to OWN's GPU through the samples
  both measured (``opcost.model.peer_transfer``), the default.

Prints, per family and over all, the median signed and the median absolute error (%).
With ``--measured DIR``, also scores OWN's models, fitted on the whole study both ways,
on chunks of the rounds only PEER measured, measured again on OWN's GPU
(``experiments/opspace_chunk_again.py --gpu OWN --committed PEER``), per chunk.
A few minutes on two cores.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opspace_model as om  # noqa: E402

from opcost.model import op_tables, opmodel  # noqa: E402

VARIANTS = ("held out of both", "peer's base time", "carried over")


def check(own: str, peer: str, share: float, seed: int) -> pd.DataFrame:
    """Per held-out row of ``own``: its family and each variant's relative error."""
    mine, theirs = om.load(own), om.load(peer)
    twin, peers = om.sources(own, True)

    def measured(t: pd.DataFrame) -> set[str]:
        return set(t.loc[(t["status"] == "ok") & (t["gpu_time_s"] > 0), "op_id"])

    shared = sorted(measured(mine) & measured(theirs))
    out = set(np.random.default_rng(seed).permutation(shared)[: int(share * len(shared))])
    test = op_tables.training_rows(mine[mine["op_id"].isin(out)])
    test = test[test["gpu_time_s"] > 0]
    rest = mine[~mine["op_id"].isin(out)]
    fits = {
        VARIANTS[0]: (peers[~peers["op_id"].isin(out)], False),
        VARIANTS[1]: (peers, False),
        VARIANTS[2]: (peers, True),
    }
    errors = {n: relative_errors(test, rest, own, twin, p, carry) for n, (p, carry) in fits.items()}
    return pd.DataFrame({"family": test["family"].to_numpy(), **errors})


def relative_errors(rows, table, own: str, twin, peers, carry: bool) -> np.ndarray:
    """``predicted / measured - 1`` of the GPU time of ``rows`` by OWN's models fitted on
    ``table``, ``twin`` and ``peers``, the peers' samples carried over or not."""
    model = opmodel.fit(
        table, own, om.maker("extra_trees"), twin=twin, peers=peers, transfer_peers=carry
    )
    pred = model.predict(rows[["spec", "mode", "op_type"]], isolated=True)["gpu_time_s"].to_numpy()
    return pred / rows["gpu_time_s"].to_numpy() - 1.0


def measured_again(own: str, directory: Path) -> pd.DataFrame | None:
    """Per row of the chunks in ``directory`` measured on ``own``'s GPU configuration
    (column ``gpu``) and not in its own table: its chunk and the relative error of OWN's
    models fitted on the whole study, with its peer's samples learnt against the peer's
    base time and carried over."""
    chunks = [pd.read_parquet(p).assign(chunk=p.stem) for p in sorted(directory.glob("*.parquet"))]
    rows = op_tables.training_rows(pd.concat(chunks, ignore_index=True))
    mine = om.load(own)
    rows = rows[(rows["gpu"] == own) & (rows["gpu_time_s"] > 0)]
    rows = rows[~rows["op_id"].isin(set(mine["op_id"]))]
    if rows.empty:
        return None
    twin, peers = om.sources(own, True)
    errors = {
        n: relative_errors(rows, mine, own, twin, peers, c)
        for n, c in zip(VARIANTS[1:], (False, True), strict=True)
    }
    return pd.DataFrame({"chunk": rows["chunk"].to_numpy(), **errors})


def summary(errors: pd.DataFrame, by: str = "family") -> pd.DataFrame:
    """Median signed and median absolute error (%) per ``by`` and over all."""
    groups = [*errors.groupby(by), ("all", errors)]
    rows = []
    for key, g in groups:
        row = {by: key, "n": len(g)}
        for v in (v for v in VARIANTS if v in g):
            row[f"{v}: signed"] = 100 * g[v].median()
            row[f"{v}: |err|"] = 100 * g[v].abs().median()
        rows.append(row)
    return pd.DataFrame(rows).set_index(by).round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", default=["h200:h100", "h200-notf32:h100-notf32"])
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measured", type=Path, help="chunks measured again on OWN's GPU")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    for pair in args.pairs:
        own, peer = pair.split(":")
        errors = check(own, peer, args.share, args.seed)
        print(f"\n== {own}: samples only {peer} measured ({len(errors)} rows), GPU time ==")
        print(summary(errors).to_string())
        again = measured_again(own, args.measured) if args.measured else None
        if again is not None:
            print(f"\n== {own}: chunks only {peer} measured, measured again on {own} "
                  f"({len(again)} rows), GPU time ==")  # fmt: skip
            print(summary(again, "chunk").to_string())


if __name__ == "__main__":
    main()
