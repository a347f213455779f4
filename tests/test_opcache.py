"""The op-table cache of ``opcost predict --model`` and ``opcost extract`` (opcost.opcache).

A repeated prediction of the same network must read the cached op table without importing
torch or torchvision; an entry that is damaged, or not the requested network's, is ignored
and written again; the key changes with what changes an op table.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opcost import opcache
from opcost.cli import main
from opcost.extract import extract_model_input, with_gradient_sums
from opcost.model import inplace_saves, leaf_grads
from opcost.names import ModelInput

TESTS = Path(__file__).parent
NET = ["--model", "squeezenet1_1", "--input", "1,3,32,32"]
SHAPE = (1, 3, 32, 32)


def entry(directory: Path) -> Path:
    """The one cache file under ``directory``."""
    files = sorted(directory.glob("*.parquet"))
    assert len(files) == 1, files
    return files[0]


def extract_csv(capsys, directory: Path, *extra: str) -> str:
    """`opcost extract` of NET with the cache in ``directory``: its table as printed."""
    assert main(["extract", *NET, "--cache-dir", str(directory), *extra]) == 0
    return capsys.readouterr().out


def predict_without_torch(argv: list[str]) -> pd.DataFrame:
    """``opcost predict *argv --format csv`` in a fresh interpreter: its table, after
    checking that it imported neither torch nor torchvision."""
    code = (
        "import sys\n"
        "from opcost.cli import main\n"
        f"rc = main(['predict', *{argv!r}, '--format', 'csv'])\n"
        "print('imported:', [m for m in ('torch', 'torchvision') if m in sys.modules])\n"
        "sys.exit(rc)\n"
    )
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "imported: []"
    return pd.read_csv(io.StringIO("\n".join(done.stdout.splitlines()[:-1])))


def test_a_repeat_reads_the_cache_and_imports_neither_torch_nor_torchvision(
    capsys, tmp_path, predictors
):
    cache = tmp_path / "cache"
    fresh = extract_csv(capsys, cache)  # extracts (torch is imported in this process)
    table = pd.read_parquet(entry(cache))
    # The op table, its calls' gradient sums in the network, the gradient copies of each
    # op measured alone and the clones of in-place ops in a training step (by autograd).
    mi = ModelInput("squeezenet1_1", SHAPE)
    by_hand = leaf_grads.with_copies(with_gradient_sums(extract_model_input(mi), mi))
    by_hand = inplace_saves.with_saves(by_hand)
    assert (by_hand["grad_sum_adds"] > 0).any()  # each fire's squeeze, taken twice
    pd.testing.assert_frame_equal(table, by_hand)
    assert extract_csv(capsys, cache) == fresh

    cached = predict_without_torch(
        [*NET, "--cache-dir", str(cache), "--predictors", str(predictors)]
    )
    assert (
        main(["predict", *NET, "--no-cache", "--predictors", str(predictors), "--format", "csv"])
        == 0
    )
    pd.testing.assert_frame_equal(cached, pd.read_csv(io.StringIO(capsys.readouterr().out)))


@pytest.mark.parametrize("damage", ["garbage bytes", "truncated", "spec changed", "other net"])
def test_a_damaged_or_foreign_entry_is_ignored_and_written_again(capsys, tmp_path, damage):
    cache = tmp_path / "cache"
    fresh = extract_csv(capsys, cache)
    path = entry(cache)
    good = path.read_bytes()
    if damage == "garbage bytes":
        path.write_bytes(b"not a parquet file")
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    else:
        table = pd.read_parquet(path)
        if damage == "spec changed":
            table.loc[0, "spec"] = table.loc[0, "spec"].replace("1", "2", 1)
        else:
            table["model_input"] = "resnet18_1x3x32x32"
        table.to_parquet(path, index=False)
    assert extract_csv(capsys, cache) == fresh
    pd.testing.assert_frame_equal(pd.read_parquet(entry(cache)), pd.read_parquet(path))
    assert opcache.load(path, "squeezenet1_1_1x3x32x32") is not None


def test_the_key_changes_with_versions_shape_and_functional_ops(monkeypatch, tmp_path):
    key = opcache.entry_path(tmp_path, "resnet18", SHAPE, True)
    assert key is not None
    assert key.parent == tmp_path
    assert key.name.startswith("resnet18_1x3x32x32.")
    others = {
        opcache.entry_path(tmp_path, "resnet18", (2, 3, 32, 32), True),
        opcache.entry_path(tmp_path, "resnet18", SHAPE, False),
    }
    monkeypatch.setattr(opcache, "SPEC_VERSION", opcache.SPEC_VERSION + 1)
    others.add(opcache.entry_path(tmp_path, "resnet18", SHAPE, True))
    monkeypatch.undo()
    real = opcache._versions()
    for changed in ("torch", "torchvision"):
        monkeypatch.setattr(opcache, "_versions", lambda c=changed: {**real, c: "0.0"})
        others.add(opcache.entry_path(tmp_path, "resnet18", SHAPE, True))
    assert key not in others
    assert len(others) == 5
    # A user's factory is their code, which changes under one name: never cached.
    assert opcache.entry_path(tmp_path, "toymodels.nets:tiny_mlp", (8, 16), True) is None


def test_the_cache_directory_follows_option_environment_and_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(opcache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert opcache.cache_dir() == tmp_path / "xdg" / "opcost" / "ops"
    monkeypatch.setenv(opcache.CACHE_ENV, str(tmp_path / "env"))
    assert opcache.cache_dir() == tmp_path / "env"
    assert opcache.cache_dir(tmp_path / "option") == tmp_path / "option"


def test_an_unwritable_cache_costs_a_warning_not_the_answer(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would be")
    fresh = extract_csv(capsys, tmp_path / "ok")
    assert main(["extract", *NET, "--cache-dir", str(blocker)]) == 0
    out, err = capsys.readouterr()
    assert out == fresh
    assert err.startswith("opcost: op table not cached (")
    assert len(err.strip().splitlines()) == 1


def test_op_models_predict_training_from_a_cached_entry_without_torch(capsys, tmp_path, op_models):
    """Op models take off the gradient copies of an isolated op in training
    (opcost.model.leaf_grads) and add the clones of in-place ops
    (opcost.model.inplace_saves), which take torch to find: the cache keeps them, so a
    repeat still imports neither torch nor torchvision, and predicts as a fresh run."""
    cache = tmp_path / "cache"
    # Residual adds copy their gradients alone; in-place ReLU6s clone their input.
    net = ["--model", "mobilenet_v2", "--input", "2,3,32,32"]
    assert main(["extract", *net, "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    cached_table = pd.read_parquet(entry(cache))
    assert (cached_table["leaf_grad_copies"] > 0).any()
    assert (cached_table["inplace_save_copies"] > 0).any()
    cached = predict_without_torch(
        [*net, "--cache-dir", str(cache), "--op-models", str(op_models), "--mode", "training"]
    )
    base = ["predict", *net, "--no-cache", "--op-models", str(op_models)]
    assert main([*base, "--mode", "training", "--format", "csv"]) == 0
    pd.testing.assert_frame_equal(cached, pd.read_csv(io.StringIO(capsys.readouterr().out)))
