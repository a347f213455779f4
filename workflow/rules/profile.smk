# Profiling jobs write the raw logs, the ground truth of a study: they are protected, so
# no rerun overwrites them by accident (README: "Remeasuring on purpose"). They take no
# input file: an op's spec is a parameter, so adding a network to the study profiles only
# the operations that are new. `gpu=1` keeps two profiling jobs off one GPU.


rule profile_op:
    output:
        csv=protected("results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.csv"),
        json=protected("results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.json"),
    log:
        job="logs/profile/{gpu}/{setting}/{mode}/ops/{op_id}.log",
        nvsmi="logs/profile/{gpu}/{setting}/{mode}/ops/{op_id}.nvsmi.csv",
    group:
        "profile_{gpu}"
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
    params:
        spec=get_op_spec,
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        measurement=wf.measurement_params(STUDY),
    run:
        wf.run_profile(STUDY, wildcards, output, log, kind="op", spec_json=params.spec)


rule profile_network:
    output:
        csv=protected("results/raw/{gpu}/{setting}/{mode}/networks/{model_input}.csv"),
        json=protected("results/raw/{gpu}/{setting}/{mode}/networks/{model_input}.json"),
    log:
        job="logs/profile/{gpu}/{setting}/{mode}/networks/{model_input}.log",
        nvsmi="logs/profile/{gpu}/{setting}/{mode}/networks/{model_input}.nvsmi.csv",
    group:
        "profile_{gpu}"
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
    params:
        model=lambda wildcards: MODEL_INPUTS[wildcards.model_input].model,
        shape=lambda wildcards: list(MODEL_INPUTS[wildcards.model_input].shape),
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        measurement=wf.measurement_params(STUDY),
    run:
        wf.run_profile(STUDY, wildcards, output, log, kind="network")
