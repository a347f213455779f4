# The op-space study (opcost.opspace, docs/op-space.md): configurations sampled from each
# op family's parameter ranges, measured in chunks (each job: one chunk, both modes, in
# the measurement worker), the training data of the op models. Config `op_space`; with
# no samples (the default) these rules make nothing. The measurements are raw logs:
# protected, like the profiling jobs'.
if workflow.remote_exec:
    workflow.localrules("measure_op_space", "measure_op_space_round")


rule op_space_samples:
    output:
        samples="results/op-space/samples.parquet",
    log:
        "logs/op-space/samples.log",
    params:
        sampling=osw.op_space_sampling_params(STUDY),
    run:
        osw.run_op_space_samples(params.sampling, output.samples)


rule measure_op_space:
    input:
        samples="results/op-space/samples.parquet",
    output:
        table=protected("results/op-space/raw/{gpu}/{chunk}.parquet"),
    log:
        job="logs/op-space/{gpu}/{chunk}.log",
    wildcard_constraints:
        chunk=r"\d+",
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
    params:
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        families=lambda wildcards: osw.op_space_families(STUDY, wildcards.gpu),
        split=lambda wildcards: osw.op_space_split(STUDY, 1, wildcards.gpu),
    run:
        osw.run_op_space_chunk(STUDY, wildcards, input, output, log)


# Later rounds (op_space.rounds; adaptive sampling, docs/op-space.md): round r continues
# each family's sequence after the rounds before it. Their rules are not round 1's, and a
# round's params hold only its own and the earlier rounds' counts, so adding a round
# leaves the samples and chunks of the rounds before it as they are.
rule op_space_round_samples:
    output:
        samples="results/op-space/samples-r{round}.parquet",
    log:
        "logs/op-space/samples-r{round}.log",
    wildcard_constraints:
        round=r"[2-9]|[1-9]\d+",
    params:
        sampling=lambda wildcards: osw.op_space_round_params(STUDY, int(wildcards.round)),
    run:
        osw.run_op_space_samples(params.sampling, output.samples)


rule measure_op_space_round:
    input:
        samples="results/op-space/samples-r{round}.parquet",
    output:
        table=protected("results/op-space/raw/{gpu}/r{round}-{chunk}.parquet"),
    log:
        job="logs/op-space/{gpu}/r{round}-{chunk}.log",
    wildcard_constraints:
        round=r"[2-9]|[1-9]\d+",
        chunk=r"\d+",
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
        constraint=get_slurm_constraint,
    params:
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        families=lambda wildcards: osw.op_space_families(STUDY, wildcards.gpu),
        split=lambda wildcards: osw.op_space_split(STUDY, int(wildcards.round), wildcards.gpu),
    run:
        osw.run_op_space_chunk(STUDY, wildcards, input, output, log)


rule op_space_raw:
    input:
        osw.op_space_chunk_paths(STUDY),


# The op models (opcost.model.opmodel, docs/op-space.md): one per GPU configuration,
# trained on its op-space chunk tables (those of `op_space.data` when set, else this
# study's measurements, every round's), a TF32-off configuration's lacking families from its TF32-on
# twin's tables, and scored on held-out sampled configurations (metrics.json).
# manifest.json, written last, lists the chunk tables as sources.
from opcost import op_models_job

OP_MODEL_GPUS = osw.op_models_gpus(STUDY)
OP_MODEL_MANIFESTS = expand("results/op-models/{gpu}/manifest.json", gpu=OP_MODEL_GPUS)


rule train_op_models:
    input:
        unpack(lambda wildcards: osw.op_model_inputs(STUDY, wildcards.gpu)),
    output:
        model="results/op-models/{gpu}/op_model.json",
        trees="results/op-models/{gpu}/trees.npz",
        metrics="results/op-models/{gpu}/metrics.json",
        manifest="results/op-models/{gpu}/manifest.json",
    log:
        "logs/op-models/{gpu}.log",
    threads: 2
    params:
        model=osw.op_models_params(STUDY),
        # A change to the opcost code it runs retrains the op models.
        opcost_code=wf.run_code_version(op_models_job.run_train_op_models),
    run:
        op_models_job.train_op_models_job(
            wildcards, input, output, params, log, threads
        )


rule op_models:
    input:
        OP_MODEL_MANIFESTS,
