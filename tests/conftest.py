import json
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
FAKES = TESTS / "fakes"

# User models for import-path tests live in tests/toymodels; test modules also import
# helpers from each other and from here (`from conftest import recorded`).
sys.path.insert(0, str(TESTS))


def module_spec(module, *inputs) -> dict:
    """The spec extraction records for ``module`` called on ``inputs``."""
    from opcost import spec as specs

    return specs.make_spec(
        "module",
        specs.qualified_name(type(module)),
        inputs,
        {},
        module(*inputs),
        attrs=specs.module_attrs(module),
    )


@pytest.fixture(autouse=True)
def _private_op_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test's `opcost extract`/`predict` caches op tables in its own directory, not
    the user's (opcost.opcache): no test sees another's entries."""
    monkeypatch.setenv("OPCOST_CACHE_DIR", str(tmp_path / "opcost-op-cache"))


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Skip (or fail, with OPCOST_REQUIRE_SLURM=1) unless a SLURM controller answers."""
    from slurm.conftest_helpers import slurm_controller_up

    up, reason = slurm_controller_up()
    if not up:
        if os.environ.get("OPCOST_REQUIRE_SLURM") == "1":
            pytest.fail(f"OPCOST_REQUIRE_SLURM=1 but no SLURM cluster: {reason}")
        pytest.skip(reason)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Fake nvidia-smi first on PATH, a private state dir; return the call record's path.

    The fake (tests/fakes/nvidia-smi, described in tests/fakes/README.md) appends the
    arguments of every call to the returned file; its failure modes are switched on with
    ``FAKE_NVSMI_*`` variables, all unset here.
    """
    assert os.access(FAKES / "nvidia-smi", os.X_OK), "tests/fakes/nvidia-smi must be executable"
    # The fake's `#!/usr/bin/env python3` then finds this interpreter (not a slow shim).
    python_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES), str(python_dir), os.environ["PATH"]]))
    for name in (
        "FAKE_NVSMI_MODE",
        "FAKE_NVSMI_LOG",
        "FAKE_NVSMI_NA_FIELDS",
        "FAKE_NVSMI_IGNORE_TERM",
        # Under `sudo pytest` these would make opcost-gpu-setting ignore PATH (and so the
        # fake): see opcost.gpu_setting_script.runs_elevated.
        "SUDO_UID",
        "SUDO_USER",
        "PKEXEC_UID",
        "DOAS_USER",
    ):
        monkeypatch.delenv(name, raising=False)
    # Markers of applied GPU settings (opcost.gpu_setting) go here, not to ~/.cache.
    monkeypatch.setenv("OPCOST_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_NVSMI_CALLS", str(path))
    return path


def recorded(path: Path) -> list[list[str]]:
    """The fake nvidia-smi's calls, each as its argument list (see the ``calls`` fixture)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def as_ordinary_user(argv: list[str]) -> list[str]:
    """``argv`` run with a plain user's rights over files: as root, it runs without any
    capability (util-linux's ``setpriv``), so file modes bind it as they bind the files'
    owner; otherwise unchanged. Root's files and the interpreter stay reachable, which a
    switch to another user (``nobody``) cannot promise: Python may live under /root."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", *argv]


def changes(path: Path) -> list[list[str]]:
    """The recorded calls that change the card (lock, limit, reset), in order."""
    return [c for c in recorded(path) if {"-lgc", "-rgc", "-pl"} & set(c)]


def reseal(directory: Path) -> None:
    """Record the present SHA-256 and size of each file a predictor's manifest.json lists,
    as someone who edits a predictor and its manifest would: a test of a check behind the
    manifest's then reaches it. Does nothing without a manifest."""
    import hashlib

    path = directory / "manifest.json"
    if not path.is_file():
        return
    manifest = json.loads(path.read_text())
    for name in manifest["files"]:
        data = (directory / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    path.write_text(json.dumps(manifest))


@pytest.fixture(scope="session")
def predictors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Predictors trained on the real H100 sample (10 trees), one directory per GPU."""
    import pandas as pd

    from opcost.model.format import save_predictor
    from opcost.train import TrainConfig, fit_predictor, op_rows

    root = tmp_path_factory.mktemp("predictors")
    rows = op_rows(pd.read_parquet(DATA / "h100" / "dataset" / "h100.parquet"))
    save_predictor(fit_predictor(rows, TrainConfig(n_estimators=10), "h100"), root / "h100")
    return root


@pytest.fixture(scope="session")
def op_models(tmp_path_factory) -> Path:
    """Small op models of two configurations (h100 and a copy on a slower stream)."""
    import glob

    from opcost.model import op_tables, opmodel
    from opcost.model.opmodel_format import save_op_model
    from opcost.train import TrainConfig, make_regressor

    files = sorted(
        glob.glob(
            str(Path(__file__).resolve().parents[1] / "data" / "op-space" / "h100" / "*.parquet")
        )
    )
    table = op_tables.read_chunks(files)
    table = table.groupby("family", group_keys=False).head(30).reset_index(drop=True)
    cfg = TrainConfig(regressor="extra_trees", n_estimators=4)
    model = opmodel.fit(table, "h100", lambda: make_regressor(cfg, n_jobs=1))
    root = tmp_path_factory.mktemp("op-models")
    save_op_model(model, root / "h100", sources=files)
    slow = opmodel.OpModel(**{**model.__dict__, "gpu": "slow", "kernel_gap_s": 1e-3})
    save_op_model(slow, root / "slow", sources=files)
    return root
