"""The einsum family: ``from_onnx``'s lowered einsums, lifted back and written as matmuls.

TVM 0.27's ONNX frontend imports ``Einsum`` as a ``call_tir`` of a ``topi.einsum``
PrimFunc, which hides the product from every rule: attention written with
``torch.einsum`` collapses through ``torch.export`` (``attention.einsum_matmul``) but
stayed written out through both ONNX exporters.  Two rules bring it back:

* ``einsum.from_call_tir`` (:mod:`.from_call_tir`): the ``call_tir`` whose PrimFunc is
  provably a two-operand einsum (:mod:`.tir` reads the equation from its subscripts)
  becomes ``R.einsum((a, b), equation)``, bit-exact;
* ``einsum.to_matmul`` (:mod:`.to_matmul`): a two-operand ``R.einsum`` that is a batched
  matmul becomes ``R.matmul`` between the permutations its labels ask for, which
  ``attention.collapse`` then reads like any ONNX attention.

The family runs before ``attention`` (``patterns/__init__.py``).  Examples, as
``from_onnx`` builds them, are in :mod:`.examples`.
"""

from __future__ import annotations

from .from_call_tir import EinsumFromCallTir
from .to_matmul import EinsumToMatmul

#: The rewrite rules of this family, in application order.
RULES = (EinsumFromCallTir, EinsumToMatmul)
