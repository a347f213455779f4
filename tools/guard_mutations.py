"""Do the reliability tests fail when the guard they check is removed?

For each guard (a check in the source that refuses bad input, survives a fault, or keeps a
caller's string away from a shell or a path), this copies the repository to a temporary
folder, removes the guard there with one exact text replacement, and runs the one test
that checks it against that copy. The test must pass on an unmutated copy and fail on the
mutated one; a test that still passes does not check its guard.

Usage, from the repository root::

    python tools/guard_mutations.py              # every guard (10 to 20 minutes on 2 cores)
    python tools/guard_mutations.py --list       # the guards, their mutations and tests
    python tools/guard_mutations.py --only profile-oom-failed --only check-name

It prints a Markdown table (guard, category, mutation, test, passes unmutated, fails
mutated, seconds) and exits 0 when every test passes unmutated and fails mutated, 1 when
one does not, 2 when a mutation's text does not occur exactly once (the source changed:
update the mutation). docs/reliability.md holds the last table.

The copies are taken from one snapshot, made at the start, of the files
``git ls-files --cached --others --exclude-standard`` lists (the working tree, uncommitted
changes included, without results/, .snakemake/ or caches). Each
test runs as ``python -m pytest NODEID -q -p no:cacheprovider`` with the copy as working
directory and its ``src`` first on ``PYTHONPATH``, and without bytecode files, so that a
mutated module is never shadowed by a cached one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Longest a single test run may take (the pipeline tests run Snakemake), seconds.
TEST_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Guard:
    """One guard, the mutation that removes it, and the test that must notice."""

    name: str
    category: str  # "bad input", "faults" or "security"
    path: str  # file in the repository
    old: str  # exact text; must occur exactly once in ``path``
    new: str
    test: str  # pytest node id
    mutation: str  # what the replacement does, in words


BAD_INPUT = "tests/test_bad_input.py::"
FAULTS = "tests/test_faults.py::"
SECURITY = "tests/test_security.py::"
SCHEMA = "src/opcost/config.schema.yaml"
FACTORY = BAD_INPUT + "test_model_that_is_no_network_factory_is_refused_at_config_load"

GUARDS: tuple[Guard, ...] = (
    # --- bad input --------------------------------------------------------------------------
    Guard(
        "schema-unknown-key",
        "bad input",
        SCHEMA,
        "type: object\nadditionalProperties: false\nproperties:\n  models:",
        "type: object\nproperties:\n  models:",
        BAD_INPUT + "test_bad_config_names_the_field[unknown-key]",
        "schema: drop top-level `additionalProperties: false`",
    ),
    Guard(
        "schema-empty-models",
        "bad input",
        SCHEMA,
        "    type: array\n    minItems: 1\n    default:\n      - {model: resnet18",
        "    type: array\n    default:\n      - {model: resnet18",
        BAD_INPUT + "test_bad_config_names_the_field[empty-models]",
        "schema: drop `models.minItems: 1`",
    ),
    Guard(
        "schema-shape-positive-int",
        "bad input",
        SCHEMA,
        "            items: {type: integer, minimum: 1}\n",
        "            items: {}\n",
        BAD_INPUT + "test_bad_config_names_the_field[shape-zero]",
        "schema: input dimensions need not be positive integers",
    ),
    Guard(
        "schema-min-run-time",
        "bad input",
        SCHEMA,
        "        exclusiveMinimum: 0\n        default: 1.0\n      warmup_s:",
        "        default: 1.0\n      warmup_s:",
        BAD_INPUT + "test_bad_config_names_the_field[min-run-time-zero]",
        "schema: drop `min_run_time_s.exclusiveMinimum: 0`",
    ),
    Guard(
        "config-unknown-model",
        "bad input",
        "src/opcost/config.py",
        "        elif check_models and not _is_torchvision_model(model):",
        "        elif False:",
        BAD_INPUT + "test_bad_config_names_the_field[unknown-model]",
        "load_study: skip the torchvision model check",
    ),
    Guard(
        "config-shape-rank",
        "bad input",
        "src/opcost/config.py",
        '            if ":" not in model and len(shape) != 4:',
        "            if False:",
        BAD_INPUT + "test_bad_config_names_the_field[shape-rank-3]",
        "load_study: skip the 4-dimension check",
    ),
    Guard(
        "config-duplicate",
        "bad input",
        "src/opcost/config.py",
        "            if name in seen:",
        "            if False:",
        BAD_INPUT + "test_bad_config_names_the_field[duplicate]",
        "load_study: skip the duplicate model-input check",
    ),
    Guard(
        "parse-setting",
        "bad input",
        "src/opcost/names.py",
        "    if not isinstance(text, str) or not _SETTING_RE.fullmatch(text):",
        "    if not isinstance(text, str):",
        # Not sm-5: the bounds (guard setting-bounds) refuse it too.
        BAD_INPUT + "test_setting_int_would_read_but_no_safe_name_is_refused[underscore]",
        "parse_setting: no pattern match",
    ),
    Guard(
        "config-gpu-name",
        "bad input",
        "src/opcost/config.py",
        '            check_name(name, f"gpus.{name}")',
        "            pass",
        BAD_INPUT + "test_unsafe_gpu_configuration_names_are_refused",
        "load_study: GPU configuration names unchecked",
    ),
    Guard(
        "cli-parse-shape",
        "bad input",
        "src/opcost/cli.py",
        "    if not shape or any(d <= 0 for d in shape):",
        "    if not shape:",
        BAD_INPUT + "test_parse_shape_rejects",
        "parse_shape: accept zero dimensions",
    ),
    Guard(
        "predict-missing-dir",
        "bad input",
        "src/opcost/model/format.py",
        "    if not root.is_dir():",
        "    if False:",
        BAD_INPUT + "test_errors_end_with_one_line_and_exit_2",
        "load_predictors: no check that the directory exists",
    ),
    Guard(
        "feature-schema",
        "bad input",
        "src/opcost/model/features.py",
        "    if list(columns) != expected:",
        "    if False:",
        BAD_INPUT + "test_incompatible_feature_schema_names_the_model_file",
        "check_schema: skip the column comparison",
    ),
    Guard(
        "corrupt-parquet",
        "bad input",
        "src/opcost/io.py",
        "    except Exception as e:  # pyarrow raises several types for a corrupt file",
        "    except ImportError as e:  # pyarrow raises several types for a corrupt file",
        BAD_INPUT + "test_corrupt_op_table",
        "read_parquet: let pyarrow's error through",
    ),
    Guard(
        "parquet-columns",
        "bad input",
        "src/opcost/io.py",
        "    if missing:\n        raise TableError",
        "    if False:\n        raise TableError",
        BAD_INPUT + "test_op_table_without_its_columns",
        "read_parquet: skip the column check",
    ),
    # --- faults -----------------------------------------------------------------------------
    Guard(
        "nvsmi-missing",
        "faults",
        "src/opcost/nvsmi.py",
        "    if found is None:\n        raise NvidiaSmiError(MISSING_MESSAGE)\n",
        "",
        FAULTS + "test_missing_binary_suggests_cpu",
        "nvidia_smi_path: no check that nvidia-smi was found",
    ),
    Guard(
        "nvsmi-exit-at-start",
        "faults",
        "src/opcost/nvsmi_logger.py",
        "            if code is not None:\n                raise NvidiaSmiError(",
        "            if False:\n                raise NvidiaSmiError(",
        FAULTS + "test_unknown_gpu_fails_at_start",
        "PowerLogger: ignore an exit within the grace time",
    ),
    Guard(
        "nvsmi-died-midway",
        "faults",
        "src/opcost/nvsmi_logger.py",
        "        if died is not None:",
        "        if False:",
        FAULTS + "test_logger_that_dies_midway_fails_on_exit",
        "PowerLogger.stop: ignore a logger that died on its own",
    ),
    Guard(
        "nvsmi-no-sample",
        "faults",
        "src/opcost/nvsmi_logger.py",
        "        if len(lines) < 3:",
        "        if False:",
        FAULTS + "test_logger_that_writes_nothing_fails_on_exit",
        "PowerLogger: accept a log without a sample",
    ),
    Guard(
        "powerlog-drop-bad-rows",
        "faults",
        "src/opcost/powerlog.py",
        "        usable &= ~np.isnan(columns[name])",
        "        pass",
        FAULTS + "test_junk_rows_are_dropped_and_counted",
        "read_power_log: keep rows with [N/A] in a used field",
    ),
    Guard(
        "powerlog-no-usable-row",
        "faults",
        "src/opcost/powerlog.py",
        "    if n_usable == 0:",
        "    if False:",
        FAULTS + "test_unusable_log_fails_naming_the_file",
        "read_power_log: return an empty log instead of failing",
    ),
    Guard(
        "evaluate-no-row-in-window",
        "faults",
        "src/opcost/method.py",
        "    if gaps:\n",
        "    if False:\n",
        FAULTS + "test_no_row_in_window_fails_naming_the_file",
        "check_coverage: a log that misses the timed window gives NaN power",
    ),
    Guard(
        "profile-oom-failed",
        "faults",
        "src/opcost/profile.py",
        "    except (RuntimeError, ValueError, NotImplementedError) as e:",
        "    except (ValueError, NotImplementedError) as e:",
        FAULTS + "test_out_of_memory_is_recorded_as_failed_and_the_job_succeeds",
        "profile._measure_into: out of memory fails the job",
    ),
    Guard(
        "profile-temporary-csv",
        "faults",
        "src/opcost/io.py",
        '    return path.with_name(f".{path.name}.tmp-{os.getpid()}")',
        "    return path",
        FAULTS + "test_job_killed_mid_measurement_leaves_no_final_output[SIGKILL]",
        "io.staged_path: write the CSV and JSON under their final names",
    ),
    Guard(
        "profile-temporary-removed",
        "faults",
        "src/opcost/profile.py",
        "        tmp_csv.unlink(missing_ok=True)\n        raise\n",
        "        raise\n",
        "tests/test_worker.py::test_a_worker_killed_mid_job_fails_the_job_and_leaves_no_output"
        "[15-143]",
        "profile.power_log: a job cut off keeps its temporary file",
    ),
    Guard(
        "worker-sigterm-unwinds",
        "faults",
        "src/opcost/worker.py",
        "        with gpu_setting.sigterm_unwinds():\n",
        "        if True:\n",
        "tests/test_worker.py::test_a_worker_killed_mid_job_fails_the_job_and_leaves_no_output"
        "[15-143]",
        "worker: SIGTERM ends the worker at once, without unwinding the job",
    ),
    Guard(
        "worker-parent-watch",
        "faults",
        "src/opcost/worker.py",
        "    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()\n",
        "",
        "tests/test_worker.py::test_the_worker_ends_when_its_parent_dies[mid-job]",
        "worker: no watch on the parent, an orphan measures on",
    ),
    Guard(
        "evaluate-failure-table",
        "faults",
        "src/opcost/evaluate.py",
        "            failures.append({c: row[c] for c in FAILURE_COLUMNS})",
        "            pass",
        FAULTS + "test_out_of_memory_study_goes_on_and_lists_the_failure",
        "evaluate_files: leave failed measurements out of the failure table",
    ),
    Guard(
        "raw-logs-protected",
        "faults",
        "workflow/rules/profile.smk",
        '        json=protected("results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.json"),',
        '        json="results/raw/{gpu}/{setting}/{mode}/ops/{op_id}.json",',
        FAULTS + "test_raw_logs_are_write_protected_and_a_rerun_refuses_to_overwrite",
        "profile_op: the raw JSON is not protected()",
    ),
    Guard(
        "setting-reset-after-error",
        "faults",
        "src/opcost/gpu_setting.py",
        "            resetting = True\n            try:\n"
        '                _call(command, ["--gpu", gpu, "--reset"])',
        "            resetting = True\n            try:\n                pass",
        FAULTS + "test_wrapper_resets_after_error_in_block",
        "applied_setting: no reset when the block raises",
    ),
    Guard(
        "setting-sigterm",
        "faults",
        "src/opcost/gpu_setting.py",
        "    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None",
        "    previous = None",
        FAULTS + "test_sigterm_mid_setting_resets",
        "applied_setting: no SIGTERM handler",
    ),
    Guard(
        "setting-stale-marker",
        "faults",
        "src/opcost/gpu_setting.py",
        '    recover_stale_setting(gpu, command)\n    if setting.kind == "default":',
        '    if setting.kind == "default":',
        FAULTS + "test_sigkill_leaves_marker_and_next_job_recovers",
        "applied_setting: no reset after a SIGKILLed job",
    ),
    Guard(
        "setting-owner-alive",
        "faults",
        "src/opcost/gpu_setting.py",
        "    if _owner_alive(marker):",
        "    if False:",
        FAULTS + "test_marker_of_running_process_is_not_stale",
        "recover_stale_setting: reset under a running job",
    ),
    # --- security ---------------------------------------------------------------------------
    Guard(
        "script-strict-int",
        "security",
        "src/opcost/gpu_setting_script.py",
        "    if not _INT_RE.fullmatch(text):",
        "    if False:",
        SECURITY + "test_hostile_arguments_refused_without_calling_nvidia_smi",
        "opcost-gpu-setting: clock and limit parsed by int()",
    ),
    Guard(
        "script-gpu-arg",
        "security",
        "src/opcost/gpu_setting_script.py",
        "    if not _GPU_RE.fullmatch(text):",
        "    if False:",
        SECURITY + "test_hostile_arguments_refused_without_calling_nvidia_smi",
        "opcost-gpu-setting: --gpu unchecked",
    ),
    Guard(
        "script-gpu-exists",
        "security",
        "src/opcost/gpu_setting_script.py",
        "        if not exists:\n            parser.error",
        "        if False:\n            parser.error",
        SECURITY + "test_invalid_values_refused_before_any_change",
        "opcost-gpu-setting: no check that the GPU exists",
    ),
    Guard(
        "script-supported-clock",
        "security",
        "src/opcost/gpu_setting_script.py",
        "            if mhz not in clocks:",
        "            if False:",
        SECURITY + "test_invalid_values_refused_before_any_change",
        "opcost-gpu-setting: any clock is locked",
    ),
    Guard(
        "setting-no-shell",
        "security",
        "src/opcost/gpu_setting.py",
        "        proc = run_captured(argv, timeout_s=COMMAND_TIMEOUT_S)\n",
        '        proc = subprocess.run(" ".join(argv), shell=True, capture_output=True, '
        "text=True)\n",
        SECURITY + "test_setting_command_runs_without_a_shell",
        "_call: run the setting command through a shell",
    ),
    Guard(
        "setting-command-list",
        "security",
        "src/opcost/gpu_setting.py",
        "    if isinstance(command, str) or not command or",
        "    if not command or",
        SECURITY + "test_command_as_string_refused",
        "_check_command: accept a string",
    ),
    Guard(
        "schema-setting-command-list",
        "security",
        SCHEMA,
        "        type: array\n        items: {type: string}\n        minItems: 1\n"
        "        default: [opcost-gpu-setting]",
        "        items: {type: string}\n        minItems: 1\n        default: [opcost-gpu-setting]",
        SECURITY + "test_setting_command_must_be_a_list_in_the_config",
        "schema: setting_command may be a string",
    ),
    Guard(
        "nvsmi-no-shell",
        "security",
        "src/opcost/nvsmi.py",
        "    return subprocess.run(\n        argv,\n",
        '    return subprocess.run(\n        " ".join(argv),\n        shell=True,\n',
        SECURITY + "test_nvidia_smi_runs_without_a_shell",
        "run_captured: run nvidia-smi through a shell",
    ),
    Guard(
        "nvsmi-check-gpu",
        "security",
        "src/opcost/nvsmi.py",
        "    if not isinstance(gpu, str) or not _GPU_RE.fullmatch(gpu):",
        "    if not isinstance(gpu, str):",
        SECURITY + "test_check_gpu_refuses",
        "check_gpu: any string is a GPU",
    ),
    Guard(
        "nvsmi-check-fields",
        "security",
        "src/opcost/nvsmi.py",
        "    bad = [f for f in fields if not isinstance(f, str) or not _FIELD_RE.fullmatch(f)]",
        "    bad = [f for f in fields if not isinstance(f, str)]",
        SECURITY + "test_malformed_fields_refused_before_any_call",
        "check_fields: any string is a field",
    ),
    Guard(
        "check-name",
        "security",
        "src/opcost/names.py",
        '    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:',
        '    if not isinstance(name, str) or ".." in name:',
        SECURITY + "test_an_accepted_name_is_one_safe_path_component",
        "check_name: only `..` refused",
    ),
    # --- issue 19: opcost-gpu-setting's nvidia-smi and job GPUs ---
    Guard(
        "script-trusted-smi",
        "security",
        "src/opcost/gpu_setting_script.py",
        "        smi = trusted_nvidia_smi()\n",
        "        smi = nvidia_smi_path()\n",
        SECURITY + "test_under_sudo_nvidia_smi_on_path_is_not_run",
        "opcost-gpu-setting: run the nvidia-smi on PATH under sudo",
    ),
    Guard(
        "script-elevated-presence",
        "security",
        "src/opcost/gpu_setting_script.py",
        "    return any(name in env for name in ELEVATION_VARIABLES)",
        "    return any(env.get(name) for name in ELEVATION_VARIABLES)",
        SECURITY + "test_runs_elevated_sees_sudo",
        "runs_elevated: an empty SUDO_USER (settable with SETENV) hides sudo",
    ),
    Guard(
        "script-smi-mode",
        "security",
        "src/opcost/gpu_setting_script.py",
        "        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:",
        "        if False:",
        SECURITY + "test_under_sudo_a_changeable_nvidia_smi_is_refused",
        "trusted_nvidia_smi: run an nvidia-smi others can write",
    ),
    Guard(
        "script-smi-owner",
        "security",
        "src/opcost/gpu_setting_script.py",
        "        if info.st_uid not in trusted_owners:",
        "        if False:",
        SECURITY + "test_under_sudo_a_changeable_nvidia_smi_is_refused",
        "trusted_nvidia_smi: run an nvidia-smi a user owns (test needs root)",
    ),
    Guard(
        "script-smi-link-dir",
        "security",
        "src/opcost/gpu_setting_script.py",
        "    _check_owned_by_root(os.path.realpath(directory))\n",
        "",
        SECURITY + "test_under_sudo_a_changeable_nvidia_smi_is_refused",
        "trusted_nvidia_smi: follow a link in a folder others can write",
    ),
    Guard(
        "script-job-gpu",
        "security",
        "src/opcost/gpu_setting_script.py",
        "            if refusal is not None:\n                parser.error(refusal)",
        "            if False:\n                parser.error(refusal)",
        "tests/test_gpu_setting.py::test_job_check_refuses_a_gpu_outside_the_job",
        "opcost-gpu-setting --require-job-gpu: check ignored",
    ),
    Guard(
        "script-job-gpu-held",
        "security",
        "src/opcost/gpu_setting_script.py",
        "    if index not in held:",
        "    if False:",
        "tests/test_gpu_setting.py::test_job_check_refuses_a_gpu_outside_the_job",
        "check_job_holds: any GPU of the host counts as the job's",
    ),
    # --- issue 20: SLURM pre-flight check and plan ---
    Guard(
        "slurm-sacct-answers",
        "faults",
        "src/opcost/slurm.py",
        "    if proc.returncode == 0:\n        return None",
        "    if True:\n        return None",
        "tests/test_slurm_preflight.py::test_sacct_without_accounting_stops_with_the_fix",
        "sacct_problem: a failing sacct counts as answering",
    ),
    Guard(
        "slurm-squeue-fallback",
        "faults",
        "src/opcost/slurm.py",
        '    if configured == "squeue" and sacct_on_path and short_age:',
        "    if False:",
        "tests/test_slurm_preflight.py::"
        "test_squeue_with_a_short_min_job_age_falls_back_to_sacct_and_stops",
        "status_command_used: ignore the plugin's fallback from squeue to sacct",
    ),
    Guard(
        "slurm-preflight-hook",
        "faults",
        "workflow/rules/common.smk",
        "    slurm_preflight.check_run(workflow)",
        "    pass",
        "tests/test_slurm_preflight.py::"
        "test_run_with_sacct_and_no_accounting_stops_before_submitting",
        "onstart: no pre-flight check before the first submission",
    ),
    Guard(
        "plan-half-measured",
        "faults",
        "src/opcost/plan.py",
        '    return (root / f"{prefix}.json").is_file() and (root / f"{prefix}.csv").is_file()',
        '    return (root / f"{prefix}.json").is_file() or (root / f"{prefix}.csv").is_file()',
        "tests/test_plan.py::test_existing_raw_files_reduce_what_is_left_to_run",
        "plan: a measurement with one of its two raw files counts as measured",
    ),
    Guard(
        "plan-no-batch-size",
        "bad input",
        "src/opcost/plan.py",
        "    if size is None or size < 1:",
        "    if False:",
        "tests/test_plan.py::test_a_profile_without_batch_size_needs_the_option",
        "read_profile: a profile without group-components for the profiling group",
    ),
    # --- issue 19: evaluation and power logs ---
    Guard(
        "evaluate-log-starts-late",
        "faults",
        "src/opcost/method.py",
        "    if first > start + slack_s:",
        "    if False:",
        FAULTS + "test_log_not_covering_the_window_fails_naming_the_file[starts-mid-window]",
        "check_coverage: a log that starts mid-window is evaluated on its part",
    ),
    Guard(
        "evaluate-log-ends-early",
        "faults",
        "src/opcost/method.py",
        "    if last < end - slack_s:",
        "    if False:",
        FAULTS + "test_log_not_covering_the_window_fails_naming_the_file[ends-mid-window]",
        "check_coverage: a log that ends mid-window is evaluated on its part",
    ),
    Guard(
        "evaluate-window-all-dropped",
        "faults",
        "src/opcost/method.py",
        "    if n == 0 and not gaps and end - start > slack_s:",
        "    if False:",
        FAULTS + "test_window_without_a_usable_row_fails_naming_the_file",
        "check_coverage: a window whose rows were all dropped gives NaN power",
    ),
    Guard(
        "evaluate-hole-flagged",
        "faults",
        "src/opcost/method.py",
        '        "low_power_samples": n_updates < min_power_updates or has_hole,',
        '        "low_power_samples": n_updates < min_power_updates,',
        FAULTS + "test_hole_in_the_window_flags_the_row",
        "power_columns: a hole in the window does not flag the row",
    ),
    Guard(
        "evaluate-record-fields",
        "bad input",
        "src/opcost/evaluate.py",
        "    if problem is not None:",
        "    if False:",
        FAULTS + "test_bad_benchmark_field_fails_naming_file_and_field[total_time_s--5]",
        "_read_record: no check of the record's field types and ranges",
    ),
    Guard(
        "evaluate-energy-counter-order",
        "bad input",
        "src/opcost/evaluate.py",
        "    if e0 is not None and e1 is not None and e1 < e0:",
        "    if False:",
        FAULTS + "test_bad_benchmark_field_fails_naming_file_and_field[energy_counter_end_mj-1]",
        "_time_columns: an energy counter that went back gives negative energy",
    ),
    Guard(
        "powerlog-merged-line-polls",
        "faults",
        "src/opcost/powerlog.py",
        "    return max(1, len(_TIMESTAMP_RE.findall(line)), by_fields)",
        "    return 1",
        FAULTS + "test_lines_merged_by_junk_count_every_poll_lost[20]",
        "_polls_in: two lines merged by junk count as one dropped row",
    ),
    Guard(
        "powerlog-header-only",
        "faults",
        "src/opcost/powerlog.py",
        "    if n_rows_total == 0:",
        "    if False:",
        FAULTS + "test_log_without_a_sample_says_so[header-only]",
        "read_power_log: a header-only log gets the message about units",
    ),
    Guard(
        "powerlog-junk-only",
        "faults",
        "src/opcost/powerlog.py",
        "        if not good:",
        "        if False:",
        FAULTS + "test_log_without_a_sample_says_so[junk-only]",
        "read_power_log: a log of junk lines gets the message about units",
    ),
    # --- issue 19: predictor files (data only, checked against a manifest) ---
    Guard(
        "predict-no-pickle",
        "security",
        "src/opcost/model/format.py",
        "        arrays = _npz_arrays(data)\n",
        "        arrays = dict(np.load(io.BytesIO(data), allow_pickle=True))\n",
        SECURITY + "test_hostile_model_file_is_refused_without_running_it[pickle]",
        "_read_model: read the model with np.load(allow_pickle=True)",
    ),
    Guard(
        "predict-tree-walk-ends",
        "security",
        "src/opcost/model/trees.py",
        "            or not np.array_equal(right == own, leaf)\n",
        "",
        SECURITY + "test_model_whose_walk_never_ends_is_refused",
        "TreeEnsemble.from_arrays: right children unchecked (a node may point to itself)",
    ),
    Guard(
        "predict-manifest-hash",
        "faults",
        "src/opcost/model/format.py",
        "        if hashlib.sha256(data).hexdigest() != expected"
        ' or len(data) != entry.get("bytes"):',
        "        if False:",
        FAULTS + "test_predictor_file_changed_in_place_is_refused_naming_it",
        "_read_manifest: files not compared with their SHA-256",
    ),
    Guard(
        "predict-manifest-last",
        "faults",
        "src/opcost/model/format.py",
        "    (directory / MANIFEST_FILE).unlink(missing_ok=True)\n    _write_model(",
        "    _write_model(",
        FAULTS + "test_predictor_without_a_matching_manifest_is_refused[save-interrupted]",
        "save_predictor: the old manifest stays while the new files are written",
    ),
    # --- issue 19: remeasuring, interruption, two runs in one directory ---
    Guard(
        "all-asks-for-raw-logs",
        "faults",
        "Snakefile",
        "        get_all_raw_logs,\n",
        "",
        "tests/test_reruns.py::"
        "test_deleting_a_raw_pair_measures_it_again_and_rebuilds_what_depends_on_it",
        "rule all: raw logs only an input of evaluate, a deleted pair stays deleted",
    ),
    Guard(
        "dataset-raw-logs-exist",
        "faults",
        "src/opcost/workflow.py",
        "            if not path.exists():\n",
        "            if False:\n",
        FAULTS + "test_a_dataset_with_a_row_whose_raw_log_is_gone_is_refused",
        "require_raw_logs: a row whose raw log is gone passes",
    ),
    Guard(
        "train-requires-raw-logs",
        "faults",
        "workflow/scripts/train.py",
        "require_raw_logs(sm.input.dataset)\n",
        "",
        "tests/test_reruns.py::"
        "test_deleting_a_raw_pair_measures_it_again_and_rebuilds_what_depends_on_it",
        "rule train: trains on a dataset whose raw log is gone",
    ),
    Guard(
        "validate-requires-raw-logs",
        "faults",
        "workflow/scripts/validate_dataset.py",
        "    require_raw_logs(path)\n",
        "    pass\n",
        "tests/test_reruns.py::"
        "test_deleting_a_raw_pair_measures_it_again_and_rebuilds_what_depends_on_it",
        "rule validate_dataset: validates a dataset whose raw log is gone",
    ),
    Guard(
        "profile-raw-read-only",
        "faults",
        "src/opcost/profile.py",
        "            os.chmod(staged, 0o444)\n",
        "",
        FAULTS + "test_a_profiling_job_leaves_its_raw_logs_read_only",
        "publish_read_only: raw logs left writable (Snakemake alone protects them)",
    ),
    Guard(
        "profile-publish-holds-signals",
        "faults",
        "src/opcost/profile.py",
        "    with _signals_held():\n",
        "    with contextlib.nullcontext():\n",
        FAULTS + "test_sigterm_while_publishing_waits_until_both_raw_logs_are_in_place",
        "publish_read_only: a SIGTERM between the renames leaves a CSV without its JSON",
    ),
    Guard(
        "sigint-stops-worker",
        "faults",
        "workflow/rules/common.smk",
        "worker.stop_on_interrupt()\n",
        "",
        FAULTS + "test_sigint_to_snakemake_alone_stops_the_measurement_and_a_rerun_completes",
        "common.smk: SIGINT to Snakemake leaves the worker measuring and writing",
    ),
    Guard(
        "default-profile-rerun-incomplete",
        "faults",
        "profiles/default/config.yaml",
        "rerun-incomplete: true\n",
        "",
        FAULTS + "test_sigkill_during_train_then_the_lock_first_and_the_same_command_completes",
        "profiles/default: an interrupted job's outputs need --rerun-incomplete, asked before "
        "the lock",
    ),
    # --- issue 19: config, GPU settings, network factories, extract, CLI ---
    Guard(
        "setting-bounds",
        "bad input",
        "src/opcost/names.py",
        "    if not low <= value <= high:",
        "    if False:",
        BAD_INPUT + "test_implausible_gpu_setting_is_refused[sm99999]",
        "parse_setting: any clock or power limit of 2 to 5 digits",
    ),
    Guard(
        "config-setting-on-cpu",
        "bad input",
        "src/opcost/config.py",
        """            if settings[-1].kind != "default" and g["device"] == "cpu":""",
        "            if False:",
        BAD_INPUT + "test_gpu_setting_on_the_cpu_is_refused",
        "load_study: a GPU setting accepted on device cpu",
    ),
    Guard(
        "profile-setting-off-gpu",
        "bad input",
        "src/opcost/profile.py",
        """    if device != "cuda" and setting.kind != "default":""",
        "    if False:",
        BAD_INPUT + "test_profiling_job_fails_when_its_setting_cannot_be_applied[auto]",
        "power_log: a setting off a GPU is measured and recorded as applied",
    ),
    Guard(
        "config-factory-check",
        "security",
        "src/opcost/config.py",
        "            if check_models:\n                _check_factory(model, where)\n",
        "",
        FACTORY + "[os-system]",
        "load_study: an import path is not checked to be a network factory",
    ),
    Guard(
        "factory-stdlib",
        "security",
        "src/opcost/extract.py",
        """    if module_name.split(".")[0] in sys.stdlib_module_names:""",
        "    if False:",
        FACTORY + "[os-getcwd]",
        "resolve_factory: a standard-library callable is called as a factory",
    ),
    Guard(
        "factory-callable",
        "bad input",
        "src/opcost/extract.py",
        "    if not callable(obj):",
        "    if False:",
        FACTORY + "[issue19-factories-CONSTANT]",
        "resolve_factory: a module attribute that is not callable passes",
    ),
    Guard(
        "factory-no-arguments",
        "bad input",
        "src/opcost/extract.py",
        "        signature.bind()\n",
        "",
        FACTORY + "[issue19-factories-needs-args]",
        "resolve_factory: a callable that needs arguments passes",
    ),
    Guard(
        "factory-declared-return",
        "security",
        "src/opcost/extract.py",
        "    if _declared_module(obj) is False:",
        "    if False:",
        FACTORY + "[issue19-factories-declared-int]",
        "resolve_factory: a factory declared to return no network is called",
    ),
    Guard(
        "extract-meta-first",
        "bad input",
        "src/opcost/extract.py",
        "        if not _meta_unsupported(meta_error):",
        "        if False:",
        "tests/test_extract.py::test_wrong_channel_count_fails_on_meta_without_building_the_input",
        "extract_model_input: a wrong shape is retried on the CPU with the real input",
    ),
    Guard(
        "config-size-limit",
        "bad input",
        "src/opcost/config.py",
        "        if count > MAX_CONFIG_VALUES:",
        "        if False:",
        "tests/test_config.py::test_yaml_alias_bomb_fails_fast_with_a_short_message",
        "validate_config: a YAML alias bomb is validated in full",
    ),
    Guard(
        "config-unknown-key-allowed",
        "bad input",
        "src/opcost/config.py",
        '    if kind == "additionalProperties" and expected is False and isinstance(value, dict):',
        "    if False:",
        "tests/test_config.py::test_misspelt_top_level_key_lists_the_allowed_keys",
        "validate_config: an unknown key's error does not list the allowed keys",
    ),
    Guard(
        "config-error-cap",
        "bad input",
        "src/opcost/config.py",
        "        shown = lines[:MAX_ERRORS]",
        "        shown = lines[:]",
        "tests/test_config.py::test_many_errors_are_cut_short",
        "validate_config: every error listed",
    ),
    Guard(
        "config-quote-short",
        "bad input",
        "src/opcost/config.py",
        '''    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."''',
        "    return text",
        "tests/test_config.py::test_a_long_value_is_quoted_short",
        "validate_config: a wrong value is quoted in full",
    ),
    Guard(
        "snakefile-own-validation",
        "bad input",
        "Snakefile",
        "from opcost.config import validate_config\n",
        "from functools import partial\n\nfrom snakemake.utils import validate\n\n"
        f'validate_config = partial(validate, schema="{SCHEMA}")\n',
        BAD_INPUT + "test_snakemake_prints_a_short_config_error[misspelt-top-level-key]",
        "Snakefile: snakemake.utils.validate, which prints the whole schema",
    ),
    Guard(
        "cli-broken-pipe",
        "faults",
        "src/opcost/cli.py",
        "    except BrokenPipeError:\n        return _stdout_closed()\n",
        "",
        "tests/test_cli.py::test_extract_into_a_closed_pipe_exits_quietly",
        "main: a closed stdout ends with an error message and exit code 2",
    ),
    # --- issue 20: groups and code changes ---
    Guard(
        "groups-formed-once",
        "faults",
        "workflow/rules/common.smk",
        "snakemake_compat.apply()\n",
        "",
        "tests/test_slurm_pipeline.py::test_each_profiling_job_is_in_exactly_one_batch[op_list_first]",
        "common.smk: Snakemake's own group formation (an extra batch of every profiling job)",
    ),
    Guard(
        "groups-compat-version-refused",
        "faults",
        "src/opcost/snakemake_compat.py",
        'if version.split(".")[0] not in CHECKED_MAJOR_VERSIONS:',
        "if False:",
        "tests/test_snakemake_compat.py::test_another_major_version_is_refused",
        "snakemake_compat: patches a Snakemake major version it was never checked against",
    ),
    Guard(
        "profile-duplicate-measures-nothing",
        "faults",
        "src/opcost/profile.py",
        "        existing = measured_pair(csv_path, json_path)\n"
        "        if existing is not None:\n"
        "            return existing\n",
        "",
        "tests/test_device_lock.py::"
        "test_a_duplicate_of_a_job_measures_nothing_and_overwrites_nothing",
        "profile_job: a duplicate measures the pair again after the lock and replaces it",
    ),
    Guard(
        "profile-duplicate-publish-kept",
        "faults",
        "src/opcost/profile.py",
        "            existing = measured_pair(csv_path, json_path)\n"
        "            if existing is not None:\n",
        "            existing = None\n            if existing is not None:\n",
        "tests/test_device_lock.py::test_a_pair_published_during_the_measurement_is_kept",
        "profile_job: a pair published meanwhile by a duplicate is overwritten",
    ),
    Guard(
        "code-version-transitive",
        "faults",
        "src/opcost/workflow.py",
        "        todo += sorted(_opcost_imports(_module_file(module).read_text()) - seen)\n",
        "",
        "tests/test_workflow.py::test_code_version_follows_the_modules_a_stage_script_uses",
        "code_version: hashes only the modules a script imports itself",
    ),
    Guard(
        "train-rule-code-version",
        "faults",
        "workflow/rules/train.smk",
        '        opcost_code=code_version("train.py"),\n',
        "",
        "tests/test_workflow.py::"
        "test_every_stage_rule_carries_its_code_version_and_no_measurement_does",
        "train.smk: rule train without its code version",
    ),
    Guard(
        "stage-code-change-reruns-stage",
        "faults",
        "workflow/rules/common.smk",
        "    return wf.code_version(SCRIPTS_DIR / script)\n",
        '    return "unchanged"\n',
        "tests/test_reruns.py::"
        "test_a_change_to_a_stage_module_reruns_that_stage_and_no_profiling[train.py-train]",
        "common.smk: every stage's code version a constant (a code change reruns nothing)",
    ),
    # --- issue 21: weak tests ---
    Guard(
        "schema-sweep-section",
        "bad input",
        SCHEMA,
        "  sweep:\n    description: >\n",
        "  sweep_gone:\n    description: >\n",
        "tests/test_sweep.py::test_defaults_are_the_config_schemas",
        "schema: the sweep section gone (renamed)",
    ),
    Guard(
        "schema-sweep-section-rules",
        "bad input",
        SCHEMA,
        "  sweep:\n    description: >\n",
        "  sweep_gone:\n    description: >\n",
        "tests/test_figures.py::test_sweep_rules_run_on_the_cpu",
        "schema: the sweep section gone (renamed)",
    ),
    Guard(
        "train-rule-present",
        "faults",
        "workflow/rules/train.smk",
        "rule train:\n",
        "rule fit:\n",
        "tests/test_reruns.py::test_changing_a_training_hyperparameter_reruns_no_measurement",
        "train.smk: rule train renamed (the graph has no train rule)",
    ),
    # --- issue 21: evalmeasure ---
    Guard(
        "schemas-doc-generated",
        "faults",
        "src/opcost/schemas.py",
        '"W̄_filtered, mean after the 3σ filter (3.3)"',
        '"mean power"',
        "tests/test_schemas.py::test_formats_md_matches_the_schemas",
        "schemas.py: a column's meaning changed without regenerating docs/formats.md",
    ),
    Guard(
        "profile-options-schema-defaults",
        "faults",
        "src/opcost/profile.py",
        '        min_run_time_s=float(option("min_run_time_s")),',
        '        min_run_time_s=float(profile_config.get("min_run_time_s", 1.0)),',
        "tests/test_harness.py::test_profile_options_default_to_the_config_schema",
        "profile.options_for: a default repeated as a literal beside the config schema",
    ),
    # --- issue 21: model ---
    Guard(
        "train-metrics-atomic",
        "faults",
        "src/opcost/train.py",
        "    write_json_atomic(outputs.metrics, metrics)\n",
        "    import json\n\n"
        '    outputs.metrics.write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\\n")\n',
        "tests/test_train.py::test_a_full_disk_while_writing_metrics_keeps_the_previous_metrics",
        "train_gpu: metrics.json written in place (a full disk leaves half a file)",
    ),
    Guard(
        "train-defaults-from-schema",
        "bad input",
        "src/opcost/train.py",
        '    n_estimators: int = _DEFAULT["n_estimators"]\n',
        "    n_estimators: int = 300\n",
        "tests/test_train.py::test_train_config_defaults_are_the_config_schemas",
        "TrainConfig: a default of its own beside the config schema's",
    ),
    # --- issue 20: SIGTERM ---
    Guard(
        "sigterm-handler-takes-no-lock",
        "faults",
        "src/opcost/worker.py",
        "        scheduler_class.exit_gracefully = _exit_gracefully\n",
        "",
        FAULTS + "test_sigterm_while_snakemake_holds_its_scheduler_lock_is_handled",
        "worker.stop_on_terminate: Snakemake's own SIGTERM handler kept (it takes its lock)",
    ),
    Guard(
        "sigterm-stops-measurement",
        "faults",
        "src/opcost/worker.py",
        '    _SHARED.interrupt()\n    scheduler._user_kill = "graceful"\n',
        '    scheduler._user_kill = "graceful"\n',
        FAULTS + "test_sigterm_ends_a_batch_and_its_measurement_at_once",
        "worker._exit_gracefully: SIGTERM no longer stops the running measurement",
    ),
    Guard(
        "sigterm-handler-installed",
        "faults",
        "workflow/rules/common.smk",
        "worker.stop_on_terminate(\n",
        "(\n",
        FAULTS + "test_sigterm_ends_a_batch_and_its_measurement_at_once",
        "common.smk: the SIGTERM handler not installed",
    ),
    Guard(
        "batch-ends-itself-after-sigterm",
        "faults",
        "src/opcost/worker.py",
        "    os._exit(128 + signal.SIGTERM)\n",
        "",
        FAULTS + "test_a_batch_still_running_after_sigterm_ends_itself",
        "worker._exit_soon: a batch still running after SIGTERM is not ended",
    ),
    Guard(
        "stopped-worker-takes-no-request",
        "faults",
        "src/opcost/worker.py",
        "            if self._interrupted:\n                raise WorkerError(\n",
        "            if False:\n                raise WorkerError(\n",
        "tests/test_worker.py::test_a_stopped_client_starts_no_further_measurement",
        "Worker.call: a process told to stop still starts a measurement",
    ),
    # --- issue 21: error base, atomic writer, torch-free parse, install ---
    Guard(
        "cli-catches-opcost-error",
        "bad input",
        "src/opcost/cli.py",
        "    except (OpcostError, OSError) as e:",
        "    except OSError as e:",
        "tests/test_errors.py::test_the_cli_reports_any_opcost_error_in_one_line",
        "main: catch only OSError, not the OpcostError base (an error not named is a traceback)",
    ),
    Guard(
        "config-models-without-torch",
        "faults",
        "src/opcost/config.py",
        "    if model in torchvision_model_names():\n        return True\n",
        "",
        "tests/test_imports.py::test_loading_the_default_study_checks_its_models_without_torch",
        "_is_torchvision_model: always ask torchvision itself (imports torch at every parse)",
    ),
    Guard(
        "torchvision-scan-unnamed",
        "faults",
        "src/opcost/config.py",
        "    if not given:\n        return function\n",
        "    if not given:\n        return None\n",
        "tests/test_config.py::test_torchvision_names_read_from_its_source_are_its_registry",
        "_registered_name: miss every model registered under its function's name",
    ),
    Guard(
        "schema-package-data",
        "faults",
        "pyproject.toml",
        'opcost = ["py.typed", "config.schema.yaml"]',
        'opcost = ["py.typed"]',
        "tests/test_install.py::test_the_installed_package_holds_its_config_schema",
        "pyproject: the config schema left out of the wheel",
    ),
    # --- issue 21: figures ---
    Guard(
        "figures-torch-free",
        "faults",
        "src/opcost/figures/method.py",
        "from opcost import sweep_record\n",
        "from opcost import sweep, sweep_record  # noqa: F401\n",
        "tests/test_figures.py::test_drawing_figures_does_not_import_torch",
        "figures: the method figures import the measuring sweep module (and torch)",
    ),
    Guard(
        "code-version-packages",
        "faults",
        "src/opcost/workflow.py",
        'return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")',
        'return path.with_suffix(".py")',
        "tests/test_figures.py::test_code_version_of_the_figure_rules_follows_the_figures_package",
        "code_version: a subpackage (opcost.figures) is looked for as a module file",
    ),
    Guard(
        "sweep-defaults-from-schema",
        "bad input",
        "src/opcost/sweep_record.py",
        "        section = {**schema_defaults(), **section}\n",
        '        section = {**schema_defaults(), "points": 24, **section}\n',
        "tests/test_sweep.py::test_defaults_live_only_in_the_schema",
        "SweepConfig: a default written in the code besides the schema's",
    ),
    Guard(
        "style-defaults-from-schema",
        "bad input",
        "src/opcost/figures/style.py",
        'default_factory=lambda: int(schema_defaults()["dpi"])',
        "default_factory=lambda: 150",
        "tests/test_figures.py::test_style_defaults_live_only_in_the_schema",
        "FigureStyle: a default written in the code besides the schema's",
    ),
)


def repository_files(repo: Path) -> list[Path]:
    """The working tree's files that git tracks or would track (ignored ones left out)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    names = sorted({n for n in out.decode().split("\0") if n})
    # A tracked file deleted in the working tree is listed but absent: left out.
    return [Path(n) for n in names if (repo / n).is_file()]


def copy_repository(files: list[Path], target: Path) -> Path:
    """Copy ``files`` (relative to :data:`REPO`) into ``target``, keeping modes."""
    for rel in files:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest)
    return target


def copy_snapshot(snapshot: Path, target: Path) -> Path:
    """Copy the snapshot taken at the start (no test ever runs in it), so that every run
    sees the same tree even while someone edits the working tree."""
    shutil.copytree(snapshot, target, symlinks=True)
    return target


def mutate(copy: Path, guard: Guard) -> None:
    """Apply ``guard``'s replacement in ``copy``; raise unless its text occurs once."""
    path = copy / guard.path
    text = path.read_text()
    count = text.count(guard.old)
    if count != 1:
        raise SystemExit(
            f"guard {guard.name}: the text to replace occurs {count} times in {guard.path}, "
            f"not once; update the mutation\n--- text ---\n{guard.old}"
        )
    path.write_text(text.replace(guard.old, guard.new))


def check_mutations(files: list[Path], guards: list[Guard], root: Path = REPO) -> list[str]:
    """Problems with the selected mutations in the tree at ``root`` (none: empty list)."""
    problems = []
    present = {str(f) for f in files}
    for guard in guards:
        if guard.path not in present:
            problems.append(f"{guard.name}: {guard.path} is not in the repository")
            continue
        count = (root / guard.path).read_text().count(guard.old)
        if count != 1:
            problems.append(f"{guard.name}: text occurs {count} times in {guard.path}")
        if guard.old == guard.new:
            problems.append(f"{guard.name}: the replacement changes nothing")
    return problems


def test_env(copy: Path) -> dict[str, str]:
    """The environment of a test run: the copy's package first, no bytecode files."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_test(copy: Path, node_id: str) -> tuple[int, float, str]:
    """Run one pytest node id against ``copy``: exit code, seconds, last output lines."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", node_id, "-q", "-p", "no:cacheprovider"],
            cwd=copy,
            env=test_env(copy),
            capture_output=True,
            text=True,
            timeout=TEST_TIMEOUT_S,
            check=False,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code, output = -1, f"timed out after {TEST_TIMEOUT_S} s: {e}"
    tail = "\n".join(output.strip().splitlines()[-15:])
    return code, time.monotonic() - started, tail


def check_import_location(copy: Path) -> None:
    """Refuse to go on if the copy's tests would import the repository's package instead."""
    done = subprocess.run(
        [sys.executable, "-c", "import opcost; print(opcost.__file__)"],
        cwd=copy,
        env=test_env(copy),
        capture_output=True,
        text=True,
        check=True,
    )
    where = Path(done.stdout.strip()).resolve()
    if not where.is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy imports opcost from {where}, not from {copy}/src")


def outcome(code: int) -> str:
    """A pytest exit code in words (1 is a failed test, the outcome a mutation must give)."""
    return {0: "passed", 1: "FAILED", -1: "timeout"}.get(code, f"error (exit {code})")


def markdown_table(rows: list[dict[str, str]]) -> str:
    header = ["guard", "category", "mutation", "test", "passes unmutated", "fails mutated", "s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cells = [r[h] for h in header]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this guard (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the guards and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies")
    args = parser.parse_args(argv)

    guards = list(GUARDS)
    if args.only:
        known = {g.name for g in GUARDS}
        unknown = sorted(set(args.only) - known)
        if unknown:
            parser.error(f"unknown guard(s) {unknown}; see --list")
        guards = [g for g in GUARDS if g.name in args.only]
    if args.list:
        for g in guards:
            print(f"{g.name:28} {g.category:9} {g.path}: {g.mutation}\n{'':38} {g.test}")
        return 0

    files = repository_files(REPO)
    problems = check_mutations(files, guards)
    if problems:
        print("mutations that do not apply:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    started = datetime.now().astimezone()
    work = Path(tempfile.mkdtemp(prefix="guard-mutations-"))
    print(f"{started:%Y-%m-%d %H:%M %Z}: {len(guards)} guards, copies under {work}", flush=True)
    rows: list[dict[str, str]] = []
    all_ok = True
    try:
        snapshot = copy_repository(files, work / "snapshot")
        # Checked again on the snapshot: the working tree may have changed meanwhile.
        problems = check_mutations(files, guards, snapshot)
        if problems:
            print("mutations that do not apply:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 2
        pristine = copy_snapshot(snapshot, work / "unmutated")
        check_import_location(pristine)
        baseline: dict[str, int] = {}
        for node in dict.fromkeys(g.test for g in guards):
            code, seconds, tail = run_test(pristine, node)
            baseline[node] = code
            print(f"unmutated {outcome(code):8} {seconds:6.1f} s  {node}", flush=True)
            if code != 0:
                print(tail, flush=True)
        for guard in guards:
            copy = copy_snapshot(snapshot, work / guard.name)
            mutate(copy, guard)
            code, seconds, tail = run_test(copy, guard.test)
            ok = baseline[guard.test] == 0 and code == 1
            all_ok &= ok
            print(f"{guard.name:28} mutated: {outcome(code):8} {seconds:6.1f} s", flush=True)
            if not ok:
                print(tail, flush=True)
            rows.append(
                {
                    "guard": guard.name,
                    "category": guard.category,
                    "mutation": f"`{guard.path}`: {guard.mutation}",
                    "test": f"`{guard.test}`",
                    "passes unmutated": "yes" if baseline[guard.test] == 0 else "NO",
                    "fails mutated": "yes" if code == 1 else f"NO ({outcome(code)})",
                    "s": f"{seconds:.0f}",
                }
            )
            if not args.keep:
                shutil.rmtree(copy, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    minutes = (datetime.now().astimezone() - started).total_seconds() / 60
    print()
    print(f"Run {started:%Y-%m-%d %H:%M %Z}, {minutes:.0f} min, Python {sys.version.split()[0]}:")
    print()
    print(markdown_table(rows))
    print()
    failed = [
        r["guard"] for r in rows if r["passes unmutated"] != "yes" or r["fails mutated"] != "yes"
    ]
    print(
        f"{len(rows) - len(failed)} of {len(rows)} guards checked by their test"
        + (f"; not: {', '.join(failed)}" if failed else "")
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
