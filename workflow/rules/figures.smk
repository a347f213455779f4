# Figures (thesis 3.2.3, 3.3 and chapter 5) as PDF (thesis) and PNG (screens, report):
# one rule figure_<name> per entry of the figure registry (opcost.figures.registry), each
# running workflow/scripts/figure.py. The style (config `figures`) is a parameter of the
# figure rules only, so changing it reruns nothing else.
import dataclasses

from opcost.figures import figure_targets, study_figures, style_from_config

FIGURE_STYLE = dataclasses.asdict(style_from_config(config))

# What `rule all` builds of this stage (the sweep figures need a GPU run: not there).
FIGURE_TARGETS = figure_targets(STUDY)


for figure_entry in study_figures(STUDY):

    rule:
        name:
            f"figure_{figure_entry.name}"
        input:
            **figure_entry.inputs(STUDY),
        output:
            pdf=figure_entry.output("pdf"),
            png=report(
                figure_entry.output("png"),
                caption=f"../report/{figure_entry.name}.rst",
                category=figure_entry.category,
            ),
        log:
            figure_entry.log,
        wildcard_constraints:
            **figure_entry.wildcard_constraints,
        conda:
            "../../environment.yml"
        params:
            figure=figure_entry.name,
            options=figure_entry.options_for,
            style=FIGURE_STYLE,
            # A change to the opcost modules the script uses reruns this rule.
            opcost_code=code_version("figure.py"),
        script:
            "../scripts/figure.py"
