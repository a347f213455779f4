"""Tests for opcost.figures, the figure rules made from its registry, and tools/figure_docs.py.

The figure functions are drawn from the committed real H100 data (tests/data/h100, and the
probe's power log tests/data/h100_probe), in a fresh interpreter also without torch; slow
tests run every figure rule through Snakemake on that data (a report, a style change that
reruns only the figure rules) and show that one more registry entry is one more rule.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
import yaml

from opcost import figures
from opcost.config import load_schema, load_study_file
from opcost.evaluate import evaluate_measurement
from opcost.figures import FigureError, FigureStyle, render, save_figure, unit_scale
from opcost.names import parse_setting
from opcost.powerlog import read_power_log
from opcost.sweep_record import SweepConfig, gpu_config, read_power_trace
from opcost.validate.dataset import dataset_validation, read_network_ops
from opcost.validate.predictions import prediction_networks, prediction_ops

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "tests" / "data" / "h100"
NETWORKS = ("resnet18_4x3x64x64", "squeezenet1_1_4x3x64x64", "vgg11_4x3x64x64")
PDF_MAGIC = b"%PDF-"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# tools/ is no package of opcost: the repository's root makes it importable.
sys.path.insert(0, str(REPO))
from tools import figure_docs as docs  # noqa: E402


def assert_valid_pdf(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PDF_MAGIC), path
    assert b"%%EOF" in data[-64:], path
    assert len(data) > 2000, path


def assert_valid_png(path: Path) -> np.ndarray:
    assert path.read_bytes().startswith(PNG_MAGIC), path
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100, path
    assert image.shape[1] > 100, path
    # Not a blank page: some pixels are dark.
    assert (image[..., :3].min(axis=2) < 0.5).mean() > 0.001, path
    return image


@pytest.fixture(scope="module")
def validation() -> pd.DataFrame:
    dataset = pd.read_parquet(H100 / "dataset" / "h100.parquet")
    ops = read_network_ops([H100 / "ops" / f"{n}.parquet" for n in NETWORKS])
    return dataset_validation(dataset, ops)


@pytest.fixture(scope="module")
def predictions() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions made from the real measurements by a fixed distortion."""
    dataset = pd.read_parquet(H100 / "dataset" / "h100.parquet")
    rng = np.random.default_rng(0)
    ops = dataset[dataset["kind"] == "op"][
        ["gpu", "setting", "mode", "op_id", "op_type", "time_s", "power_w", "energy_j"]
    ].copy()
    ops["time_pred_s"] = ops["time_s"] * rng.lognormal(0, 0.2, len(ops))
    ops["power_pred_w"] = ops["power_w"] * rng.lognormal(0, 0.03, len(ops))
    ops["energy_pred_j"] = ops["time_pred_s"] * ops["power_pred_w"]
    nets = dataset[dataset["kind"] == "network"][
        ["model_input", "setting", "mode", "time_s", "energy_j"]
    ].copy()
    nets["time_pred_s"] = nets["time_s"] * 1.2
    nets["energy_pred_j"] = nets["energy_j"] * 1.1
    nets["power_pred_w"] = nets["energy_pred_j"] / nets["time_pred_s"]
    nets["n_ops"] = 30
    nets["n_ops_unseen"] = [0, 2, 0, 0, 2, 0]
    return prediction_ops([ops]), prediction_networks({"h100": nets})


def test_targets_include_the_settings_figure_only_with_several_settings():
    study = load_study_file(REPO / "tests/data/configs/tiny.yaml", check_models=False)
    targets = figures.figure_targets(study)
    assert "results/validation/dataset_validation.parquet" in targets
    assert "results/figures/validation_small.pdf" in targets
    assert "results/figures/prediction_networks.png" in targets
    assert not [t for t in targets if "settings" in t or "proportionality" in t]
    two = dataclasses.replace(
        study.gpus["cpu"], settings=(parse_setting("default"), parse_setting("sm1410"))
    )
    more = dataclasses.replace(study, gpus={"cpu": two})
    assert "results/figures/settings.pdf" in figures.figure_targets(more)


def test_style_comes_from_the_config():
    # The schema's documented defaults: 150 dpi, 10 pt.
    assert figures.style_from_config({}) == FigureStyle(dpi=150, font_size=10.0)
    assert FigureStyle() == FigureStyle(dpi=150, font_size=10.0)
    style = figures.style_from_config({"figures": {"dpi": 80, "font_size": 12}})
    assert style == FigureStyle(dpi=80, font_size=12.0)


def test_style_defaults_live_only_in_the_schema(monkeypatch):
    # A default changed in the schema (as opcost.config loads it) changes the style's.
    schema = copy.deepcopy(load_schema())
    schema["properties"]["figures"]["properties"]["dpi"]["default"] = 72
    monkeypatch.setattr("opcost.config.load_schema", lambda: schema)
    assert figures.style_from_config({}) == FigureStyle(dpi=72, font_size=10.0)
    assert figures.style_from_config({"figures": {"font_size": 8}}).dpi == 72


def test_unit_scale_picks_readable_prefixes():
    assert unit_scale([0.0021, 0.0135], "s") == (1000.0, "ms")
    assert unit_scale([2.5e-6], "s") == pytest.approx((1e6, "µs"))
    assert unit_scale([0.3, 2.1], "J") == (1.0, "J")
    assert unit_scale([np.nan], "J") == (1.0, "J")


def test_channel_drops_what_the_evaluation_drops():
    """The startup figure's 3σ channel is the evaluation's filter (3.1)-(3.3)."""
    base = H100 / "raw/h100/default/inference/networks/vgg11_4x3x64x64"
    row = evaluate_measurement(base.with_suffix(".json"), base.with_suffix(".csv"))
    record = json.loads(base.with_suffix(".json").read_text())
    log = read_power_log(base.with_suffix(".csv"))
    local_s = log.samples["timestamp"].to_numpy("datetime64[us]").astype(np.int64) / 1e6
    unix_s = local_s - record["utc_offset_s"]
    inside = (unix_s >= record["timed_start_unix_s"]) & (unix_s <= record["timed_end_unix_s"])
    power = log.samples[log.power_field].to_numpy()[inside]
    mean, sigma, keep = figures.channel(power)
    assert len(power) == row["n_power_samples"]
    assert int((~keep).sum()) == row["n_filtered_out"]
    assert power[keep].mean() == pytest.approx(row["power_w"])
    assert mean == pytest.approx(row["power_unfiltered_w"])
    assert sigma == pytest.approx(row["sigma_power_unfiltered_w"])


@pytest.mark.parametrize("size_class", ["small", "large"])
def test_validation_figure_from_real_data(tmp_path, validation, size_class):
    style = FigureStyle(dpi=50)
    fig = figures.validation_figure(validation, size_class, style)
    # One row per mode (one GPU configuration), time and energy side by side.
    assert len(fig.axes) == 2 * 2
    assert "energy per iteration" in fig.axes[1].get_ylabel()
    assert fig.axes[0].get_ylabel() == "time per iteration [ms]"
    save_figure(fig, tmp_path / "v.pdf", tmp_path / "v.png", style)
    assert_valid_pdf(tmp_path / "v.pdf")
    image = assert_valid_png(tmp_path / "v.png")
    width_in, height_in = fig.get_size_inches()
    assert image.shape[1] == pytest.approx(width_in * 50, abs=1)
    assert image.shape[0] == pytest.approx(height_in * 50, abs=1)


def test_validation_figure_rejects_an_unknown_size_class(validation):
    with pytest.raises(FigureError, match="size_class"):
        figures.validation_figure(validation, "medium")


def test_energy_panels_say_when_there_is_no_power(validation):
    cpu = validation.assign(
        energy_sum_j=np.nan, energy_measured_j=np.nan, sigma_energy_measured_j=np.nan
    )
    fig = figures.validation_figure(cpu, "large")
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert any("no power data (CPU" in t for t in texts)
    fig = figures.network_energy_figure(cpu)
    assert any("no power data (CPU" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_settings_figure_with_one_and_with_several_settings(tmp_path, validation):
    one = figures.settings_figure(validation)
    assert any("one GPU setting" in t.get_text() for ax in one.axes for t in ax.texts)
    more = [validation]
    for setting, slower, clock in (("sm990", 1.8, 990), ("pl300", 1.1, 1800)):
        more.append(
            validation.assign(
                setting=setting,
                time_measured_s=validation["time_measured_s"] * slower,
                sm_clock_mhz=clock,
            )
        )
    fig = figures.settings_figure(pd.concat(more, ignore_index=True))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    # default first, then locked clocks, then power limits; each with its measured clock.
    assert [label.split("\n")[0] for label in labels] == ["default", "sm990", "pl300"]
    assert labels[1].endswith("990 MHz")
    save_figure(fig, tmp_path / "s.pdf", tmp_path / "s.png", FigureStyle(dpi=50))
    assert_valid_png(tmp_path / "s.png")


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("prediction_ops", "ops"),
        ("prediction_errors", "ops"),
        ("prediction_op_types", "ops"),
        ("prediction_networks", "networks"),
    ],
)
def test_prediction_figures_render_from_files(tmp_path, predictions, name, table):
    ops, networks = predictions
    ops.to_parquet(tmp_path / "ops.parquet")
    networks.to_parquet(tmp_path / "networks.parquet")
    inputs = {table: str(tmp_path / f"{table}.parquet")}
    render(name, inputs, tmp_path / f"{name}.pdf", tmp_path / f"{name}.png", FigureStyle(dpi=50))
    assert_valid_pdf(tmp_path / f"{name}.pdf")
    assert_valid_png(tmp_path / f"{name}.png")


def test_prediction_scatter_names_its_error(predictions):
    ops, _ = predictions
    fig = figures.prediction_ops_figure(ops)
    time_panel = fig.axes[0]
    rows = ops[ops["mode"] == "inference"]
    mape = np.mean(np.abs(rows["time_pred_s"] / rows["time_s"] - 1)) * 100
    assert any(f"MAPE {mape:.1f}%" in t.get_text() for t in time_panel.texts)
    assert time_panel.get_xscale() == "log"


def test_power_figures_from_the_real_probe_log(tmp_path):
    gpu_dir = tmp_path / "sweep"
    docs.probe_power_trace("h100", gpu_dir / "t.csv", gpu_dir / "t.json")
    trace = read_power_trace(gpu_dir / "t.csv", gpu_dir / "t.json")
    assert trace.samples is not None
    # probe.log: the first loop starts 6.7 s into the log; its power climbs above 600 W.
    run = trace.events[trace.events["phase"] == "run"].iloc[0]
    during = trace.samples["unix_s"].between(run.start_unix_s + 1, run.end_unix_s)
    assert trace.samples.loc[during, "power_w"].median() > 600
    for name in ("power_trace", "startup_effect"):
        inputs = {"csv": str(gpu_dir / "t.csv"), "record": str(gpu_dir / "t.json")}
        render(
            name, inputs, tmp_path / f"{name}.pdf", tmp_path / f"{name}.png", FigureStyle(dpi=50)
        )
        assert_valid_pdf(tmp_path / f"{name}.pdf")
        assert_valid_png(tmp_path / f"{name}.png")


def test_power_figures_without_power_say_so(tmp_path):
    (tmp_path / "t.csv").write_text("# no power log: device is cpu, time only\n")
    (tmp_path / "t.json").write_text(
        json.dumps({"schema_version": 1, "kind": "power_trace", "power_available": False})
    )
    trace = read_power_trace(tmp_path / "t.csv", tmp_path / "t.json")
    for draw in (figures.power_trace_figure, figures.startup_figure):
        fig = draw(trace)
        assert any("no power data (CPU" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_proportionality_figure_marks_the_fit_and_the_threshold(tmp_path):
    # Proportional at 1 ms per iteration except two short runs with a 0.5 ms fixed cost.
    iterations = [1, 3, *range(100, 1300, 100)]
    measurements = [
        {"repeat": 0, "min_run_time_s": 0.0, "iterations": n,
         "total_time_s": 1e-3 * n * (1 + 1e-4 * (-1) ** k) + (5e-4 if n < 10 else 0.0)}
        for k, n in enumerate(iterations)
    ]  # fmt: skip
    record = {"schema_version": 1, "kind": "proportionality", "measurements": measurements}
    fig = figures.proportionality_figure(record)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("fit t = a·N, a = 1 ms") for t in legend)
    assert any("proportionality breaks below 3.5 ms" in t for t in legend)
    save_figure(fig, tmp_path / "p.pdf", tmp_path / "p.png", FigureStyle(dpi=50))
    assert_valid_pdf(tmp_path / "p.pdf")


def test_pdf_is_reproducible(tmp_path, validation):
    for k in range(2):
        fig = figures.network_energy_figure(validation)
        save_figure(fig, tmp_path / f"{k}.pdf", tmp_path / f"{k}.png", FigureStyle(dpi=50))
    assert (tmp_path / "0.pdf").read_bytes() == (tmp_path / "1.pdf").read_bytes()


def test_unknown_figure_and_missing_input_are_errors(tmp_path):
    with pytest.raises(FigureError, match="unknown figure"):
        render("nope", {}, tmp_path / "a.pdf", tmp_path / "a.png")
    with pytest.raises(FigureError, match="validation"):
        render("network_energy", {}, tmp_path / "a.pdf", tmp_path / "a.png")


# --- the figure rules through Snakemake ------------------------------------------------

FIGURES = (*docs.SAMPLE_FIGURES, "proportionality")


def ran_rules(output: str) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints before running: rule -> jobs."""
    if "Job stats:" not in output:
        return {}
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_figure_rules_on_real_data_and_a_style_change_reruns_only_them(tmp_path):
    work = tmp_path / "work"
    config = docs.prepare_workdir(work, figures={"dpi": 60, "font_size": 10})
    gpu = next(iter(yaml.safe_load(config.read_text())["gpus"]))
    # The proportionality sweep, measured here on the CPU (a GPU run is the lead's).
    from opcost.sweep import run_proportionality

    sweep = SweepConfig.from_config(
        {"input": [2, 3, 32, 32], "longest_run_s": 0.012, "points": 6, "short_points": 1}
    )
    cpu = gpu_config(gpu, {"device": "cpu", "tf32": True, "dtype": "float32"})
    profile = {"min_run_time_s": 0.02, "warmup_s": 0.005, "max_block_size": 4}
    run_proportionality(cpu, profile, sweep, work / f"results/sweep/{gpu}/proportionality.json")
    targets = [f"results/figures/{name}.{ext}" for name in FIGURES for ext in ("pdf", "png")]

    first = docs.run_snakemake(work, config, targets)
    assert first.returncode == 0, first.stderr[-5000:]
    first_rules = ran_rules(first.stderr + first.stdout)
    assert first_rules.get("validate_dataset") == 1
    assert not {"evaluate", "profile_op", "profile_network", "extract"} & set(first_rules)
    widths = {}
    for name in FIGURES:
        assert_valid_pdf(work / f"results/figures/{name}.pdf")
        widths[name] = assert_valid_png(work / f"results/figures/{name}.png").shape[1]
    table = pd.read_parquet(work / "results/validation/dataset_validation.parquet")
    assert len(table) == 12

    report = docs.run_snakemake(work, config, targets, "--report", str(work / "report.html"))
    assert report.returncode == 0, report.stderr[-3000:]
    html = (work / "report.html").read_text()
    for name in FIGURES:
        assert f"{name}.png" in html
    assert "Summed operations against measured whole networks, small" in html  # caption

    restyled = (
        config.read_text().replace("dpi: 60", "dpi: 50").replace("font_size: 10", "font_size: 8")
    )
    config.write_text(restyled)
    second = docs.run_snakemake(work, config, targets)
    assert second.returncode == 0, second.stderr[-5000:]
    rules = ran_rules(second.stderr + second.stdout)
    assert rules, second.stderr[-3000:]
    assert set(rules) - {"total"} == {
        f"figure_{name}" for name in FIGURES if not name.startswith("validation_")
    } | {"figure_validation"}
    assert rules["figure_validation"] == 2
    for name in FIGURES:
        width = assert_valid_png(work / f"results/figures/{name}.png").shape[1]
        assert width == pytest.approx(widths[name] * 50 / 60, abs=2)


@pytest.mark.slow
def test_sweep_rules_run_on_the_cpu(tmp_path):
    schema = yaml.safe_load((REPO / "src/opcost/config.schema.yaml").read_text())
    # The config below sets a sweep section: a schema without one would refuse it.
    assert "sweep" in schema["properties"], "the config schema lost its sweep section"
    work = tmp_path / "work"
    work.mkdir()
    (work / "Snakefile").write_text(docs.scratch_snakefile(REPO))
    config = yaml.safe_load((REPO / "tests/data/configs/tiny.yaml").read_text())
    config["sweep"] = {
        "input": [2, 3, 32, 32],
        "longest_run_s": 0.03,
        "points": 6,
        "short_points": 1,
        "repeats": 1,
        "idle_s": 0.05,
        "run_s": 0.02,
        "cycles": 2,
        "overlay_runs": 2,
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    names = ("proportionality", "power_trace", "startup_effect")
    targets = [f"results/figures/{name}.pdf" for name in names]
    run = docs.run_snakemake(work, path, targets)
    assert run.returncode == 0, run.stderr[-5000:]
    assert ran_rules(run.stderr + run.stdout)["sweep_power_trace"] == 1
    record = json.loads((work / "results/sweep/cpu/power_trace.json").read_text())
    assert record["power_available"] is False
    for name in names:
        assert_valid_pdf(work / f"results/figures/{name}.pdf")
        assert_valid_png(work / f"results/figures/{name}.png")


# --- torch-free drawing, the registry and the rules made from it ------------------------


def test_drawing_figures_does_not_import_torch(tmp_path, validation):
    # In a fresh interpreter: import opcost.figures, draw figures from committed data (the
    # dataset-validation table of tests/data/h100, the H100 probe's power log).
    validation.to_parquet(tmp_path / "validation.parquet")
    script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
import opcost.figures as figures
from tools import figure_docs
out = Path({str(tmp_path)!r})
figure_docs.probe_power_trace("h100", out / "t.csv", out / "t.json")
trace = {{"csv": str(out / "t.csv"), "record": str(out / "t.json")}}
for name, inputs in (
    ("network_energy", {{"validation": str(out / "validation.parquet")}}),
    ("power_trace", trace),
    ("startup_effect", trace),
):
    figures.render(name, inputs, out / f"{{name}}.pdf", out / f"{{name}}.png")
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]"
    for name in ("network_energy", "power_trace", "startup_effect"):
        assert_valid_png(tmp_path / f"{name}.png")


def test_a_registry_entry_describes_its_rule():
    study = load_study_file(REPO / "tests/data/configs/tiny.yaml", check_models=False)
    entry = figures.figure_entry("validation")
    assert entry.output("pdf") == "results/figures/validation_{size}.pdf"
    assert entry.log == "logs/figures/validation_{size}.log"
    assert entry.wildcard_constraints == {"size": "small|large"}
    assert entry.stems() == ["validation_small", "validation_large"]
    assert entry.options_for(dataclasses.make_dataclass("W", ["size"])("large")) == {
        "size_class": "large"
    }
    assert entry.inputs(study) == {"validation": "results/validation/dataset_validation.parquet"}
    trace = figures.figure_entry("startup_effect")
    assert trace.stems() == ["startup_effect"]
    assert trace.options_for(object()) == {}
    assert trace.inputs(study) == {
        "csv": "results/sweep/cpu/power_trace.csv",
        "record": "results/sweep/cpu/power_trace.json",
    }
    # The sweep's GPU configuration is config sweep.gpu, else the study's first.
    two = dataclasses.replace(
        study,
        gpus={**study.gpus, "h100": study.gpus["cpu"]},
        config={**study.config, "sweep": {"gpu": "h100"}},
    )
    assert trace.inputs(two)["csv"] == "results/sweep/h100/power_trace.csv"
    with pytest.raises(FigureError, match="unknown figure 'nope'"):
        figures.figure_entry("nope")


def test_code_version_of_the_figure_rules_follows_the_figures_package(tmp_path, monkeypatch):
    # figure.py imports opcost.figures, a package: a change to any module of it reruns the
    # figure rules; a change to a module no figure uses does not.
    import shutil

    from opcost import workflow as wf

    copy_dir = tmp_path / "opcost"
    shutil.copytree(wf.PACKAGE_DIR, copy_dir, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(wf, "PACKAGE_DIR", copy_dir)
    script = REPO / "workflow" / "scripts" / "figure.py"
    before = wf.code_version.__wrapped__(script)
    for changed, reruns in (
        ("train.py", False),
        ("figures/prediction.py", True),
        ("sweep_record.py", True),
        ("sweep.py", False),
        ("figures/__init__.py", True),
    ):
        with open(copy_dir / changed, "a") as f:
            f.write("# a comment\n")
        after = wf.code_version.__wrapped__(script)
        assert (after != before) == reruns, changed
        before = after


def test_figures_smk_makes_every_figure_rule_from_the_registry():
    # One rule, in a loop over the registry, with the figure script's code version; the
    # measuring sweep rules live elsewhere (sweep.smk), without one.
    text = (REPO / "workflow/rules/figures.smk").read_text()
    assert re.findall(r"^[ \t]*rule\b.*:", text, re.M) == ["    rule:"]
    assert "for figure_entry in study_figures(STUDY):\n" in text
    assert 'opcost_code=code_version("figure.py")' in text
    sweep = (REPO / "workflow/rules/sweep.smk").read_text()
    rules = re.findall(r"^rule (\w+):", sweep, re.M)
    assert rules == ["sweep_proportionality", "sweep_power_trace"]
    assert "opcost_code" not in sweep


#: The figure rules before they were made from the registry: output stem -> (rule, log).
OLD_FIGURE_RULES = {
    "proportionality": "figure_proportionality",
    "power_trace": "figure_power_trace",
    "startup_effect": "figure_startup_effect",
    "validation_small": "figure_validation",
    "validation_large": "figure_validation",
    "network_energy": "figure_network_energy",
    "settings": "figure_settings",
    "prediction_ops": "figure_prediction_ops",
    "prediction_errors": "figure_prediction_errors",
    "prediction_op_types": "figure_prediction_op_types",
    "prediction_networks": "figure_prediction_networks",
}


def dry_run_jobs(output: str) -> dict[str, dict[str, str]]:
    """The jobs of a dry run's listing: first output -> rule, output, log, wildcards."""
    jobs = {}
    for block in re.split(r"\n(?=rule \w+:)", output):
        rule = re.match(r"rule (\w+):", block)
        if not rule:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, re.M))
        jobs[fields["output"].split(", ")[0]] = {"rule": rule[1], **fields}
    return jobs


@pytest.mark.slow
def test_figure_rules_come_from_the_registry(tmp_path):
    # Run Snakemake with one more registry entry: the old figures keep their rules,
    # outputs and logs, and the new entry is one more rule with its own output.
    work = tmp_path / "work"
    for path in (
        "results/validation/dataset_validation.parquet",
        "results/validation/prediction_ops.parquet",
        "results/validation/prediction_networks.parquet",
        "results/sweep/cpu/proportionality.json",
        "results/sweep/cpu/power_trace.csv",
        "results/sweep/cpu/power_trace.json",
    ):
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).touch()
    (work / "Snakefile").write_text(docs.scratch_snakefile(REPO))
    stems = [*OLD_FIGURE_RULES, "energy_copy"]
    targets = [f"results/figures/{stem}.{ext}" for stem in stems for ext in ("pdf", "png")]
    script = """
import dataclasses, sys
import opcost.figures as figures
from opcost.figures import registry
extra = dataclasses.replace(figures.figure_entry("network_energy"), name="energy_copy")
figures.FIGURES = registry.FIGURES = (*registry.FIGURES, extra)
from snakemake.cli import main
sys.argv = ["snakemake", *sys.argv[1:]]
main()
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    run = subprocess.run(
        [sys.executable, "-c", script, "-s", str(work / "Snakefile"), "-d", str(work)]
        + ["--configfile", str(REPO / "tests/data/configs/tiny.yaml"), "-n", *targets],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-5000:]
    jobs = dry_run_jobs(run.stdout + run.stderr)
    expected = {**OLD_FIGURE_RULES, "energy_copy": "figure_energy_copy"}
    assert {f"results/figures/{s}.pdf": r for s, r in expected.items()} == {
        output: job["rule"] for output, job in jobs.items()
    }
    for stem in expected:
        job = jobs[f"results/figures/{stem}.pdf"]
        assert job["output"] == f"results/figures/{stem}.pdf, results/figures/{stem}.png"
        assert job["log"] == f"logs/figures/{stem}.log"
    assert jobs["results/figures/validation_large.pdf"]["wildcards"] == "size=large"
    assert jobs["results/figures/energy_copy.pdf"]["input"] == (
        "results/validation/dataset_validation.parquet"
    )


def test_a_study_that_only_includes_measurements_has_no_sweep_figure_rules(monkeypatch):
    """The sweeps measure on one of the study's own GPU configurations: where it profiles
    none (the default study), their figures get no rule; every other figure keeps its."""
    from opcost.config import load_study_file
    from opcost.figures import FIGURES, study_figures

    monkeypatch.chdir(REPO)
    sweeps = {"proportionality", "power_trace", "startup_effect"}
    shipped = {e.name for e in study_figures(load_study_file("config/config.yaml"))}
    assert shipped == {e.name for e in FIGURES} - sweeps
    local = {e.name for e in study_figures(load_study_file("config/local-gpu.yaml"))}
    assert local == {e.name for e in FIGURES}


def test_many_networks_get_upright_labels_few_keep_theirs():
    import matplotlib.pyplot as plt

    from opcost.figures.style import UPRIGHT_LABELS_ABOVE, network_ticks

    fig, (few, many) = plt.subplots(1, 2)
    network_ticks(few, range(3), ["a", "b", "c"])
    n = UPRIGHT_LABELS_ABOVE + 1
    network_ticks(many, range(n), [f"net{i}" for i in range(n)])
    assert {t.get_rotation() for t in few.get_xticklabels()} == {0.0}
    assert {t.get_rotation() for t in many.get_xticklabels()} == {90.0}
    plt.close(fig)


# --- op-space figures (issue #23) --------------------------------------------------------


def opspace_ops() -> pd.DataFrame:
    """GPU times per call, by hand: conv in µs, linear in ms, softmax none usable."""
    rows = [
        # family, gpu, source, measured_s, predicted_s
        ("conv", "h100", "held-out samples", 100e-6, 110e-6),  # +10 %
        ("conv", "h100", "held-out samples", 200e-6, 150e-6),  # -25 %
        ("conv", "h200", "network ops", 50e-6, 60e-6),  # +20 %
        ("conv", "h200", "network ops", 80e-6, np.nan),  # left out
        ("conv", "h100", "held-out samples", 0.0, 30e-6),  # left out
        ("linear", "h100", "held-out samples", 2e-3, 2.2e-3),  # +10 %
        ("linear", "h200", "held-out samples", 4e-3, 3e-3),  # -25 %
        ("linear", "h200", "held-out samples", 1e-3, 1.05e-3),  # +5 %
        ("linear", "h200", "network ops", 1e-3, 1.5e-3),  # +50 %
        ("softmax", "h100", "network ops", -1e-6, 2e-6),  # left out
        ("softmax", "h200", "network ops", 3e-6, np.inf),  # left out
    ]
    return pd.DataFrame(rows, columns=["family", "gpu", "source", "measured_s", "predicted_s"])


def panel_points(ax) -> list[tuple[float, float]]:
    return sorted(
        (round(float(x), 9), round(float(y), 9)) for c in ax.collections for x, y in c.get_offsets()
    )


def test_opspace_op_types_figure_draws_each_family_from_its_rows(tmp_path):
    ops = opspace_ops()
    fig = figures.opspace_op_types_figure(ops)
    assert fig.get_suptitle() == (
        "Op models from the op space: predicted against measured GPU time per op family"
    )
    # One panel per family present, in the op space's order.
    assert [ax.get_title() for ax in fig.axes] == ["conv", "linear", "softmax"]
    conv, linear, softmax = fig.axes
    # Every usable row is one point at (measured, predicted), in µs and ms; the others
    # (NaN, 0, negative, inf) are not drawn.
    assert panel_points(conv) == [(50.0, 60.0), (100.0, 110.0), (200.0, 150.0)]
    assert conv.get_xlabel() == "measured GPU time [µs]"
    assert panel_points(linear) == [(1.0, 1.05), (1.0, 1.5), (2.0, 2.2), (4.0, 3.0)]
    assert linear.get_ylabel() == "predicted GPU time [ms]"
    assert conv.get_xscale() == conv.get_yscale() == "log"
    assert panel_points(softmax) == []
    # Median |error| per source: conv held-out median(10, 25) = 17.5, network ops 20;
    # linear held-out median(10, 25, 5) = 10, network ops 50.
    conv_text = "\n".join(t.get_text() for t in conv.texts)
    assert "held-out samples: 17.5% (n = 2)" in conv_text
    assert "network ops: 20.0% (n = 1)" in conv_text
    assert "2 left out" in conv_text
    linear_text = "\n".join(t.get_text() for t in linear.texts)
    assert "held-out samples: 10.0% (n = 3)" in linear_text
    assert "network ops: 50.0% (n = 1)" in linear_text
    assert "left out" not in linear_text
    softmax_text = "\n".join(t.get_text() for t in softmax.texts)
    assert "no positive GPU times" in softmax_text
    assert "2 left out" in softmax_text
    # The identity line and the ±10 % band: y = x, y = 0.9 x, y = 1.1 x.
    slopes = sorted(round(line.get_ydata()[1] / line.get_xdata()[1], 6) for line in conv.lines)
    assert slopes == [0.9, 1.0, 1.1]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "h100",
        "h200",
        "held-out samples",
        "network ops",
        "prediction = measurement",
        "±10 %",
    ]
    save_figure(fig, tmp_path / "o.pdf", tmp_path / "o.png", FigureStyle(dpi=50))
    assert_valid_pdf(tmp_path / "o.pdf")
    assert_valid_png(tmp_path / "o.png")


def test_opspace_op_types_figure_marks_sources_and_colours_gpus():
    fig = figures.opspace_op_types_figure(opspace_ops())
    linear = fig.axes[1]
    # One collection per GPU and source; h200's held-out points, two, share one colour.
    sizes = sorted(len(c.get_offsets()) for c in linear.collections)
    assert sizes == [1, 1, 2]
    colors = {tuple(np.round(c.get_facecolor()[0][:3], 6)) for c in linear.collections}
    assert len(colors) == 2


def test_opspace_op_types_figure_without_rows_says_so():
    empty = opspace_ops().iloc[:0]
    fig = figures.opspace_op_types_figure(empty)
    assert any("no op predictions" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_prediction_networks_figure_takes_a_title_and_a_predicted_label(predictions):
    _, networks = predictions
    default = figures.prediction_networks_figure(networks)
    assert default.get_suptitle() == (
        "Network level: predicted against measured (leave-one-network-out)"
    )
    default_legend = [t.get_text() for t in default.legends[0].get_texts()]
    assert default_legend[:2] == ["measured network", "sum of operation predictions"]
    fig = figures.prediction_networks_figure(
        networks,
        title="Networks replayed from op-space predictions: predicted against measured",
        predicted_label="replay of predicted ops",
    )
    assert fig.get_suptitle() == (
        "Networks replayed from op-space predictions: predicted against measured"
    )
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "replay of predicted ops" if t.startswith("sum of") else t for t in default_legend
    ]
    # The bars are the same either way.
    for a, b in zip(default.axes, fig.axes, strict=True):
        assert [p.get_height() for p in a.patches] == [p.get_height() for p in b.patches]
