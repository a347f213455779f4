# One predictor per GPU configuration: forests for time and power, validated by a random
# hold-out of operations and by leaving each network out (opcost.train). The op tables
# tell which operations belong to which network. power.npz is written only when the dataset
# has power (so it is no declared output); manifest.json, written last, lists it.


rule train:
    input:
        dataset="results/dataset/{gpu}.parquet",
        ops=get_op_tables,
    output:
        time="results/predictors/{gpu}/time.npz",
        features="results/predictors/{gpu}/features.json",
        metrics="results/predictors/{gpu}/metrics.json",
        holdout="results/predictors/{gpu}/holdout_predictions.parquet",
        networks="results/predictors/{gpu}/network_predictions.parquet",
        manifest="results/predictors/{gpu}/manifest.json",
    log:
        "logs/train/{gpu}.log",
    conda:
        "../../environment.yml"
    threads: 4
    params:
        train=config["train"],
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("train.py"),
    script:
        "../scripts/train.py"


# The predictors shipped with opcost (opcost.model.sources.SHIPPED, package data), which
# `opcost predict` uses where no study's predictors are at hand: the default config's
# predictors, copied. `snakemake ready_made_predictors` rebuilds them; not part of `all`.
rule ready_made_predictor:
    input:
        manifest="results/predictors/{gpu}/manifest.json",
    output:
        manifest=f"{SHIPPED_PREDICTORS}/{{gpu}}/manifest.json",
    log:
        "logs/train/{gpu}.ready_made.log",
    run:
        ship_predictor(Path(input.manifest).parent, Path(output.manifest).parent)


rule ready_made_predictors:
    input:
        expand(f"{SHIPPED_PREDICTORS}/{{gpu}}/manifest.json", gpu=STUDY.evaluated_gpus),
