# One predictor per GPU configuration: forests for time and power, validated by a random
# hold-out of operations and by leaving each network out (opcost.train). The op tables
# tell which operations belong to which network.


rule train:
    input:
        dataset="results/dataset/{gpu}.parquet",
        ops=expand("results/ops/{model_input}.parquet", model_input=MODEL_INPUTS),
    output:
        time="results/predictors/{gpu}/time.joblib",
        power="results/predictors/{gpu}/power.joblib",
        features="results/predictors/{gpu}/features.json",
        metrics="results/predictors/{gpu}/metrics.json",
        holdout="results/predictors/{gpu}/holdout_predictions.parquet",
        networks="results/predictors/{gpu}/network_predictions.parquet",
    log:
        "logs/train/{gpu}.log",
    conda:
        "../../environment.yml"
    threads: 4
    params:
        train=config["train"],
    script:
        "../scripts/train.py"
