"""opcost: time, power and energy of PyTorch networks on NVIDIA GPUs, operation by operation.

The pipeline (``Snakefile``) runs the stages extract -> profile -> evaluate -> train ->
validate -> figures; this package holds the logic of every stage so that it can be tested.
"""

__version__ = "0.1.0"
