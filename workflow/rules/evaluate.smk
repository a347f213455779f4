rule evaluate:
    input:
        json=get_raw_jsons,
        csv=get_raw_csvs,
    output:
        dataset="results/dataset/{gpu}.parquet",
        failed="results/dataset/{gpu}.failed.parquet",
    log:
        "logs/evaluate/{gpu}.log",
    conda:
        "../../environment.yml"
    params:
        min_power_updates=config["evaluate"]["min_power_updates"],
    script:
        "../scripts/evaluate.py"
