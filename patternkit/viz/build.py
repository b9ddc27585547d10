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
* constants and literals are folded into their consumer's label (``constants="fold"``)
  or drawn as nodes (``constants="node"``).

The IR is only read, never modified.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm_ffi import _ffi_api as _ffi_container

from ..ir.compat import type_of

Call, Function, GlobalVar, Op, Var = relax.Call, relax.Function, tvm.ir.GlobalVar, tvm.ir.Op, relax.Var
from ..ir.kinds import cluster_kind
from .labels import call_attributes, compact_type, key_attributes, literal_text, short_op_name
from .model import Cluster, Edge, GraphModel, Node
from .options import VizError, VizOptions

__all__ = ["build_model"]

logger = logging.getLogger(__name__)

_DPS_OPS = {"relax.call_tir", "relax.call_tir_inplace", "relax.call_dps_packed", "relax.call_tir_with_grad"}


_KIND: dict[type, str] = {}


def _kind(obj: Any) -> str:
    """What ``obj`` is, cached per Python type (``isinstance`` on FFI classes is slow)."""
    t = type(obj)
    k = _KIND.get(t)
    if k is None:
        if isinstance(obj, relax.MatchCast):
            k = "matchcast"
        elif isinstance(obj, Var):
            k = "var"
        elif isinstance(obj, GlobalVar):
            k = "gvar"
        elif isinstance(obj, Op):
            k = "op"
        elif isinstance(obj, Call):
            k = "call"
        elif isinstance(obj, relax.Tuple):
            k = "tuple"
        elif isinstance(obj, relax.TupleGetItem):
            k = "getitem"
        elif isinstance(obj, Function):
            k = "function"
        elif isinstance(obj, tvm.ir.GenericConst):
            k = "const"
        elif isinstance(obj, relax.If):
            k = "if"
        else:
            k = "other"
        _KIND[t] = k
    return k


_ARRAY_GET = _ffi_container.ArrayGetItem
_ARRAY_SIZE = _ffi_container.ArraySize


def _items(arr: Any) -> list:
    """Elements of an FFI Array without the per-element Python overhead of iteration."""
    if type(arr) is tvm_ffi.Array:
        return [_ARRAY_GET(arr, i) for i in range(_ARRAY_SIZE(arr))]
    return list(arr)


def _h(obj: Any) -> int:
    """The C handle of an IR object: a dict key without the slow FFI ``__eq__``."""
    return obj.__chandle__()


class _Folded(str):
    """A literal folded into its consumer's label."""


class _Bundle(list):
    """The fields of a tuple: a bundle of references, never a node."""


class _Scope:
    __slots__ = ("vars", "parent")

    def __init__(self, parent: "_Scope | None" = None):
        self.vars: dict[Any, Any] = {}
        self.parent = parent

    def get(self, var: Any) -> Any:
        var = _h(var)
        scope = self
        while scope is not None:
            ref = scope.vars.get(var)  # keys are handles
            if ref is not None:
                return ref
            scope = scope.parent
        return None


class _Builder:
    def __init__(self, options: VizOptions, mod: tvm.IRModule | None):
        self.opt = options
        self.mod = mod
        self.model = GraphModel(options.title)
        self.used_ids: set[str] = set()
        self.cluster_count = 0
        self.inlined: set[str] = set()
        self.stack: list[Any] = []
        self.once_results: dict[str, Any] = {}
        self.op_cache: dict[Any, str] = {}
        self.fold = options.constants == "fold"

    # ------------------------------------------------------------ ids and nodes
    def _uid(self, base: str) -> str:
        if base not in self.used_ids:
            self.used_ids.add(base)
            return base
        k = 2
        while f"{base}~{k}" in self.used_ids:
            k += 1
        uid = f"{base}~{k}"
        self.used_ids.add(uid)
        return uid

    def _new_cluster(self, kind: str, name: str, label: str, parent: str | None, function: str, attrs: dict) -> str:
        self.cluster_count += 1
        cid = f"cluster_{self.cluster_count}"
        self.model.add_cluster(Cluster(cid, kind, name, label, parent, function, attrs))
        return cid

    def _node(self, base: str, kind: str, label: str, ty: Any, name: str, ctx: "_Ctx", op: str = "", attrs: dict | None = None) -> Node:
        attrs = attrs or {}
        node = Node(
            id=self._uid(base),
            kind=kind,
            label=label,
            type=compact_type(ty),
            name=name,
            function=ctx.function,
            cluster=ctx.cluster,
            op=op,
            attrs=attrs,
            key_attrs=key_attributes(attrs, self.opt.max_attrs) if attrs else [],
        )
        return self.model.add_node(node)

    def _index(self, obj: Any, node_id: str) -> None:
        self.model.index.setdefault(_h(obj), []).append(node_id)

    def _wire_one(self, node: Node, index: int, port: str, ref: Any) -> None:
        t = type(ref)
        if t is tuple:
            src, src_port = ref
            self.model.add_edge(Edge(src, node.id, index, src_port + port if src_port else port))
        elif t is _Folded:
            node.folded.append(f"[{index}{port}] {ref}")
        elif t is _Bundle:
            for j, field in enumerate(ref):
                self._wire_one(node, index, f"{port}.{j}", field)
        elif ref is not None:
            src, src_port = ref
            self.model.add_edge(Edge(src, node.id, index, src_port + port if src_port else port))

    # ------------------------------------------------------------ entry points
    def build_module(self, mod: tvm.IRModule) -> GraphModel:
        funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, Function)}
        if not funcs:
            self.model.messages.append("the module holds no Relax function")
            return self.model
        if self.opt.functions is not None:
            missing = [f for f in self.opt.functions if f not in funcs]
            if missing:
                raise VizError(
                    f"functions={list(self.opt.functions)} names {missing}, which the module "
                    f"does not hold; Relax functions present: {sorted(funcs)}"
                )
            order = list(self.opt.functions)
        else:
            def rank(name: str) -> tuple:
                f = funcs[name]
                public = f.attrs is not None and "global_symbol" in f.attrs
                return (name != "main", not public, name)

            order = sorted(funcs, key=rank)
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
                self._drop_functions(late)
            roots = [r for r in roots if r not in late]
        self.model.functions = roots
        logger.debug("viz: %d root function(s), %d nodes", len(roots), len(self.model.nodes))
        if len(roots) > 1:
            self._wrap_roots(roots)
        return self.model

    def build_function(self, func: Function, name: str) -> GraphModel:
        self.model.functions = [name]
        self._root_function(name, func)
        return self.model

    def build_expr(self, expr: Any) -> GraphModel:
        self.model.functions = ["expr"]
        ctx = _Ctx("expr", None, "expr", _Scope())
        ref = self._resolve(expr, ctx, "expr")
        if isinstance(ref, _Folded) or ref is None:
            node = self._node("expr/value", "value", str(ref), type_of(expr), "", ctx)
            self._index(expr, node.id)
        return self.model

    # ------------------------------------------------------------ functions
    def _root_function(self, name: str, func: Function) -> Any:
        ctx = _Ctx(name, None, name, _Scope())
        for p in func.params:
            node = self._node(f"{name}/{p.name}", "param", p.name, type_of(p), p.name, ctx)
            ctx.scope.vars[_h(p)] = (node.id, "")
            self._index(p, node.id)
        self.stack.append(func)
        try:
            result = self._walk_body(func, ctx)
        finally:
            self.stack.pop()
        out = self._node(f"{name}/return", "output", "return", getattr(func, "ret_ty", None), "", ctx, op=name)
        self._wire_one(out, 0, "", result)
        return result

    def _drop_functions(self, names: set[str]) -> None:
        m = self.model
        gone = {k for k, n in m.nodes.items() if n.function in names and n.cluster is None
                or n.function in names and m.clusters[n.cluster].function in names}
        m.nodes = {k: n for k, n in m.nodes.items() if k not in gone}
        m.edges = [e for e in m.edges if e.src not in gone and e.dst not in gone]
        m.index = {h: [i for i in ids if i not in gone] for h, ids in m.index.items()}
        m.drop_empty_clusters()

    def _wrap_roots(self, roots: list[str]) -> None:
        top = [c for c in self.model.clusters.values() if c.parent is None]
        wrappers = {r: self._new_cluster("function", r, f"function {r}", None, r, {}) for r in roots}
        for c in top:
            if c.function in wrappers:
                c.parent = wrappers[c.function]
        for n in self.model.nodes.values():
            if n.cluster is None and n.function in wrappers:
                n.cluster = wrappers[n.function]

    def _walk_body(self, func: Function, ctx: "_Ctx") -> Any:
        body = func.body
        if isinstance(body, relax.SeqExpr):
            for block in body.blocks:
                for binding in _items(block.bindings):
                    self._binding(binding, ctx)
            return self._resolve(body.body, ctx, f"{ctx.prefix}/ret")
        return self._resolve(body, ctx, f"{ctx.prefix}/ret")

    def _binding(self, binding: Any, ctx: "_Ctx") -> None:
        var = binding.var
        value = binding.value
        name = var.name
        base = f"{ctx.prefix}/{name}"
        vk = _kind(value)
        if _kind(binding) == "matchcast":
            node = self._node(base, "op", "match_cast", type_of(var), name, ctx, op="relax.match_cast")
            self._wire_one(node, 0, "", self._resolve(value, ctx, base))
            ref: Any = (node.id, "")
            self._index(value, node.id)
        elif vk == "function":
            ctx.local_funcs[_h(var)] = value
            return
        elif vk == "call":
            ref = self._call(value, ctx, base, name, var)
        else:
            ref = self._resolve(value, ctx, base, bound_name=name, bound_var=var)
        ctx.scope.vars[_h(var)] = ref
        if type(ref) is tuple:
            self._index(var, ref[0])

    # ------------------------------------------------------------ expressions
    def _resolve(self, expr: Any, ctx: "_Ctx", owner: str, bound_name: str = "", bound_var: Any = None) -> Any:
        """Reference (node id, port) / bundle / folded literal for ``expr``."""
        k = _kind(expr)
        if k == "var":
            ref = ctx.scope.get(expr)
            if ref is None:
                if ctx.find_local(expr) is not None:
                    return _Folded("fn " + expr.name)
                # A free variable (bare expressions): draw it as a parameter once.
                node = self._node(f"{ctx.function}/{expr.name}", "param", expr.name, type_of(expr), expr.name, ctx.root())
                ref = (node.id, "")
                ctx.root().scope.vars[_h(expr)] = ref
                self._index(expr, node.id)
            return ref
        if k == "call":
            return self._call(expr, ctx, self._anon(owner), bound_name, bound_var)
        if k == "tuple":
            return _Bundle(self._resolve(f, ctx, f"{owner}.{i}") for i, f in enumerate(_items(expr.fields)))
        if k == "getitem":
            inner = self._resolve(expr.tuple_value, ctx, owner)
            idx = int(expr.index)
            if isinstance(inner, _Bundle):
                return inner[idx] if 0 <= idx < len(inner) else None
            if isinstance(inner, tuple):
                return (inner[0], f"{inner[1]}[{idx}]")
            return inner
        if k == "const" and not self.fold:
            node = self._node(self._anon(owner) if not bound_name else owner, "const", "const", type_of(expr), bound_name, ctx)
            node.attrs = {"value": literal_text(expr)}
            self._index(expr, node.id)
            return (node.id, "")
        if bound_name:
            # ``c = R.const(...)``, ``s = R.shape(...)``, an If, ...: a node of its own.
            label = literal_text(expr) if not isinstance(expr, relax.If) else "if"
            node = self._node(owner, "value" if not isinstance(expr, relax.If) else "op", label, type_of(bound_var), bound_name, ctx, op=type(expr).__name__)
            if isinstance(expr, relax.If):
                self._wire_one(node, 0, "", self._resolve(expr.cond, ctx, owner))
            self._index(expr, node.id)
            return (node.id, "")
        if isinstance(expr, relax.If):
            node = self._node(self._anon(owner), "op", "if", type_of(expr), "", ctx, op="If")
            self._wire_one(node, 0, "", self._resolve(expr.cond, ctx, owner))
            return (node.id, "")
        return _Folded(literal_text(expr))

    def _anon(self, owner: str) -> str:
        return f"{owner}/%"

    def _op_name(self, op: Any) -> str:
        name = self.op_cache.get(op)
        if name is None:
            name = op.name
            self.op_cache[op] = name
        return name

    def _call(self, call: Any, ctx: "_Ctx", base: str, name: str, var: Any) -> Any:
        op = call.op
        ty = type_of(var) if var is not None else type_of(call)
        ok = _kind(op)
        if ok == "op":
            full = self._op_name(op)
            args = _items(call.args)
            label = short_op_name(full, self.opt.op_names)
            attrs = call_attributes(call)
            if full in _DPS_OPS and args:
                callee = args[0]
                callee_name = callee.name_hint if isinstance(callee, GlobalVar) else literal_text(callee)
                label = f"{short_op_name(full, self.opt.op_names)} {callee_name}"
                rest = args[1:]
                args = _items(rest[0].fields) if rest and isinstance(rest[0], relax.Tuple) else list(rest)
                attrs = {}
            node = self._node(base, "op", label, ty, name, ctx, op=full, attrs=attrs)
        elif ok == "gvar":
            callee = self.mod[op] if self.mod is not None and op in self.mod.functions else None
            if isinstance(callee, Function):
                if self.opt.calls == "inline" and not any(callee.same_as(f) for f in self.stack):
                    self.inlined.add(op.name_hint)
                    return self._inline(callee, op.name_hint, call, ctx, base, var)
                node = self._node(base, "call", f"call {op.name_hint}", ty, name, ctx, op=op.name_hint)
                if self.opt.calls == "once" and not any(callee.same_as(f) for f in self.stack):
                    self._draw_once(op.name_hint, callee, node)
            else:
                node = self._node(base, "call", f"call {op.name_hint}", ty, name, ctx, op=op.name_hint)
            args = _items(call.args)
        elif ok == "var" and ctx.find_local(op) is not None:
            return self._inline(ctx.find_local(op), op.name, call, ctx, base, var)
        else:
            label = literal_text(op) if not isinstance(op, Var) else f"call {op.name}"
            node = self._node(base, "call", label, ty, name, ctx, op=label)
            args = _items(call.args)
            if isinstance(op, Var):
                self._wire_one(node, len(args), "", ctx.scope.get(op))
        for i, a in enumerate(args):
            self._wire_one(node, i, "", self._resolve(a, ctx, node.id))
        self._index(call, node.id)
        return (node.id, "")

    def _inline(self, callee: Function, callee_name: str, call: Any, ctx: "_Ctx", base: str, var: Any) -> Any:
        kind, cname = cluster_kind(callee)
        if not cname:
            cname = callee_name
        attrs = {str(k): str(callee.attrs[k]) for k in callee.attrs.keys()} if callee.attrs is not None else {}
        label = f"{kind}: {cname}" if kind != "function" else f"call {callee_name}"
        if kind == "composite" and "PartitionedFromPattern" in attrs:
            label += f"\n{attrs['PartitionedFromPattern']}"  # which optional parts matched
        elif kind in ("composite", "codegen", "partition") and callee_name != cname:
            label += f"\n{callee_name}"
        cid = self._new_cluster(kind, cname, label, ctx.cluster, ctx.function, attrs)
        self.model.clusters[cid].attrs.setdefault("function", callee_name)
        args = [self._resolve(a, ctx, base) for a in call.args]
        inner = _Ctx(ctx.function, cid, self._uid(base), _Scope(ctx.scope), parent=ctx)
        for p, ref in zip(callee.params, args):
            inner.scope.vars[_h(p)] = ref
        self.stack.append(callee)
        try:
            result = self._walk_body(callee, inner)
        finally:
            self.stack.pop()
        if isinstance(result, tuple):
            self._index(call, result[0])
        return result

    def _draw_once(self, name: str, callee: Function, call_node: Node) -> None:
        if name not in self.once_results:
            kind, cname = cluster_kind(callee)
            attrs = {str(k): str(callee.attrs[k]) for k in callee.attrs.keys()} if callee.attrs is not None else {}
            attrs.setdefault("function", name)
            label = f"{kind}: {cname or name}"
            cid = self._new_cluster(kind, cname or name, label, None, name, attrs)
            ctx = _Ctx(name, cid, name, _Scope())
            for p in callee.params:
                node = self._node(f"{name}/{p.name}", "param", p.name, type_of(p), p.name, ctx)
                ctx.scope.vars[_h(p)] = (node.id, "")
            self.stack.append(callee)
            try:
                self.once_results[name] = self._walk_body(callee, ctx)
            finally:
                self.stack.pop()
        result = self.once_results[name]
        refs = result if isinstance(result, _Bundle) else [result]
        for i, ref in enumerate(refs):
            if isinstance(ref, tuple):
                self.model.add_edge(Edge(ref[0], call_node.id, i, ref[1], kind="calls"))


class _Ctx:
    __slots__ = ("function", "cluster", "prefix", "scope", "local_funcs", "parent")

    def __init__(self, function: str, cluster: str | None, prefix: str, scope: _Scope, parent: "_Ctx | None" = None):
        self.function = function
        self.cluster = cluster
        self.prefix = prefix
        self.scope = scope
        self.local_funcs: dict[Any, Function] = {}
        self.parent = parent

    def find_local(self, var: Any) -> Function | None:
        var = _h(var)
        ctx: _Ctx | None = self
        while ctx is not None:
            f = ctx.local_funcs.get(var)
            if f is not None:
                return f
            ctx = ctx.parent
        return None

    def root(self) -> "_Ctx":
        ctx = self
        while ctx.parent is not None:
            ctx = ctx.parent
        return ctx


def build_model(obj: Any, options: VizOptions) -> GraphModel:
    """Walk ``obj`` (IRModule, relax.Function or bare Relax expression) into a model.

    Raises
    ------
    VizError
        When ``obj`` is not Relax IR.
    """
    if isinstance(obj, tvm.IRModule):
        model = _Builder(options, obj).build_module(obj)
        model.keepalive.append(obj)
        return model
    if isinstance(obj, Function):
        name = "main"
        if obj.attrs is not None and "global_symbol" in obj.attrs:
            name = str(obj.attrs["global_symbol"])
        model = _Builder(options, None).build_function(obj, name)
        model.keepalive.append(obj)
        return model
    if isinstance(obj, tvm.tirx.PrimFunc):
        raise VizError(
            "viz_expr draws Relax IR; found a TIR PrimFunc. Pass the IRModule or the Relax "
            "function that calls it instead"
        )
    if isinstance(obj, relax.Expr) and not isinstance(obj, (GlobalVar, Op)):
        model = _Builder(options, None).build_expr(obj)
        model.keepalive.append(obj)
        return model
    raise VizError(
        "viz_expr expects a tvm.IRModule, a relax.Function or a Relax expression; found "
        f"{type(obj).__module__}.{type(obj).__qualname__}"
    )
