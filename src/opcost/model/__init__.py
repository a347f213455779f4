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

The op models (learnt from the op-space study; docs/op-space.md):

* :mod:`opcost.model.op_spec`: an op's spec read for its family, tensors and products.
* :mod:`opcost.model.roofline`: an op's FLOPs and DRAM bytes, and its roofline time.
* :mod:`opcost.model.shapes`: its shape features (the matrix product it amounts to).
* :mod:`opcost.model.op_tables`: the op-space tables a GPU configuration learns from.
* :mod:`opcost.model.op_power`: their busy power: the windows it learns from, its
  features and fit.
* :mod:`opcost.model.peer_transfer`: a peer GPU's samples carried over to a
  configuration's GPU by the ratio of the samples both measured.
* :mod:`opcost.model.opmodel`: the op models of a configuration: fit and predict.
* :mod:`opcost.model.op_scores`: their held-out scores (``metrics.json``).
* :mod:`opcost.model.opmodel_format`: their directory: save, load, verify.

:mod:`opcost.train` fits and writes predictors; :mod:`opcost.predict` loads and serves
them (:mod:`opcost.predict_replay` the op models).
"""

from __future__ import annotations

from opcost.errors import OpcostError


class PredictorError(OpcostError, ValueError):
    """A predictor directory is missing, incomplete or incompatible; the message names it."""
