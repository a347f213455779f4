"""Names that become wildcards and file names, and the parsing of GPU settings.

Every string from the config that ends up in a path passes through here first, so that
no path is ever built from an unchecked user string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from opcost.errors import OpcostError

#: GPU configuration names (``h100``, ``h100-notf32``) and model names (``resnet18``).
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
#: ``{model}_{b}x{c}x{h}x{w}``: the model part may itself contain underscores.
MODEL_INPUT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}_[0-9]+(?:x[0-9]+)*"
#: ``default``, ``sm{MHz}`` or ``pl{W}``.
SETTING_PATTERN = r"default|sm[1-9][0-9]{1,4}|pl[1-9][0-9]{1,4}"
MODE_PATTERN = r"inference|training"
OP_ID_PATTERN = r"[0-9a-f]{16}"
MODES = ("inference", "training")

#: What extraction (:mod:`opcost.spec`) records, versioned. The extract rule takes it as a
#: parameter, so a version that records more reruns extraction; only ops whose spec
#: changed get a new op_id and are profiled. 2: one tensor passed several times is one
#: input; strides of non-contiguous inputs; convolutions on meta keep their input's
#: memory format. 3: a module of no op family that owns child modules but called none of
#: them is the torch calls it made (opcost.extract). 4: a write into part of a tensor,
#: ``x[index] = value``, is an op (opcost.spec.call_output). Here, not in opcost.spec, so
#: that reading it imports no torch.
SPEC_VERSION = 4

#: Plausible locked SM clocks, MHz. The supported graphics clocks of current NVIDIA
#: datacenter and desktop GPUs lie inside: the lowest are a few hundred MHz (A100's list
#: goes down to 210 MHz), the highest boost clocks about 3,000 MHz (GeForce RTX 40/50).
#: Which clocks a given GPU accepts is checked against its own list when the setting is
#: applied (opcost-gpu-setting); this bound refuses a typo such as ``sm99999`` at config
#: load, before any job.
SM_CLOCK_MHZ_RANGE = (100, 4000)
#: Plausible power limits, W. The smallest minimum limits of current GPUs are tens of
#: watts (low-profile cards such as the A2 or L4), the largest maximum limits about
#: 1,200 W (B200, GB200; the H100 SXM's range is 200..700 W): the range admits all of them
#: with headroom. The GPU's own limits are checked when the setting is applied.
POWER_LIMIT_W_RANGE = (20, 2000)

_NAME_RE = re.compile(NAME_PATTERN)
_SETTING_RE = re.compile(SETTING_PATTERN)


class NameError_(OpcostError, ValueError):
    """A name from the config cannot be used as a wildcard or file name."""


def check_name(name: object, what: str) -> str:
    """Return ``name`` if it is safe as a path component, else raise naming ``what``.

    Safe means: starts with a letter or digit, then only letters, digits, ``_``, ``.``
    and ``-``, at most 64 characters (no ``/``, no spaces, no ``..`` at the start).
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise NameError_(
            f"{what}: {name!r} is not a safe name; use letters, digits, '_', '.' and '-' "
            f"(starting with a letter or digit, at most 64 characters)"
        )
    return name


def model_input_name(model: str, shape: tuple[int, ...] | list[int]) -> str:
    """The model-input set's name, e.g. ``resnet18_32x3x224x224``.

    For a user's import path (``pkg.module:factory``) the model part is the factory's
    qualified name with ``:`` replaced by ``.``.
    """
    model_part = model.replace(":", ".")
    check_name(model_part, f"model {model!r}")
    return f"{model_part}_{'x'.join(str(int(d)) for d in shape)}"


@dataclass(frozen=True)
class Setting:
    """A GPU setting: the card as it is, a locked SM clock, or a power limit."""

    name: str
    kind: str  # "default" | "sm" | "pl"
    value: int | None  # MHz for "sm", W for "pl"

    @property
    def sm_clock_mhz(self) -> int | None:
        return self.value if self.kind == "sm" else None

    @property
    def power_limit_w(self) -> int | None:
        return self.value if self.kind == "pl" else None


def parse_setting(text: object) -> Setting:
    """Parse ``default``, ``sm1410`` (lock SM clock at 1410 MHz) or ``pl300`` (300 W limit).

    Clocks must lie in :data:`SM_CLOCK_MHZ_RANGE`, power limits in
    :data:`POWER_LIMIT_W_RANGE`; anything else raises ``ValueError``.
    """
    if not isinstance(text, str) or not _SETTING_RE.fullmatch(text):
        raise ValueError(
            f"GPU setting {text!r} is malformed: expected 'default', 'sm<MHz>' (e.g. sm1410) "
            f"or 'pl<W>' (e.g. pl300) with a positive integer"
        )
    if text == "default":
        return Setting(text, "default", None)
    kind, value = text[:2], int(text[2:])
    low, high = SM_CLOCK_MHZ_RANGE if kind == "sm" else POWER_LIMIT_W_RANGE
    if not low <= value <= high:
        what, unit = ("SM clock", "MHz") if kind == "sm" else ("power limit", "W")
        raise ValueError(
            f"GPU setting {text!r}: {what} {value} {unit} is outside {low}..{high} {unit}, "
            f"the range of NVIDIA GPUs"
        )
    return Setting(text, kind, value)


@dataclass(frozen=True)
class ModelInput:
    """A model-input set: a network plus one input shape, e.g. ``resnet18`` at (32, 3, 224, 224)."""

    model: str
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return model_input_name(self.model, self.shape)

    @classmethod
    def from_name(cls, name: str) -> ModelInput:
        """The torchvision model-input set a name such as ``resnet18_32x3x224x224``
        names (:func:`model_input_name`'s inverse for a model named without ``:``).

        Raises:
            NameError_: ``name`` is no model name, ``_`` and a shape of positive
                integers joined by ``x``.
        """
        model, _, dims = name.rpartition("_")
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            shape = ()
        if not model or not shape or min(shape) < 1:
            raise NameError_(f"{name!r} names no model-input set (e.g. resnet18_32x3x224x224)")
        return cls(check_name(model, f"model of {name!r}"), shape)
