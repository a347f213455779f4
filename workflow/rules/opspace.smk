# The op-space study (opcost.opspace, docs/op-space.md): configurations sampled from each
# op family's parameter ranges, measured in chunks (each job: one chunk, both modes, in
# the measurement worker), the training data of the op models. Config `op_space`; with
# no samples (the default) these rules make nothing. The measurements are raw logs:
# protected, like the profiling jobs'.
if workflow.remote_exec:
    workflow.localrules("measure_op_space")


OP_SPACE_CHUNKS = wf.op_space_chunks(STUDY)


rule op_space_samples:
    output:
        samples="results/op-space/samples.parquet",
    params:
        sampling=wf.op_space_sampling_params(STUDY),
    log:
        "logs/op-space/samples.log",
    run:
        wf.run_op_space_samples(params.sampling, output.samples)


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
        families=lambda wildcards: wf.op_space_families(STUDY, wildcards.gpu),
    run:
        wf.run_op_space_chunk(STUDY, wildcards, input, output, log)


rule op_space_raw:
    input:
        expand(
            "results/op-space/raw/{gpu}/{chunk}.parquet",
            gpu=list(STUDY.gpus),
            chunk=OP_SPACE_CHUNKS,
        ),
