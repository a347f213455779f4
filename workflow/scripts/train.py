"""Train and validate one GPU configuration's predictor (rule train)."""

from pathlib import Path

from opcost.train import TrainConfig, TrainOutputs, train_gpu
from opcost.workflow import require_raw_logs

sm = snakemake  # noqa: F821 (injected by Snakemake)
require_raw_logs(sm.input.dataset)
directory = Path(sm.output.features).parent
outputs = TrainOutputs(
    directory=directory,
    metrics=Path(sm.output.metrics),
    holdout=Path(sm.output.holdout),
    networks=Path(sm.output.networks),
)
with open(sm.log[0], "w") as log:

    def write(line: str) -> None:
        log.write(line + "\n")
        log.flush()

    metrics = train_gpu(
        sm.input.dataset,
        list(sm.input.ops),
        outputs,
        TrainConfig.from_config(sm.params.train),
        sm.wildcards.gpu,
        n_jobs=sm.threads,
        log=write,
    )
    lono = metrics["lono"]["network"].get("all", {})
    write(
        f"leave-one-network-out MAPE: time {lono.get('time_mape_pct')} %, "
        f"energy {lono.get('energy_mape_pct')} %"
    )
