"""The predictor: features, tree ensembles, the predictor class and its file format.

Modules, lowest first (each imports only those before it; none imports torch or
scikit-learn at import time):

* :mod:`opcost.model.features`: one fixed-length numeric vector per op measurement.
* :mod:`opcost.model.accuracy`: relative error, APE, MAPE, their summaries and
  ``metrics.json``.
* :mod:`opcost.model.trees`: a fitted tree ensemble as flat arrays, and its prediction.
* :mod:`opcost.model.predictor`: :class:`~opcost.model.predictor.Predictor`, the time
  and power models of one GPU configuration.
* :mod:`opcost.model.format`: the predictor directory (``.npz`` models, ``features.json``,
  ``manifest.json`` with SHA-256): save, load, verify.

:mod:`opcost.train` fits and writes predictors; :mod:`opcost.predict` loads and serves
them.
"""

from __future__ import annotations

from opcost.errors import OpcostError


class PredictorError(OpcostError, ValueError):
    """A predictor directory is missing, incomplete or incompatible; the message names it."""
