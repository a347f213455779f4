from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        get_final_outputs,
        get_all_raw_logs,
