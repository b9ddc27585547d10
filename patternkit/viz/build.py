"""Build a :class:`~patternkit.viz.model.GraphModel` from Relax IR in one walk.

What is drawn
-------------
* every binding of every drawn function becomes one node, in binding order;
* parameters of top-level functions are ellipses; a callee's parameters are not drawn,
  its body is wired straight to the caller's arguments;
* calls to functions (global ``Primitive`` / ``Composite`` / ``Codegen`` functions and
  local functions such as patternkit ``partition`` output) are drawn inline at the call
  site inside a cluster, or, with ``calls="once"``, each global callee once;
* tuples and tuple-get-item make no nodes: a tuple is a bundle of edges and ``t[0]``
  becomes the port ``[0]`` on the edge leaving the producer;
* an ``If`` is one node reading its condition and the result of each branch; each
  branch's bindings are drawn inside a ``branch`` cluster ("z: then", "z: else");
* constants and literals are folded into their consumer's label (``constants="fold"``)
  or drawn as nodes (``constants="node"``).

The IR is only read, never modified.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm import relax

from ..ir.compat import array_items, handle, op_info, type_of
from ..ir.kinds import cluster_kind
from ..ir.walk import CALL, CONSTANT, FUNCTION, GET_ITEM, GLOBAL_VAR, OP, TUPLE, VAR, expr_kind
from .drawing import Bundle, Drawing, Folded
from .labels import call_attributes, literal_text, short_op_name
from .model import GraphModel, Node
from .options import VizError, VizOptions

__all__ = ["build_model"]

logger = logging.getLogger(__name__)

_DPS_OPS = {"relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed",
            "relax.call_tir_with_grad"}


class _Scope:
    """Var handle -> reference, chained to the scope of the enclosing call site."""

    __slots__ = ("vars", "parent")

    def __init__(self, parent: "_Scope | None" = None):
        self.vars: dict[int, Any] = {}
        self.parent = parent

    def get(self, var: Any) -> Any:
        key = handle(var)
        scope: _Scope | None = self
        while scope is not None:
            ref = scope.vars.get(key)
            if ref is not None:
                return ref
            scope = scope.parent
        return None


class _Ctx:
    """Where the walk is: the top-level function, the cluster, the id prefix, the scope."""

    __slots__ = ("function", "cluster", "prefix", "scope", "local_funcs", "parent")

    def __init__(self, function: str, cluster: str | None, prefix: str, scope: _Scope,
                 parent: "_Ctx | None" = None):
        self.function = function
        self.cluster = cluster
        self.prefix = prefix
        self.scope = scope
        self.local_funcs: dict[int, relax.Function] = {}
        self.parent = parent

    def find_local(self, var: Any) -> relax.Function | None:
        key = handle(var)
        ctx: _Ctx | None = self
        while ctx is not None:
            f = ctx.local_funcs.get(key)
            if f is not None:
                return f
            ctx = ctx.parent
        return None

    def root(self) -> "_Ctx":
        ctx = self
        while ctx.parent is not None:
            ctx = ctx.parent
        return ctx


def _function_attrs(func: relax.Function) -> dict[str, str]:
    return {str(k): str(func.attrs[k]) for k in func.attrs.keys()} if func.attrs is not None else {}


class _Walker:
    """One walk over the IR, drawing into a :class:`~patternkit.viz.drawing.Drawing`."""

    def __init__(self, options: VizOptions, mod: tvm.IRModule | None):
        self.opt = options
        self.mod = mod
        self.draw = Drawing(options)
        self.model = self.draw.model
        self.inlined: set[str] = set()  # global callees drawn inside a caller
        self.stack: list[Any] = []  # functions being walked, to stop at recursion
        self.once_results: dict[str, Any] = {}  # calls="once": callee -> its result ref
        self.fold = options.constants == "fold"

    # ------------------------------------------------------------ entry points
    def build_module(self, mod: tvm.IRModule) -> GraphModel:
        funcs = {gv.name_hint: f for gv, f in mod.functions.items()
                 if isinstance(f, relax.Function)}
        if not funcs:
            self.model.messages.append("the module holds no Relax function")
            return self.model
        order = self._root_order(funcs)
        roots = []
        for name in order:
            drawn_inside = name in self.inlined or name in self.once_results
            if drawn_inside and self.opt.functions is None:
                continue
            roots.append(name)
            self._root_function(name, funcs[name])
        # A function drawn before its caller was reached is not a root after all: its
        # own drawing goes, the one inside its caller stays.
        if self.opt.functions is None:
            late = {r for r in roots if r in self.inlined or r in self.once_results}
            if late:
                self.draw.drop_functions(late)
            roots = [r for r in roots if r not in late]
        self.model.functions = roots
        logger.debug("viz: %d root function(s), %d nodes", len(roots), len(self.model.nodes))
        if len(roots) > 1:
            self.draw.wrap_roots(roots)
        return self.model

    def _root_order(self, funcs: dict) -> list[str]:
        """The functions asked for, or ``main`` first, then public, then private ones."""
        if self.opt.functions is not None:
            missing = [f for f in self.opt.functions if f not in funcs]
            if missing:
                raise VizError(
                    f"functions={list(self.opt.functions)} names {missing}, which the module "
                    f"does not hold; Relax functions present: {sorted(funcs)}"
                )
            return list(self.opt.functions)

        def rank(name: str) -> tuple:
            f = funcs[name]
            public = f.attrs is not None and "global_symbol" in f.attrs
            return (name != "main", not public, name)

        return sorted(funcs, key=rank)

    def build_function(self, func: relax.Function, name: str) -> GraphModel:
        self.model.functions = [name]
        self._root_function(name, func)
        return self.model

    def build_expr(self, expr: Any) -> GraphModel:
        self.model.functions = ["expr"]
        ctx = _Ctx("expr", None, "expr", _Scope())
        ref = self._resolve(expr, ctx, "expr")
        if isinstance(ref, Folded) or ref is None:
            node = self.draw.node("expr/value", "value", str(ref), type_of(expr), "", ctx)
            self.draw.index(expr, node.id)
        return self.model

    # ------------------------------------------------------------ functions
    def _root_function(self, name: str, func: relax.Function) -> Any:
        ctx = _Ctx(name, None, name, _Scope())
        self._draw_params(func, ctx, index=True)
        self.stack.append(func)
        try:
            result = self._walk_body(func, ctx)
        finally:
            self.stack.pop()
        out = self.draw.node(f"{name}/return", "output", "return", getattr(func, "ret_ty", None),
                             "", ctx, op=name)
        self.draw.wire(out, 0, "", result)
        return result

    def _draw_params(self, func: relax.Function, ctx: _Ctx, index: bool) -> None:
        for p in func.params:
            node = self.draw.node(f"{ctx.function}/{p.name}", "param", p.name, type_of(p), p.name,
                                  ctx)
            ctx.scope.vars[handle(p)] = (node.id, "")
            if index:
                self.draw.index(p, node.id)

    def _walk_body(self, func: relax.Function, ctx: _Ctx) -> Any:
        return self._walk_seq(func.body, ctx)

    def _walk_seq(self, body: Any, ctx: _Ctx) -> Any:
        """Draw the bindings of a ``SeqExpr`` (a function's or an If branch's body); the
        reference of its result.
        """
        if isinstance(body, relax.SeqExpr):
            for block in array_items(body.blocks):
                for binding in array_items(block.bindings):
                    self._binding(binding, ctx)
            return self._resolve(body.body, ctx, f"{ctx.prefix}/ret")
        return self._resolve(body, ctx, f"{ctx.prefix}/ret")

    def _binding(self, binding: Any, ctx: _Ctx) -> None:
        var = binding.var
        value = binding.value
        name = var.name
        base = f"{ctx.prefix}/{name}"
        kind = expr_kind(value)
        if type(binding) is relax.MatchCast:
            node = self.draw.node(base, "op", "match_cast", type_of(var), name, ctx,
                                  op="relax.match_cast")
            self.draw.wire(node, 0, "", self._resolve(value, ctx, base))
            ref: Any = (node.id, "")
            self.draw.index(value, node.id)
        elif kind is FUNCTION:
            ctx.local_funcs[handle(var)] = value
            return
        elif kind is CALL:
            ref = self._call(value, ctx, base, name, var)
        else:
            ref = self._resolve(value, ctx, base, bound_name=name, bound_var=var)
        ctx.scope.vars[handle(var)] = ref
        if type(ref) is tuple:
            self.draw.index(var, ref[0])

    # ------------------------------------------------------------ expressions
    def _resolve(self, expr: Any, ctx: _Ctx, owner: str, bound_name: str = "",
                 bound_var: Any = None) -> Any:
        """Reference (node id, port) / bundle / folded literal for ``expr``."""
        kind = expr_kind(expr)
        if kind is VAR:
            return self._var(expr, ctx)
        if kind is CALL:
            return self._call(expr, ctx, _anon(owner), bound_name, bound_var)
        if kind is TUPLE:
            return Bundle(self._resolve(f, ctx, f"{owner}.{i}")
                          for i, f in enumerate(array_items(expr.fields)))
        if kind is GET_ITEM:
            inner = self._resolve(expr.tuple_value, ctx, owner)
            idx = int(expr.index)
            if isinstance(inner, Bundle):
                return inner[idx] if 0 <= idx < len(inner) else None
            if isinstance(inner, tuple):
                return (inner[0], f"{inner[1]}[{idx}]")
            return inner
        if kind is CONSTANT and not self.fold:
            base = _anon(owner) if not bound_name else owner
            node = self.draw.node(base, "const", "const", type_of(expr), bound_name, ctx)
            node.attrs = {"value": literal_text(expr)}
            self.draw.index(expr, node.id)
            return (node.id, "")
        if isinstance(expr, relax.If):
            return self._if(expr, ctx, owner if bound_name else _anon(owner), bound_name,
                            bound_var)
        if bound_name:
            # ``c = R.const(...)``, ``s = R.shape(...)``, ...: a node of its own.
            node = self.draw.node(owner, "value", literal_text(expr), type_of(bound_var),
                                  bound_name, ctx, op=type(expr).__name__)
            self.draw.index(expr, node.id)
            return (node.id, "")
        return Folded(literal_text(expr))

    def _if(self, expr: relax.If, ctx: _Ctx, base: str, name: str, var: Any) -> Any:
        """An ``If``: one node reading the condition (input 0) and each branch's result
        (inputs 1 and 2); each branch's bindings are drawn in a cluster of their own.
        """
        ty = type_of(var) if var is not None else type_of(expr)
        node = self.draw.node(base, "op", "if", ty, name, ctx, op="If")
        self.draw.wire(node, 0, "", self._resolve(expr.cond, ctx, base))
        for index, (label, branch) in enumerate((("then", expr.true_branch),
                                                 ("else", expr.false_branch)), start=1):
            cid = self.draw.cluster("branch", label, f"{name or 'if'}: {label}", ctx.cluster,
                                    ctx.function, {})
            inner = _Ctx(ctx.function, cid, self.draw.ids.uid(f"{base}.{label}"),
                         _Scope(ctx.scope), parent=ctx)
            self.draw.wire(node, index, "", self._walk_seq(branch, inner))
        self.draw.index(expr, node.id)
        return (node.id, "")

    def _var(self, var: Any, ctx: _Ctx) -> Any:
        ref = ctx.scope.get(var)
        if ref is None:
            if ctx.find_local(var) is not None:
                return Folded("fn " + var.name)
            # A free variable (bare expressions): draw it as a parameter once.
            root = ctx.root()
            node = self.draw.node(f"{ctx.function}/{var.name}", "param", var.name, type_of(var),
                                  var.name, root)
            ref = (node.id, "")
            root.scope.vars[handle(var)] = ref
            self.draw.index(var, node.id)
        return ref

    def _call(self, call: Any, ctx: _Ctx, base: str, name: str, var: Any) -> Any:
        op = call.op
        ty = type_of(var) if var is not None else type_of(call)
        op_kind = expr_kind(op)
        if op_kind is OP:
            node, args = self._op_call(call, op, ty, ctx, base, name)
        elif op_kind is GLOBAL_VAR:
            callee = self.mod[op] if self.mod is not None and op in self.mod.functions else None
            if (isinstance(callee, relax.Function) and self.opt.calls == "inline"
                    and not any(callee.same_as(f) for f in self.stack)):
                self.inlined.add(op.name_hint)
                return self._inline(callee, op.name_hint, call, ctx, base)
            node = self.draw.node(base, "call", f"call {op.name_hint}", ty, name, ctx,
                                  op=op.name_hint)
            if (isinstance(callee, relax.Function) and self.opt.calls == "once"
                    and not any(callee.same_as(f) for f in self.stack)):
                self._draw_once(op.name_hint, callee, node)
            args = array_items(call.args)
        elif op_kind is VAR and ctx.find_local(op) is not None:
            return self._inline(ctx.find_local(op), op.name, call, ctx, base)
        else:
            label = f"call {op.name}" if op_kind is VAR else literal_text(op)
            node = self.draw.node(base, "call", label, ty, name, ctx, op=label)
            args = array_items(call.args)
            if op_kind is VAR:
                self.draw.wire(node, len(args), "", ctx.scope.get(op))
        for i, a in enumerate(args):
            self.draw.wire(node, i, "", self._resolve(a, ctx, node.id))
        self.draw.index(call, node.id)
        return (node.id, "")

    def _op_call(self, call: Any, op: Any, ty: Any, ctx: _Ctx, base: str,
                 name: str) -> tuple[Node, list]:
        """The node of an operator call, and the arguments to wire into it.

        ``call_tir`` and friends are drawn as the callee they run, wired to its tensor
        arguments (the tuple is not a value of its own).
        """
        full = op_info(op)[0]
        args = array_items(call.args)
        label = short_op_name(full, self.opt.op_names)
        attrs = call_attributes(call)
        if full in _DPS_OPS and args:
            callee = args[0]
            callee_name = (callee.name_hint if isinstance(callee, tvm.ir.GlobalVar)
                           else literal_text(callee))
            label = f"{label} {callee_name}"
            rest = args[1:]
            args = (array_items(rest[0].fields) if rest and isinstance(rest[0], relax.Tuple)
                    else list(rest))
            attrs = {}
        return self.draw.node(base, "op", label, ty, name, ctx, op=full, attrs=attrs), args

    def _inline(self, callee: relax.Function, callee_name: str, call: Any, ctx: _Ctx,
                base: str) -> Any:
        """Draw ``callee``'s body in a cluster at the call site, wired to the arguments."""
        kind, cname = cluster_kind(callee)
        if not cname:
            cname = callee_name
        attrs = _function_attrs(callee)
        label = f"{kind}: {cname}" if kind != "function" else f"call {callee_name}"
        if kind == "composite" and "PartitionedFromPattern" in attrs:
            label += f"\n{attrs['PartitionedFromPattern']}"  # which optional parts matched
        elif kind in ("composite", "codegen", "partition") and callee_name != cname:
            label += f"\n{callee_name}"
        cid = self.draw.cluster(kind, cname, label, ctx.cluster, ctx.function, attrs)
        self.model.clusters[cid].attrs.setdefault("function", callee_name)
        args = [self._resolve(a, ctx, base) for a in array_items(call.args)]
        inner = _Ctx(ctx.function, cid, self.draw.ids.uid(base), _Scope(ctx.scope), parent=ctx)
        for p, ref in zip(callee.params, args):
            inner.scope.vars[handle(p)] = ref
        self.stack.append(callee)
        try:
            result = self._walk_body(callee, inner)
        finally:
            self.stack.pop()
        if isinstance(result, tuple):
            self.draw.index(call, result[0])
        return result

    def _draw_once(self, name: str, callee: relax.Function, call_node: Node) -> None:
        """``calls="once"``: draw ``callee`` on first call, then link every call to it."""
        if name not in self.once_results:
            kind, cname = cluster_kind(callee)
            attrs = _function_attrs(callee)
            attrs.setdefault("function", name)
            label = f"{kind}: {cname or name}"
            cid = self.draw.cluster(kind, cname or name, label, None, name, attrs)
            ctx = _Ctx(name, cid, name, _Scope())
            self._draw_params(callee, ctx, index=False)
            self.stack.append(callee)
            try:
                self.once_results[name] = self._walk_body(callee, ctx)
            finally:
                self.stack.pop()
        result = self.once_results[name]
        refs = result if isinstance(result, Bundle) else [result]
        for i, ref in enumerate(refs):
            self.draw.calls_edge(ref, call_node, i)


def _anon(owner: str) -> str:
    """The id base of a nested (unbound) expression inside ``owner``."""
    return f"{owner}/%"


def build_model(obj: Any, options: VizOptions) -> GraphModel:
    """Walk ``obj`` (IRModule, relax.Function or bare Relax expression) into a model.

    Raises
    ------
    VizError
        When ``obj`` is not Relax IR.
    """
    if isinstance(obj, tvm.IRModule):
        model = _Walker(options, obj).build_module(obj)
    elif isinstance(obj, relax.Function):
        name = "main"
        if obj.attrs is not None and "global_symbol" in obj.attrs:
            name = str(obj.attrs["global_symbol"])
        model = _Walker(options, None).build_function(obj, name)
    elif isinstance(obj, tvm.tirx.PrimFunc):
        raise VizError(
            "viz_expr draws Relax IR; found a TIR PrimFunc. Pass the IRModule or the Relax "
            "function that calls it instead"
        )
    elif isinstance(obj, relax.Expr) and not isinstance(obj, (tvm.ir.GlobalVar, tvm.ir.Op)):
        model = _Walker(options, None).build_expr(obj)
    else:
        raise VizError(
            "viz_expr expects a tvm.IRModule, a relax.Function or a Relax expression; found "
            f"{type(obj).__module__}.{type(obj).__qualname__}"
        )
    model.keepalive.append(obj)
    return model
