"""Training graphs: differentiate real models with Relax's ``Gradient``, check the result.

``gradient`` expands the fused ops ``relax.transform.Gradient`` cannot differentiate (with
the library's expand rules and this package's own, :mod:`.pooling`), runs it and names
whatever remains, and with ``collapse_forward=True`` gives the adjoint's forward half the
fused ops back (:mod:`.forward`); ``check_gradients``
compares every gradient with PyTorch autograd or central finite differences;
``offload`` marks a backward function for an external compiler, as the Relay-era flow
did (``Primitive=1, Compiler="xpucompiler", global_symbol="xpu"``).
"""

from .backward_offload import offload
from .check import GradientCheck, check_gradients
from .differentiate import GradientReport, expand_for_gradient, gradient, with_loss
from .ops import ensure_extra_gradients, has_gradient, ops_without_gradient

__all__ = ["GradientCheck", "GradientReport", "check_gradients", "ensure_extra_gradients",
           "expand_for_gradient",
           "gradient", "has_gradient", "offload", "ops_without_gradient", "with_loss"]
