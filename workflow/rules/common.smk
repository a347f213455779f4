from pathlib import Path

from opcost.config import load_study
from opcost.names import (
    MODEL_INPUT_PATTERN,
    MODE_PATTERN,
    NAME_PATTERN,
    OP_ID_PATTERN,
    SETTING_PATTERN,
    SPEC_VERSION,
)
from opcost import workflow as wf
from opcost import opspace_workflow as osw
from opcost import included
from opcost.model.sources import SHIPPED as SHIPPED_PREDICTORS, ship as ship_predictor
from opcost import slurm as slurm_preflight
from opcost import worker
from opcost import snakemake_compat

# Snakemake 9 can form the profiling batches (profiles/slurm: groups, group-components)
# twice and submit both: the same ops measured twice at once. This makes the batching
# the same however often Snakemake forms it, and stops with one line on a Snakemake
# whose internals it was not checked against (opcost.snakemake_compat).
snakemake_compat.apply()

# Schema checks ran in the Snakefile; this adds the checks of meaning (model names,
# shapes, settings, safe names) so a bad config fails before any job starts.
STUDY = load_study(config)
MODEL_INPUTS = {mi.name: mi for mi in STUDY.model_inputs}

# A SIGINT to Snakemake (Ctrl-C, or `kill -INT` to it alone) also stops the measurement
# running in its worker, so an interrupted profiling job leaves no raw log behind.
worker.stop_on_interrupt()
# So does a SIGTERM (scancel, a time limit), and Snakemake then ends once the jobs of other
# rules have (its own handler could deadlock). A batch on a cluster ends itself 5 s later
# at the latest: where SLURM tracks processes without cgroups its SIGKILL cannot reach it.
worker.stop_on_terminate(
    exit_after_s=worker.BATCH_EXIT_AFTER_SIGTERM_S if workflow.remote_exec else None
)


wildcard_constraints:
    gpu=NAME_PATTERN,
    setting=SETTING_PATTERN,
    mode=MODE_PATTERN,
    op_id=OP_ID_PATTERN,
    model_input=MODEL_INPUT_PATTERN,


# After Snakemake has set up the executor, before it submits the first job (not in a dry
# run): a run through the SLURM plugin whose status command cannot answer (sacct without
# accounting storage) would wait forever, so it stops here with one line (opcost.slurm).
onstart:
    slurm_preflight.check_run(workflow)


UNIQUE_OPS = "results/ops/unique.parquet"


# The stage scripts beside these rules (workflow/scripts), wherever the Snakefile that
# includes them lies: a study may keep its own Snakefile in another directory.
SCRIPTS_DIR = Path(str(workflow.current_basedir)).parent / "scripts"


def code_version(script):
    # A hash of the opcost modules that workflow/scripts/<script> uses: a parameter of the
    # rule that runs it, so a change to its stage's code in the package reruns it (and
    # what depends on it). The profiling and sweep rules take none: raw logs are ground
    # truth (opcost.workflow.code_version).
    return wf.code_version(SCRIPTS_DIR / script)


def get_unique_ops_path():
    return checkpoints.unique_ops.get().output.unique


def get_op_spec(wildcards):
    # Read from the file, not through the checkpoint: a profiling job exists only once
    # the checkpoint has run, and the Snakemake process that runs a batch of them on a
    # cluster knows nothing of the checkpoint (its DAG holds the batch only).
    return wf.op_spec(UNIQUE_OPS, wildcards.op_id)


def get_raw_prefixes(wildcards):
    if wildcards.gpu in STUDY.included:
        return []
    op_ids = list(wf.unique_ops(get_unique_ops_path()).index)
    return wf.raw_prefixes(STUDY, wildcards.gpu, op_ids)


def get_raw_jsons(wildcards):
    return [f"{p}.json" for p in get_raw_prefixes(wildcards)]


def get_raw_csvs(wildcards):
    return [f"{p}.csv" for p in get_raw_prefixes(wildcards)]


def get_traces(wildcards):
    if wildcards.gpu in STUDY.included:
        return []
    op_ids = list(wf.unique_ops(get_unique_ops_path()).index)
    return [f"{p}.json" for p in wf.trace_prefixes(STUDY, wildcards.gpu, op_ids)]


def get_traced_records(wildcards):
    # What carries one GPU configuration's traces: its trace jobs' outputs, or, where its
    # profiling jobs trace (profile.traces), its raw logs.
    if wf.traced_in_job(STUDY.config["profile"], STUDY.gpus[wildcards.gpu].device):
        return get_raw_jsons(wildcards)
    return get_traces(wildcards)


def get_all_traces(wildcards):
    # Part of the default target for the same reason as the raw logs (below).
    if not STUDY.gpus:
        return []
    op_ids = list(wf.unique_ops(get_unique_ops_path()).index)
    return [
        f"{prefix}.json"
        for gpu in STUDY.gpus
        for prefix in wf.trace_prefixes(STUDY, gpu, op_ids)
    ]


def get_all_raw_logs(wildcards):
    # Part of the default target: a raw log deleted to remeasure it is a missing target,
    # so the next `snakemake` measures it again and rebuilds what depends on it. (As an
    # input of `evaluate` only, Snakemake would treat it as an intermediate file and
    # keep the dataset made from it.) A study that profiles nothing extracts nothing.
    if not STUDY.gpus:
        return []
    op_ids = list(wf.unique_ops(get_unique_ops_path()).index)
    return [
        f"{prefix}.{ext}"
        for gpu in STUDY.gpus
        for prefix in wf.raw_prefixes(STUDY, gpu, op_ids)
        for ext in ("json", "csv")
    ]


def get_included_raw(wildcards):
    # An included GPU configuration's raw logs: its unpacked dataset archives (rule
    # unpack_included), or the benchmark JSONs in another study's working directory.
    paths = []
    sources = STUDY.included.get(wildcards.gpu, ())
    for source, root in zip(sources, included.roots(STUDY, wildcards.gpu)):
        if source.layout == "dataset":
            paths.append(root)
        else:
            paths += [str(p) for p in included.raw_jsons(source, root)[0]]
    return paths


def get_op_tables(wildcards):
    return included.op_tables(STUDY, wildcards.gpu)


# Every op table of every evaluated GPU configuration, and which are whose: a profiled
# configuration's are this study's, an included one's those it was measured with.
OP_TABLES_BY_GPU = included.op_tables_by_gpu(STUDY)
ALL_OP_TABLES = sorted({t for tables in OP_TABLES_BY_GPU.values() for t in tables})


def get_slurm_gpu_model(wildcards):
    # An empty string makes the SLURM plugin ask for any GPU (--gpus=1).
    return STUDY.gpus[wildcards.gpu].slurm_gpu_model or ""


def get_slurm_constraint(wildcards):
    # An empty string is `sbatch -C ''`: no node constraint.
    return STUDY.gpus[wildcards.gpu].slurm_constraint or ""


def get_final_outputs(wildcards):
    # FIGURE_TARGETS (figures.smk) holds the validation tables' figures and the report's;
    # OP_MODEL_MANIFESTS (opspace.smk) the op models'.
    gpus = STUDY.evaluated_gpus
    if not gpus:
        # A study of op-space data only (op_space.data, no gpus, no include).
        return OP_MODEL_MANIFESTS
    traced = any(g.device == "cuda" for g in gpus.values())
    return (
        FIGURE_TARGETS
        + OP_MODEL_MANIFESTS
        + (["results/validation/replay.parquet"] if traced else [])
        + expand(
            "results/dataset/{gpu}.{name}",
            gpu=gpus,
            name=["parquet", "failed.csv"],
        )
        + expand(
            "results/predictors/{gpu}/{name}",
            gpu=gpus,
            name=[
                "time.npz",
                "features.json",
                "metrics.json",
                "holdout_predictions.parquet",
                "network_predictions.parquet",
                "manifest.json",
            ],
        )
    )
