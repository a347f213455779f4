"""Tests for opcost.names: a model-input set's name and its inverse."""

from __future__ import annotations

import pytest

from opcost.names import ModelInput, NameError_, model_input_name


@pytest.mark.parametrize(
    ("model", "shape"),
    [("resnet18", (32, 3, 224, 224)), ("swin_v2_t", (1, 3, 256, 256)), ("vit_b_16", (8, 3))],
)
def test_a_model_input_name_reads_back_as_the_set_it_names(model, shape):
    name = model_input_name(model, shape)
    assert name == f"{model}_{'x'.join(map(str, shape))}"
    assert ModelInput.from_name(name) == ModelInput(model, shape)
    assert ModelInput.from_name(name).name == name


@pytest.mark.parametrize(
    "name",
    ["resnet18", "resnet18_", "_8x3x224x224", "resnet18_8x3xAx224", "resnet18_8x0x2", "a/b_8"],
)
def test_a_name_of_no_model_input_set_is_refused_naming_it(name):
    with pytest.raises(NameError_, match="names no model-input set|not a safe name"):
        ModelInput.from_name(name)
