"""Validation: summed operations against whole networks, predictions against measurements.

Two questions (thesis chapter 5), each a table under ``results/validation/``:

* :mod:`opcost.validate.dataset` (5.1, the rule ``validate_dataset``): is the sum of a
  network's measured operations, each times how often it occurs, close to the
  measurement of the whole network?
* :mod:`opcost.validate.predictions` (5.2, the rule ``validate_predictions``): how far
  are the held-out ops and left-out networks that training predicted from their
  measurements, and do the predictions pick the measured best GPU configuration?

docs/validation.md gives the method and the current findings, docs/formats.md the
columns::

    table = dataset_validation(dataset, read_network_ops(op_table_paths))
    metrics = prediction_metrics(prediction_ops(holdouts), prediction_networks(networks))
"""

from __future__ import annotations

from opcost.errors import OpcostError


class ValidationError(OpcostError, ValueError):
    """Validation inputs are inconsistent; the message names what to fix."""
