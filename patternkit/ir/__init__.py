"""IR access: the only layer of patternkit that reads TVM's Relax objects directly.

The public helpers here are the ones rule authors need (``patterns/`` uses nothing
else from TVM's internals): the type, shape and dtype of an expression, the value of a
constant, Relay/Relax operator names, and the conversions between bare expressions and
modules.  :mod:`patternkit.ir.compat` holds private TVM API and is for patternkit's
own layers only, as are the IR plumbing modules the other layers share:
:mod:`~patternkit.ir.walk` (expression kinds, the Vars a value reads, substitution),
:mod:`~patternkit.ir.rebuild` (rebuilding a function, binding text for errors) and
:mod:`~patternkit.ir.kinds` (fused-function kinds and their attributes).
"""

from .compat import (
                     call_args,
                     const_to_numpy as const_value,
                     dtype_of,
                     int_list,
                     is_constant,
                     is_tensor_constant,
                     op_name,
                     static_shape,
                     type_of,
                     var_name,
)
from .dtypes import HALF_WIDENINGS, machine_epsilon, round_trips_wider
from .kinds import FunctionKind, function_kinds
from .opnames import relax_op_name, relay_short_name
from .shapes import (
                     NotPerChannel,
                     NotPerFeature,
                     NotTrailing,
                     dims_equal,
                     per_channel_axis,
                     per_feature_shape,
                     prove_equal,
                     same_shape,
                     trailing_axes,
)
from .targets import from_expr, to_expr

__all__ = [
    "type_of", "static_shape", "dtype_of", "const_value", "is_constant", "is_tensor_constant",
    "var_name", "int_list", "call_args", "op_name", "relax_op_name", "relay_short_name",
    "from_expr", "to_expr",
    "machine_epsilon", "round_trips_wider", "HALF_WIDENINGS", "FunctionKind", "function_kinds",
    "per_channel_axis", "NotPerChannel",
    "prove_equal", "same_shape",
    "dims_equal", "trailing_axes", "NotTrailing", "per_feature_shape", "NotPerFeature",
]
