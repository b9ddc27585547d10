"""The types of a replacement's convolution and pooling calls, inferred once per signature.

TVM 0.27 infers the type of a convolution or pooling call through its layouts, which
costs 0.3-0.6 ms a call (an ``add`` costs about 7 us): most of a ResNet-50 rewrite, whose
53 convolution + batch-norm folds each emit a new ``conv2d`` with a folded weight.  A
call's type is a function of its operator, its attributes and its arguments' types, so
while the emission normalises one block's replacements (one ``BlockBuilder``), the first
call of each signature has its type inferred by TVM's normalisation as before, and the
later calls of that signature are given the same type (``relax.UpdateType``, the setter
TVM's normaliser itself uses on a call it has just inferred) before their replacement is
normalised.  The signature is confirmed by structural equality, not by hash alone.

Only calls that are still untyped, of the operators in :data:`LAYOUT_OPS`, whose
arguments are all Vars or constants with a tensor type, are given a type: the calls whose
inference reads nothing but those types and the attributes.  Looking for them costs a
few FFI reads a replacement, so a rule whose first replacement in the block holds none
is not looked at again there (its later replacements are normalised as before).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..ir import compat as C

#: The operators whose type inference goes through layouts (the slow ones).
LAYOUT_OPS = frozenset(
    f"relax.nn.{name}" for name in (
        "conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose",
        "conv3d_transpose", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d",
        "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
        "adaptive_avg_pool3d"))

_update_type = tvm.get_global_func("relax.UpdateType")
_LEAVES = (relax.Var, tvm.ir.GenericConst)  # DataflowVar is a Var
_TYPES = (relax.TensorType, relax.TupleType, relax.ShapeType, relax.FuncType,
          relax.ObjectType, tvm.ir.PrimType)

#: A signature's entries: ``(attrs, argument types, the call's type)``.
_Entry = tuple[Any, list[Any], Any]


class KnownTypes:
    """The types inferred so far in one ``BlockBuilder``, by call signature.

    Parameters
    ----------
    bb : relax.BlockBuilder
        The builder that normalises the replacements (its analyzer infers the types).
    """

    __slots__ = ("_bb", "_seen", "_without", "given", "inferred")

    def __init__(self, bb: relax.BlockBuilder):
        self._bb = bb
        self._seen: dict[tuple[int, int, tuple[int, ...]], list[_Entry]] = {}
        self._without: set[str] = set()  # rules whose first replacement had no such call
        #: How many calls were given a known type, and how many were inferred by TVM.
        self.given = 0
        self.inferred = 0

    def give_types(self, value: Any, rule: str) -> None:
        """Type the untyped layout-operator calls nested in ``value`` (itself included),
        the replacement made by ``rule``: a known signature's type is given, an unknown
        one inferred by TVM and kept.

        Raises whatever TVM's normalisation raises for an ill-typed call (the caller
        reports it as it reports the replacement's own normalisation).
        """
        if rule in self._without:
            return
        calls = _untyped_layout_calls(value)
        if not calls:
            self._without.add(rule)
        for call in calls:
            self._type(call)

    def _type(self, call: relax.Call) -> None:
        args = C.array_items(call.args)
        if not all(isinstance(a, _LEAVES) for a in args) or len(call.ty_args):
            return
        arg_types = [a.ty for a in args]
        if not all(type(t) is relax.TensorType for t in arg_types):
            return
        attrs = call.attrs
        key = (C.handle(call.op), C.structural_hash(attrs),
               tuple(C.structural_hash(t) for t in arg_types))
        entries = self._seen.setdefault(key, [])
        for known_attrs, known_args, known_type in entries:
            if C.structural_equal(attrs, known_attrs) and all(
                    C.structural_equal(t, k) for t, k in zip(arg_types, known_args)):
                _update_type(call, known_type)
                self.given += 1
                return
        normalized = self._bb.normalize(call)  # leaves only: nothing is emitted
        self.inferred += 1
        if normalized.same_as(call):
            entries.append((attrs, arg_types, normalized.ty))


def _untyped_layout_calls(value: Any) -> list[relax.Call]:
    """The untyped calls of :data:`LAYOUT_OPS` in ``value``'s nest of calls and tuples,
    arguments before the calls that read them.
    """
    found: list[relax.Call] = []
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        expr, expanded = stack.pop()
        kind = type(expr)
        if kind is relax.Tuple:
            stack.extend((field, False) for field in reversed(C.array_items(expr.fields)))
            continue
        if kind is not relax.Call or isinstance(getattr(expr, "ty", None), _TYPES):
            continue  # a leaf, or typed already (nothing under it needs a type)
        if expanded:
            op = expr.op
            if type(op) is tvm.ir.Op and C.op_info(op)[0] in LAYOUT_OPS:
                found.append(expr)
            continue
        stack.append((expr, True))
        stack.extend((arg, False) for arg in reversed(C.array_items(expr.args)))
    return found
