# An included GPU configuration's archives (config `include`, opcost.included), unpacked
# into the layout of a study's working directory, so that `evaluate` reads them as it
# reads this study's own raw logs.
rule unpack_included:
    input:
        lambda wildcards: STUDY.included[wildcards.gpu][int(wildcards.index)].archives,
    output:
        directory("results/included/{gpu}/{index}"),
    log:
        "logs/included/{gpu}/{index}.log",
    wildcard_constraints:
        index=r"\d+",
    run:
        included.unpack(list(input), output[0])


# A profiled GPU configuration's raw logs, or an included one's (get_included_raw): the
# same evaluation either way.
rule evaluate:
    input:
        json=get_raw_jsons,
        csv=get_raw_csvs,
        traces=get_traces,
        included=get_included_raw,
    output:
        dataset="results/dataset/{gpu}.parquet",
        failed="results/dataset/{gpu}.failed.parquet",
        breakdown="results/dataset/{gpu}.breakdown.parquet",
    log:
        "logs/evaluate/{gpu}.log",
    conda:
        "../../environment.yml"
    params:
        min_power_updates=config["evaluate"]["min_power_updates"],
        # Where an included configuration's measurements come from (config `include`).
        include=config["include"],
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("evaluate.py"),
    script:
        "../scripts/evaluate.py"


# The failed measurements (out of memory, an op that cannot run here) as a CSV that the
# report shows, per GPU configuration: a gap in the study is visible where its results are.
rule failed_measurements:
    input:
        failed="results/dataset/{gpu}.failed.parquet",
    output:
        table=report(
            "results/dataset/{gpu}.failed.csv",
            caption="../report/failed_measurements.rst",
            category="Dataset",
            subcategory="Failed measurements",
            labels={"GPU configuration": "{gpu}"},
        ),
    log:
        "logs/evaluate/{gpu}.failed.log",
    conda:
        "../../environment.yml"
    params:
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("failed_measurements.py"),
    script:
        "../scripts/failed_measurements.py"
