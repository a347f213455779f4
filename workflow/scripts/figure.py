"""Draw one figure (rules figure_*): read the rule's inputs, write its PDF and PNG."""

from opcost.figures import FigureStyle, render

sm = snakemake  # noqa: F821 (injected by Snakemake)
render(
    sm.params.figure,
    dict(sm.input.items()),
    sm.output.pdf,
    sm.output.png,
    FigureStyle(**sm.params.style),
    sm.params.options,
)
with open(sm.log[0], "w") as log:
    log.write(f"{sm.params.figure}: wrote {sm.output.pdf} and {sm.output.png}\n")
