# Profiling jobs write the raw logs, the ground truth of a study: they are protected, so
# no rerun overwrites them by accident (README: "Remeasuring on purpose"). They take no
# input file: an op's spec is a parameter, so adding a network to the study profiles only
# the operations that are new. `gpu=1` keeps two profiling jobs off one GPU (and each job
# also locks its device: opcost.device_lock).
#
# On a cluster, profiles/slurm batches these jobs: its `groups` and `group-components`
# make one SLURM job of up to 50 of them, per GPU configuration. Inside that SLURM job one
# Snakemake process runs the batch (mode "remote"); the rules are local *there*, so it runs
# them itself, measuring in its one measurement worker (opcost.worker) and so importing
# torch and starting CUDA once per batch, instead of starting `srun ... snakemake` per job
# (7-10 s each). The submitting process never sees them as local, so they still go to
# SLURM. docs/slurm.md, "Batching".
if workflow.remote_exec:
    workflow.localrules("profile_op", "profile_network", "trace_op", "trace_network")


rule profile_op:
    output:
        csv=protected("results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.csv"),
        json=protected("results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.json"),
    log:
        job="logs/profile/{gpu}/{setting}/{mode}/ops/{op_id}.log",
        nvsmi="logs/profile/{gpu}/{setting}/{mode}/ops/{op_id}.nvsmi.csv",
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
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
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
    params:
        model=lambda wildcards: MODEL_INPUTS[wildcards.model_input].model,
        shape=lambda wildcards: list(MODEL_INPUTS[wildcards.model_input].shape),
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        measurement=wf.measurement_params(STUDY),
    run:
        wf.run_profile(STUDY, wildcards, output, log, kind="network")


# Traces (opcost.tracing) in jobs of their own (profile.traces: separate_jobs; by default
# each profiling job traces what it measured, after its timed window): each op's and
# network's host time, GPU kernel time and kernels on this host, from a short run under
# torch.profiler, with no power window. CUDA GPU configurations only. Raw logs too,
# protected likewise; on a cluster they join the profiling batches (profiles/slurm:
# groups).
rule trace_op:
    output:
        json=protected("results/raw/{gpu}/{setting}/{mode}/traces/ops/{op_id}.json"),
    log:
        job="logs/trace/{gpu}/{setting}/{mode}/ops/{op_id}.log",
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
    params:
        spec=get_op_spec,
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
    run:
        wf.run_trace(STUDY, wildcards, output, log, kind="op", spec_json=params.spec)


rule trace_network:
    output:
        json=protected(
            "results/raw/{gpu}/{setting}/{mode}/traces/networks/{model_input}.json"
        ),
    log:
        job="logs/trace/{gpu}/{setting}/{mode}/networks/{model_input}.log",
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
    params:
        model=lambda wildcards: MODEL_INPUTS[wildcards.model_input].model,
        shape=lambda wildcards: list(MODEL_INPUTS[wildcards.model_input].shape),
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
    run:
        wf.run_trace(STUDY, wildcards, output, log, kind="network")


# Every trace of one GPU configuration: `snakemake results/raw/h100/traces.done
# --configfile ...` traces a study whose power measurements exist already, in one run on
# one host (profile.traces: separate_jobs); where profiling jobs trace (the default), its
# raw logs are its traces.
rule traces:
    input:
        get_traced_records,
    output:
        touch("results/raw/{gpu}/traces.done"),
