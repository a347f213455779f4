from snakemake.utils import min_version

from opcost.config import validate_config

min_version("9.0")


configfile: "config/config.yaml"


# The schema (opcost's package data, src/opcost/config.schema.yaml) with its defaults
# filled in, and short errors naming the field; not snakemake.utils.validate, whose
# message quotes the whole schema and config.
validate_config(config)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/opspace.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        get_final_outputs,
        get_all_raw_logs,
        get_all_traces,
