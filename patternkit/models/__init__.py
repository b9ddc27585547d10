"""Models to run patternkit on: built-in Relax graphs and a zoo of real models.

* :mod:`~patternkit.models.builtin`: models written directly in Relax with seeded random
  weights (:func:`resnet18`, :func:`seed_batchnorm`); they need neither torch nor onnx, so
  ``patternkit run`` works on a fresh machine.
* :mod:`~patternkit.models.zoo`: transformers and ONNX models built offline from small
  configs with seeded random weights, imported into Relax, each with a reference, example
  inputs and family counts (:func:`zoo_model`, spec syntax ``zoo:gpt2?layers=2&batch=dynamic``).

This layer imports only :mod:`patternkit.ir` and :mod:`patternkit.errors` from patternkit;
torch, transformers and onnx are imported when a zoo model is first built.
"""

from .builtin import BATCHNORM_STYLES, BUILTIN_MODELS, resnet18, seed_batchnorm
from .zoo import ZOO, Option, ZooEntry, parse_spec, zoo_model
from .zoomodel import FAMILIES, InputSpec, ZooError, ZooImportError, ZooModel, ZooSpec

__all__ = [
    "resnet18", "seed_batchnorm", "BUILTIN_MODELS", "BATCHNORM_STYLES",
    "zoo_model", "parse_spec", "ZOO", "ZooEntry", "ZooSpec", "Option",
    "ZooModel", "InputSpec", "FAMILIES", "ZooError", "ZooImportError",
]
