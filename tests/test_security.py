"""Reliability, security: nothing a caller passes is run by a shell, or becomes a path unchecked.

Issue #8, category 3. Per case, the guard (file:function) it checks.

The privileged script ``opcost-gpu-setting`` (src/opcost/gpu_setting_script.py:main, run as root
through sudo):

- hostile arguments (shell syntax, signs, spaces, exponents, hex, non-ASCII digits, huge
  numbers, zero), a missing GPU or action, an option given twice, two actions, extra words,
  abbreviations: refused with exit code 2 before nvidia-smi is ever called:
  gpu_setting_script.py:_strict_int, :_gpu_arg, :_Once, :build_parser (``allow_abbrev=False``,
  ``required=True``, the mutually exclusive group)
  (``test_hostile_arguments_refused_without_calling_nvidia_smi``)
- values the GPU does not support (a clock between two supported ones, out-of-range power
  limits, a GPU index or UUID that does not exist): refused before any change:
  gpu_setting_script.py:main (``test_invalid_values_refused_before_any_change``)
- run through sudo, the script never runs an ``nvidia-smi`` from the caller's ``PATH``,
  only one from fixed system directories: gpu_setting_script.py:runs_elevated,
  :trusted_nvidia_smi (``test_under_sudo_nvidia_smi_on_path_is_not_run``,
  ``test_runs_elevated_sees_sudo``), and only if neither it nor a directory above it can
  be changed by anyone but root: gpu_setting_script.py:_check_owned_by_root
  (``test_under_sudo_a_changeable_nvidia_smi_is_refused``)

The job side (gpu_setting.py:applied_setting) and the nvidia-smi adapter (nvsmi.py):

- the setting command runs as an argument list, never through a shell: gpu_setting.py:_call,
  through nvsmi.py:run_captured
  (``test_setting_command_runs_without_a_shell``); a command given as one string is refused:
  gpu_setting.py:_check_command (``test_command_as_string_refused``), and the config
  schema allows only a list (``test_setting_command_must_be_a_list_in_the_config``)
- nvidia-smi runs without a shell: nvsmi.py:run_nvidia_smi, through :run_captured
  (``test_nvidia_smi_runs_without_a_shell``)
- a GPU id that is neither an index nor a UUID never reaches a command line:
  nvsmi.py:check_gpu (``test_check_gpu_refuses``,
  ``test_wrapper_refuses_bad_gpu_before_any_call``); query fields are checked the same way:
  nvsmi.py:check_fields (``test_malformed_fields_refused_before_any_call``)

Paths:

- every name from the config that becomes a wildcard or a path component passes
  names.py:check_name (GPU configurations, models, SLURM names; see tests/test_bad_input.py
  for the config fields): a name it accepts is one plain path component that stays in its
  folder, cannot be read as an option, and holds no whitespace or shell syntax
  (``test_an_accepted_name_is_one_safe_path_component``), and the wildcard pattern of
  workflow/rules/common.smk admits no other
  (``test_the_wildcard_pattern_admits_no_name_that_check_name_refuses``); setting names come from
  names.py:parse_setting and are safe the same way
  (``test_an_accepted_setting_is_a_safe_name``)
"""

from __future__ import annotations

import json
import os
import shutil
import string
import sys
from pathlib import Path

import pytest
from conftest import FAKES, changes, recorded
from hypothesis import example, given
from hypothesis import strategies as st

from opcost import gpu_setting_script
from opcost.config import ConfigError, load_study
from opcost.gpu_setting import GpuSettingError, applied_setting
from opcost.gpu_setting_script import main
from opcost.names import NAME_PATTERN, NameError_, check_name, parse_setting
from opcost.nvsmi import NvidiaSmiError, check_gpu, run_nvidia_smi
from opcost.nvsmi_logger import PowerLogger

COMMAND = (sys.executable, "-m", "opcost.gpu_setting_script")


# --- the privileged script -----------------------------------------------------------------


HOSTILE_SYNTAX = [
    ["--gpu", "0", "--lock-sm-clock", "1;rm -rf /"],
    ["--gpu", "0", "--lock-sm-clock", "$(id)"],
    ["--gpu", "0", "--lock-sm-clock", "-1"],
    ["--gpu", "0", "--lock-sm-clock", "1e3"],
    ["--gpu", "0", "--lock-sm-clock", "0x10"],
    ["--gpu", "0", "--lock-sm-clock", " 1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410 "],
    ["--gpu", "0", "--lock-sm-clock", "+1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410.0"],
    ["--gpu", "0", "--lock-sm-clock", "1_410"],
    ["--gpu", "0", "--lock-sm-clock", "\uff11\uff14\uff11\uff10"],  # full-width digits
    ["--gpu", "0", "--lock-sm-clock", "99999999"],
    ["--gpu", "0", "--lock-sm-clock", "0"],
    ["--gpu", "0", "--power-limit", "-300"],
    ["--gpu", "0;rm -rf /", "--reset"],
    ["--gpu", "$(id)", "--reset"],
    ["--gpu", "-1", "--reset"],
    ["--gpu", "00", "--reset"],
    ["--gpu", "GPU-../../etc/passwd", "--reset"],
    [],
    ["--reset"],
    ["--gpu", "0"],
    ["--gpu", "0", "--reset", "--lock-sm-clock", "1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410", "--power-limit", "300"],
    ["--gpu", "0", "--lock-sm-clock", "1410", "--lock-sm-clock", "1980"],
    ["--gpu", "0", "--gpu", "1", "--reset"],
    ["--gpu", "0", "--reset", "extra"],
    ["--gpu", "0", "--res"],
    ["--gpu=0", "--lock-sm-clock=1410;reboot"],
]


@pytest.mark.parametrize("argv", HOSTILE_SYNTAX, ids=repr)
def test_hostile_arguments_refused_without_calling_nvidia_smi(
    calls: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err
    assert recorded(calls) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "0", "--lock-sm-clock", "1411"],  # between two supported clocks
        ["--gpu", "0", "--lock-sm-clock", "1995"],  # above the 1980 MHz maximum
        ["--gpu", "0", "--lock-sm-clock", "330"],  # below the lowest clock
        ["--gpu", "1", "--reset"],  # the probe machine has GPU 0 only
        ["--gpu", "GPU-00000000-0000-0000-0000-000000000000", "--reset"],
        ["--gpu", "0", "--power-limit", "199"],
        ["--gpu", "0", "--power-limit", "701"],
    ],
    ids=repr,
)
def test_invalid_values_refused_before_any_change(calls: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert recorded(calls), "the checks should have queried nvidia-smi"
    assert changes(calls) == []


@pytest.mark.parametrize("gpu", ["0;reboot", "../0", "", 0])
def test_wrapper_refuses_bad_gpu_before_any_call(calls: Path, gpu: object) -> None:
    with (
        pytest.raises(GpuSettingError, match="neither an index .* nor a UUID"),
        applied_setting(parse_setting("sm1410"), gpu, COMMAND),  # type: ignore[arg-type]
    ):
        pass
    assert recorded(calls) == []


def test_command_as_string_refused(calls: Path) -> None:
    with (
        pytest.raises(GpuSettingError, match="list of arguments"),
        applied_setting(parse_setting("sm1410"), "0", "sudo -n opcost-gpu-setting"),
    ):
        pass


# --- GPU ids and fields: checked before any command line -----------------------------------


@pytest.mark.parametrize(
    "gpu", ["0;rm -rf /", "-1", "01", " 0", "GPU-57781E38-0B78-5D74-ED7B-E2DB6DDBACD3", "", 0]
)
def test_check_gpu_refuses(gpu: object) -> None:
    with pytest.raises(NvidiaSmiError):
        check_gpu(gpu)


@pytest.mark.parametrize("fields", [["power.draw,clocks.sm"], ["--help"], [], "power.draw"])
def test_malformed_fields_refused_before_any_call(
    calls: Path, tmp_path: Path, fields: list[str]
) -> None:
    with pytest.raises(NvidiaSmiError):
        PowerLogger(tmp_path / "op.csv", "0", fields)
    assert recorded(calls) == []


# --- no shell ------------------------------------------------------------------------------

# Appends its arguments as one JSON line to the file named first: a stand-in for the
# setting command that shows exactly what it was given.
RECORDER = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"
SHELL_BAIT = ["$(touch bait-1)", "; touch bait-2", "`touch bait-3`", "a b | touch bait-4"]


def test_setting_command_runs_without_a_shell(calls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "argv.jsonl"
    command = (sys.executable, "-c", RECORDER, str(log), *SHELL_BAIT)
    with applied_setting(parse_setting("sm1410"), "0", command):
        pass
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [
        [*SHELL_BAIT, "--gpu", "0", "--lock-sm-clock", "1410"],
        [*SHELL_BAIT, "--gpu", "0", "--reset"],
    ]
    assert not list(tmp_path.glob("bait-*"))


def test_nvidia_smi_runs_without_a_shell(calls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = run_nvidia_smi(["-L; touch bait-1", "$(touch bait-2)"])
    # The fake received the two words as they are, and refused them.
    assert recorded(calls) == [["-L; touch bait-1", "$(touch bait-2)"]]
    assert proc.returncode == 2
    assert not list(tmp_path.glob("bait-*"))


@pytest.mark.parametrize("command", ["sudo -n opcost-gpu-setting", "opcost-gpu-setting; id"])
def test_setting_command_must_be_a_list_in_the_config(command):
    with pytest.raises(ConfigError, match=r"profile\.setting_command"):
        load_study({"profile": {"setting_command": command}}, check_models=False)


# --- names that become paths ---------------------------------------------------------------

NAMEISH = st.text(
    alphabet=st.sampled_from([*string.ascii_letters[:6], *"09_.-/\\ ~$;:*?\n\t\x00é"]),
    max_size=70,
)


@given(NAMEISH | st.text(max_size=70))
@example("a/b")
@example("..")
@example("a/../b")
@example("-rf")
@example(".hidden")
@example("x" * 65)
@example("a b")
@example("a\nb")
def test_an_accepted_name_is_one_safe_path_component(name):
    try:
        check_name(name, "name")
    except NameError_:
        return
    base = Path("/base")
    assert (base / name).parent == base
    assert os.path.normpath(base / name) == str(base / name)
    assert name not in (".", "..")
    assert not name.startswith(("-", "."))  # not an option, not hidden
    assert name.isascii()
    assert name.isprintable()
    assert not any(c.isspace() for c in name)
    assert not set(name) & set("/\\$;:*?`'\"|&<>(){}[]!~#")
    assert 1 <= len(name) <= 64


@given(NAMEISH | st.text(max_size=70))
def test_the_wildcard_pattern_admits_no_name_that_check_name_refuses(name):
    # workflow/rules/common.smk constrains the {gpu} wildcard with NAME_PATTERN: a target
    # path can then carry only a name that a config could have named.
    import re

    if re.fullmatch(NAME_PATTERN, name) and ".." not in name:
        assert check_name(name, "name") == name
    for usual in ["h100", "h100-notf32", "resnet18", "a.b_c-d", "0"]:
        assert re.fullmatch(NAME_PATTERN, usual)


@given(st.text(max_size=12) | st.from_regex(r"(sm|pl)[0-9]{1,6}", fullmatch=True))
def test_an_accepted_setting_is_a_safe_name(text):
    try:
        setting = parse_setting(text)
    except ValueError:
        return
    assert check_name(setting.name, "setting") == text
    assert setting.value is None or 10 <= setting.value <= 99999


# --- which nvidia-smi the privileged script runs under sudo --------------------------------

# Stands in for a user's own nvidia-smi first on PATH: run as root, it would run anything.
HOSTILE_SMI = "#!/bin/sh\ntouch '{marker}'\nexit 1\n"


@pytest.fixture
def under_sudo(calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """As if started by sudo (SUDO_UID, SUDO_USER set) from a user whose PATH begins with a
    world-writable nvidia-smi that creates ``tmp_path/marker``; the fake stays on PATH
    after it. The trusted directories are replaced by ``tmp_path/trusted`` (returned,
    empty, mode 755), so that a real nvidia-smi of the host is never run here."""
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    smi = hostile / "nvidia-smi"
    smi.write_text(HOSTILE_SMI.format(marker=tmp_path / "marker"))
    smi.chmod(0o777)
    hostile.chmod(0o777)
    monkeypatch.setenv("PATH", os.pathsep.join([str(hostile), os.environ["PATH"]]))
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.setenv("SUDO_USER", "alice")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    trusted.chmod(0o755)
    monkeypatch.setattr(
        gpu_setting_script, "TRUSTED_NVIDIA_SMI_DIRS", (str(trusted),), raising=False
    )
    return trusted


def _install_fake(directory: Path) -> Path:
    smi = directory / "nvidia-smi"
    shutil.copyfile(FAKES / "nvidia-smi", smi)
    smi.chmod(0o755)
    return smi


def test_under_sudo_nvidia_smi_on_path_is_not_run(
    under_sudo: Path, calls: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--gpu", "0", "--reset"]) == 1
    assert not (tmp_path / "marker").exists(), "ran the nvidia-smi on the caller's PATH as root"
    assert recorded(calls) == []  # nor the fake further down PATH
    assert f"nvidia-smi is in none of {under_sudo}" in capsys.readouterr().err


def test_under_sudo_the_trusted_nvidia_smi_is_run(
    under_sudo: Path, calls: Path, tmp_path: Path
) -> None:
    _install_fake(under_sudo)
    assert main(["--gpu", "0", "--reset"]) == 0
    assert changes(calls) == [["-i", "0", "-rgc"], ["-i", "0", "-pl", "700"]]
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize(
    "weakness",
    [
        "file group-writable",
        "file world-writable",
        "dir group-writable",
        "dir world-writable",
        "link to writable file",
        "link in writable dir",
        "file owned by a user",
    ],
)
def test_under_sudo_a_changeable_nvidia_smi_is_refused(
    under_sudo: Path,
    calls: Path,
    tmp_path: Path,
    weakness: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    smi = _install_fake(under_sudo)
    if weakness == "file group-writable":
        smi.chmod(0o775)
    elif weakness == "file world-writable":
        smi.chmod(0o757)
    elif weakness == "dir group-writable":
        under_sudo.chmod(0o775)
    elif weakness == "dir world-writable":
        under_sudo.chmod(0o777)  # not sticky: anyone may replace the binary
    elif weakness == "link to writable file":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o777)
        elsewhere.chmod(0o777)
        smi.rename(elsewhere / "nvidia-smi")
        smi.symlink_to(elsewhere / "nvidia-smi")
    elif weakness == "link in writable dir":
        # The binary is safe, but anyone may point the link in the open folder elsewhere.
        safe = tmp_path / "safe"
        safe.mkdir()
        safe.chmod(0o755)
        smi.rename(safe / "nvidia-smi")
        smi.symlink_to(safe / "nvidia-smi")
        under_sudo.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can give a file to another user")
        os.chown(smi, 1000, 1000)
    assert main(["--gpu", "0", "--reset"]) == 1
    assert "refusing to run" in capsys.readouterr().err
    assert recorded(calls) == []
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize(
    ("environ", "elevated"),
    [
        ({}, False),
        ({"SUDO_UID": "1000"}, True),
        ({"SUDO_USER": ""}, True),
        ({"PKEXEC_UID": "1000"}, True),
        ({"DOAS_USER": "alice"}, True),
        ({"USER": "root"}, False),
    ],
)
def test_runs_elevated_sees_sudo(environ: dict[str, str], elevated: bool) -> None:
    # This test process is not set-uid, so only the variables decide.
    assert gpu_setting_script.runs_elevated(environ) is elevated


# --- issue 19: predictor files hold data only -----------------------------------------------


class _RunsTouch:
    """Unpickled, it runs ``touch marker``: what a hostile model file holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import shlex

        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _copy_h100(predictors: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(predictors / "h100", tmp_path / "h100")
    return tmp_path / "h100"


@pytest.mark.parametrize("hostile", ["pickle", "npz-member"])
def test_hostile_model_file_is_refused_without_running_it(predictors, tmp_path, hostile):
    """A model file that runs a command when unpickled: a pickle, or a ``.npz`` with an
    object array. Its manifest entry is updated too (whoever can write the file can): it
    is refused naming the file, and the command never runs
    (model/format.py:_read_model, ``allow_pickle=False``)."""
    import pickle
    import re

    import numpy as np
    from conftest import reseal

    from opcost.model import PredictorError
    from opcost.model.format import TIME_FILE, load_predictor

    d = _copy_h100(predictors, tmp_path)
    marker = tmp_path / "marker"
    if hostile == "pickle":
        (d / TIME_FILE).write_bytes(pickle.dumps(_RunsTouch(marker)))
    else:
        with np.load(d / TIME_FILE) as npz:
            arrays = dict(npz)
        arrays["children"] = np.array([_RunsTouch(marker)], dtype=object)
        with (d / TIME_FILE).open("wb") as f:
            np.savez(f, **arrays)
    reseal(d)
    with pytest.raises(PredictorError, match=re.escape(str(d / TIME_FILE))):
        load_predictor(d)
    assert not marker.exists()


def test_model_whose_walk_never_ends_is_refused(predictors, tmp_path):
    """A well-formed model file (plain arrays, manifest updated) whose first tree's root
    has itself as a child: a walk would loop for ever. Refused at load, naming the file
    (model/trees.py:TreeEnsemble.from_arrays)."""
    import re

    import numpy as np
    from conftest import reseal

    from opcost.model import PredictorError
    from opcost.model.format import TIME_FILE, load_predictor

    d = _copy_h100(predictors, tmp_path)
    with np.load(d / TIME_FILE) as npz:
        arrays = dict(npz)
    root = arrays["roots"][0]
    assert not arrays["is_leaf"][root]
    arrays["children"][root, 1] = root
    with (d / TIME_FILE).open("wb") as f:
        np.savez(f, **arrays)
    reseal(d)
    with pytest.raises(PredictorError, match=re.escape(f"{d / TIME_FILE}: not an opcost tree")):
        load_predictor(d)
