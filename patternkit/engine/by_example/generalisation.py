"""From a traced ``written`` function to the pattern a user means by it.

The trace is one concrete program; the pattern matches every program the user would call
the same computation:

* each tensor parameter becomes a wildcard (the same one wherever the parameter is read,
  so ``x * sigmoid(x)`` needs the *same* ``x`` twice);
* shapes are not in the pattern: the rank is kept only when the body has an operator
  that is not elementwise (a reduction's axis, a reshape), and the sizes two operands
  share are kept by the graph's own typing (it would not be well formed otherwise);
* a number (a scalar constant, a prim value) matches that value in any float dtype
  within that dtype's rounding (:class:`~patternkit.dpl.pattern.ScalarPattern`);
* ``add`` and ``multiply`` match their operands in either order (the matcher always
  does), and so do the operators named ``commutative=``; with ``associative=True`` a
  chain of products matches in every grouping (:func:`~patternkit.dpl.products`);
* a tensor constant matches any constant (a role ``c0``, ``c1``, ... or the named
  constant's parameter), unless it is named in ``exact=``: its value is then checked;
* operator attributes (an axis, a dtype) are kept as traced.

:class:`Generalised` keeps what the pattern was made from, and :meth:`Generalised.lines`
says each generalisation in words (what ``describe()`` prints).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from ...dpl import (
    K_BROADCAST,
    DFPattern,
    ScalarPattern,
    has_attr,
    is_constant,
    is_op,
    is_scalar,
    is_tuple,
    is_tuple_get_item,
    op_kind,
    products,
    wildcard,
)
from ...errors import PatternError
from ...ir import compat as C
from .signature import Signature

__all__ = ["Generalised", "generalise", "expression_text", "ALWAYS_COMMUTATIVE"]

#: Operators whose operands the matcher always tries in both orders.
ALWAYS_COMMUTATIVE = ("add", "multiply")


@dataclass
class Generalised:
    """The pattern of one ``written`` trace and what it was generalised from.

    Attributes
    ----------
    pattern : DFPattern
    roles : dict
        Role name -> sub-pattern: the tensor parameters, then the constants.
    constants : dict
        Constant role -> the traced value (numpy), for ``exact`` checks and the text.
    exact : tuple of str
        The constant roles whose value must match.
    ranks : dict
        Tensor parameter -> the rank it must have, when the body needs ranks kept.
    ops : tuple of str
        The operators of the body, in trace order.
    numbers : list of float
        The numbers the pattern matches in any float dtype.
    exact_exponent : bool
        A ``power`` exponent is matched exactly.
    text : str
        The traced expression, with the parameters by name and the numbers as written.
    swapped : tuple of str
        The operators whose operands match in either order.
    grouped : bool
        Products matched in every grouping.
    """

    pattern: DFPattern
    roles: dict[str, DFPattern]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    exact: tuple[str, ...] = ()
    ranks: dict[str, int] = field(default_factory=dict)
    ops: tuple[str, ...] = ()
    numbers: list[float] = field(default_factory=list)
    swapped: tuple[str, ...] = ()
    grouped: bool = False
    exact_exponent: bool = False
    text: str = ""

    def lines(self, signature: Signature) -> list[str]:
        """Each generalisation, one line each."""
        out = []
        for name in signature.tensors:
            rank = self.ranks.get(name)
            dims = ", ".join(str(d) for d in signature.shapes[name])
            kept = (f"of rank {rank} (traced as ({dims}): its sizes are free)" if rank
                    is not None else f"of any rank and shape (traced as ({dims}))")
            out.append(f"{name}: any tensor {kept}")
        for role, value in self.constants.items():
            if role in self.exact:
                out.append(f"{role}: a constant equal to the traced {_value_text(value)}")
            else:
                out.append(f"{role}: any constant (traced as {_value_text(value)}; "
                           f"name it in exact= to require the value)")
        if self.numbers:
            text = ", ".join(f"{v:.10g}" for v in dict.fromkeys(self.numbers))
            out.append(f"numbers {text}: in any float dtype, within that dtype's rounding")
        if self.swapped:
            out.append(f"{', '.join(self.swapped)}: operands in either order")
        if self.grouped:
            out.append("products: in every grouping")
        if self.exact_exponent:
            out.append("power exponents: exactly as written (one ulp off an integer is NaN "
                       "for a negative base)")
        return out


def _value_text(value: np.ndarray) -> str:
    if value.size == 1:
        return f"{value.reshape(()).item():.10g} ({value.dtype})"
    return f"array of shape {value.shape} ({value.dtype})"


def generalise(rule: str, func: relax.Function, signature: Signature, *,
               named: dict[int, str] | None = None, exact: Sequence[str] = (),
               commutative: Sequence[str] = (), associative: bool = False,
               roles: dict[str, DFPattern] | None = None) -> Generalised:
    """The pattern of ``func`` (a trace of ``written``), generalised; see the module doc.

    Parameters
    ----------
    rule : str
        The rule's name, for errors.
    func : relax.Function
        The trace; its parameters are ``signature.tensors`` in order.
    signature : Signature
    named : dict
        Handle of a traced constant -> the named-constant parameter it came from.
    exact, commutative, associative
        The user's options (see :func:`patternkit.rule_by_example`).
    roles : dict, optional
        Role -> pattern, shared between the spellings of one rule (filled in here): a
        role is one pattern object in every spelling, so a match of any spelling is read
        by the same names.

    Raises
    ------
    PatternError
        The body computes nothing to match (it returns a parameter or a constant), or
        holds an expression the pattern language cannot say.
    """
    builder = _Builder(rule, func, signature, named or {}, tuple(exact),
                       tuple(commutative), associative, {} if roles is None else roles)
    return builder.run()


def expression_text(rule: str, func: relax.Function, signature: Signature) -> str:
    """``func``'s result as one nested expression (``silu(x)``), for descriptions."""
    builder = _Builder(rule, func, signature, {}, (), (), False, {})
    return builder.text(builder.result)


class _Builder:
    """One walk of the trace, from its result back to its parameters."""

    def __init__(self, rule: str, func: relax.Function, signature: Signature,
                 named: dict[int, str], exact: tuple[str, ...], commutative: tuple[str, ...],
                 associative: bool, roles: dict[str, DFPattern]):
        self.rule, self.signature = rule, signature
        self.named, self.exact = named, exact
        self.commutative = tuple(_short(n) for n in commutative)
        self.associative = associative
        self.values: dict[int, Any] = {}
        uses: Counter[int] = Counter()
        for block in func.body.blocks:
            for binding in block.bindings:
                self.values[C.handle(binding.var)] = binding.value
                for var in relax.analysis.free_vars(binding.value):
                    uses[C.handle(var)] += 1
        self.uses = uses
        self.result = func.body.body
        self.params = {C.handle(p): name for p, name in zip(func.params, signature.tensors)}
        self.param_vars = dict(zip(signature.tensors, func.params))
        for name in signature.tensors:
            roles.setdefault(name, wildcard())
        self.roles = roles
        self.constants: dict[str, np.ndarray] = {}
        self.memo: dict[int, DFPattern] = {}
        self.ops: list[str] = []
        self.numbers: list[float] = []
        self.swapped: dict[str, None] = {}
        self.grouped = False
        self.ranked = False
        self.exact_exponent = False

    def run(self) -> Generalised:
        root = self._look_through(self.result)
        if type(root) in C.VAR_TYPES and C.handle(root) in self.params:
            raise PatternError(f"{self.rule}: written returns its parameter "
                               f"{self.params[C.handle(root)]!r} unchanged: there is nothing "
                               f"to match")
        if C.is_constant(root):
            raise PatternError(f"{self.rule}: written returns a constant: there is nothing to "
                               f"match (it reads none of its parameters)")
        pattern = self.pattern(self.result)
        unknown = sorted(set(self.exact) - set(self.constants))
        if unknown:
            raise PatternError(f"{self.rule}: exact= names {unknown[0]!r}, which is no "
                               f"constant of written (its constants: "
                               f"{', '.join(self.constants) or 'none'})")
        ranks = {}
        if self.ranked:
            ranks = {n: len(self.signature.shapes[n]) for n in self.signature.tensors}
        names = (*self.signature.tensors, *self.constants)
        roles = {n: self.roles[n] for n in names}
        return Generalised(pattern, roles, self.constants, self.exact, ranks,
                           tuple(self.ops), self.numbers, tuple(self.swapped), self.grouped,
                           self.exact_exponent, self.text(self.result))

    def text(self, expr: Any, depth: int = 0) -> str:
        """``multiply(x, sigmoid(x))``: the trace as one expression (deep parts elided)."""
        expr = self._look_through(expr)
        if type(expr) in C.VAR_TYPES:
            return self.params.get(C.handle(expr), C.var_name(expr))
        if C.is_tensor_constant(expr):
            named = self.named.get(C.handle(expr))
            value = C.const_to_numpy(expr)
            return named or (f"{value.reshape(()).item():.6g}" if value.size == 1
                             else f"const{value.shape}")
        if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return f"{float(expr.value):.6g}"
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            if depth > 12:
                return "..."
            args = ", ".join(self.text(a, depth + 1) for a in expr.args
                             if not isinstance(a, relax.ShapeExpr))
            return f"{_short(expr.op.name)}({args})"
        return type(expr).__name__

    def _look_through(self, expr: Any) -> Any:
        while type(expr) in C.VAR_TYPES and C.handle(expr) in self.values:
            expr = self.values[C.handle(expr)]
        return expr

    def pattern(self, expr: Any) -> DFPattern:
        key = C.handle(expr)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._make(expr)
        return found

    def _make(self, expr: Any) -> DFPattern:
        if type(expr) in C.VAR_TYPES:
            key = C.handle(expr)
            if key in self.params:
                return self.roles[self.params[key]]
            if key in self.values:
                return self.pattern(self.values[key])
            raise PatternError(f"{self.rule}: written reads {C.var_name(expr)!r}, which is "
                               f"none of its parameters (a Var from outside the function)")
        if C.is_tensor_constant(expr):
            return self._constant(expr)
        if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):  # a prim value
            return self._prim(expr)
        if isinstance(expr, relax.ShapeExpr):
            return wildcard()
        if isinstance(expr, relax.Tuple):
            return is_tuple([self.pattern(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return is_tuple_get_item(self.pattern(expr.tuple_value), int(expr.index))
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            return self._call(expr)
        raise PatternError(f"{self.rule}: written computes a {type(expr).__name__} "
                           f"({str(expr)[:60]!r}), which a by-example rule cannot match; "
                           f"write the rule as a class")

    def _constant(self, expr: Any) -> DFPattern:
        value = C.const_to_numpy(expr)
        name = self.named.get(C.handle(expr))
        anonymous = f"c{len(self.constants)}"
        if name is None and value.size == 1 and value.dtype.kind in "fiu" and (
                anonymous not in self.exact):
            self.numbers.append(float(value.reshape(()).item()))
            return is_scalar(float(value.reshape(()).item()))
        role = name or f"c{len(self.constants)}"
        self.constants[role] = value
        return self.roles.setdefault(role, is_constant())

    def _prim(self, value: Any) -> DFPattern:
        number = float(value.value)
        if isinstance(value, tvm.tirx.FloatImm):
            self.numbers.append(number)
        return is_scalar(number)

    def _call(self, call: relax.Call) -> DFPattern:
        name = _short(call.op.name)
        self.ops.append(name)
        kind = op_kind(call.op)
        if kind is None or kind > K_BROADCAST:
            self.ranked = True
        if name == "multiply" and self.associative:
            factors = self._factors(call)
            if len(factors) > 2:
                self.grouped = True
                self.swapped.setdefault("multiply")
                return products(*[self.pattern(f) for f in factors])
        args = [self.pattern(a) for a in call.args]
        if name == "power" and isinstance(args[1], ScalarPattern):
            # An exponent one ulp off an integer is NaN wherever the base is negative.
            args[1] = is_scalar(args[1].value, rtol=0.0)
            self.exact_exponent = True
        pattern: DFPattern = is_op(call.op.name)(*args)
        if name in ALWAYS_COMMUTATIVE and len(args) == 2:
            self.swapped.setdefault(name)
        elif name in self.commutative and len(args) == 2:
            self.swapped.setdefault(name)
            pattern = pattern | is_op(call.op.name)(args[1], args[0])
        attrs = _attrs(call)
        if attrs:
            pattern = has_attr(attrs, pattern)
        return pattern

    def _factors(self, call: relax.Call) -> list[Any]:
        """The factors of a product chain, looking through products read only here."""
        out = []
        for arg in call.args:
            inner = self._look_through(arg)
            single_use = type(arg) in C.VAR_TYPES and self.uses[C.handle(arg)] <= 1
            if (single_use and C.op_name(inner) == "relax.multiply"
                    and C.handle(arg) not in self.params):
                out.extend(self._factors(inner))
            else:
                out.append(arg)
        return out


def _short(name: str) -> str:
    return name[len("relax."):] if name.startswith("relax.") else name


def _attrs(call: relax.Call) -> dict[str, Any]:
    attrs = call.attrs
    if attrs is None:
        return {}
    return {f: getattr(attrs, f) for f in C.attr_field_names(attrs)}
