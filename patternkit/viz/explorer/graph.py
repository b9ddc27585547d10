"""A Relax module as one Model Explorer graph: its JSON, and where each binding went.

Model Explorer draws a graph of nodes, each with a ``namespace`` path (``main/layer03``)
that it folds into collapsible groups; that is what makes a graph of 10^4 nodes
readable.  :func:`module_graph` gives every binding of a Relax module a node and puts it
in the groups a reader of patternkit's results looks for:

* one group per function the module runs (``main``, any other public function);
* one group per repeated layer (:func:`patternkit.viz.repeats.find_repeat`), so a
  12-layer model opens as twelve folded layers;
* one group per codegen region (``PartitionGraph``'s external functions) and per
  composite (``MergeComposite``'s functions): the calls to them are drawn inline, the
  region's body inside the group, the group carrying the composite's pattern name and
  the compiler that takes it.

A node carries the op (``nn.conv2d``), the binding's name, the call's attributes and,
per output, its dtype and shape (Model Explorer's ``tensor_shape`` convention,
``float32[1,768]``).  Constants read by an op are nodes of their own; scalars and shapes
are attributes of the op that reads them.  Projections of a tuple (``bn[0]``) are edges
from the producer's output, not nodes.

The result is the JSON Model Explorer's ``graph_builder.Graph`` serialises to, built
as plain dicts (fast, and writable without the ``[explorer]`` extra), together with an
index from ``(function, binding name)`` and from each ``Var`` to node ids, which the
overlays (:mod:`.overlays`) use to put patternkit's results on the nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax

from ...ir import compat as C, kinds as K
from ..repeats import find_repeat

#: Attribute values longer than this are cut (a long padding list, a big index map).
MAX_ATTR_TEXT = 120
#: Group colours (Model Explorer's ``groupNodeConfigs``): CSS colours, light enough for
#: the dark group label to stay readable.
LAYER_COLOUR = "#eef3fb"
CODEGEN_COLOUR = "#e3f4e6"
COMPOSITE_COLOUR = "#fdf1d8"

_NAMESPACE_UNSAFE = re.compile(r"[/\s]+")


@dataclass
class ModuleGraph:
    """One module as a Model Explorer graph.

    Attributes
    ----------
    graph : dict
        The graph's JSON (``id``, ``nodes``, ``groupNodeAttributes``,
        ``groupNodeConfigs``), as ``graph_builder.Graph`` serialises it.
    by_name : dict
        ``(function, binding name) -> [node id]``: where each binding is drawn (a call
        to a region: the node computing the region's result).  A name bound twice in a
        function (rewrites may reuse one) lists both nodes.
    by_var : dict
        ``Var -> node id`` for every bound ``Var`` of the module.
    regions : dict
        Node id -> ``(composite pattern or None, compiler or None)`` for the nodes
        inside a composite or a codegen region.
    ops : set
        Node ids of the operator calls (what the offload report talks about).
    functions : list
        The top-level groups: one per function drawn (``main`` first).
    """

    graph: dict[str, Any]
    by_name: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    by_var: dict[Any, str] = field(default_factory=dict)
    regions: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    ops: set[str] = field(default_factory=set)
    functions: list[str] = field(default_factory=list)

    @property
    def node_count(self) -> int:
        """How many nodes the graph has."""
        return len(self.graph["nodes"])

    def namespaces(self) -> set[str]:
        """Every group path of the graph (``main``, ``main/layer01``, ...)."""
        out = set()
        for node in self.graph["nodes"]:
            parts = node["namespace"].split("/") if node["namespace"] else []
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out


#: A value's source in the graph: ``(node id, output index)``.
Source = tuple[str, int]


def _kv(key: str, value: Any) -> dict[str, str]:
    text = str(value)
    if len(text) > MAX_ATTR_TEXT:
        text = text[:MAX_ATTR_TEXT - 3] + "..."
    return {"key": key, "value": text}


def _safe(name: str) -> str:
    """A name usable as one step of a namespace path (no ``/``, no blanks)."""
    return _NAMESPACE_UNSAFE.sub("_", name) or "_"


def _dims(shape: Any) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _tensor_shapes(ty: Any) -> list[str]:
    """``["float32[1,768]"]`` per output of a value of type ``ty``."""
    if isinstance(ty, relax.TupleType):
        return [text for field_ty in ty.fields for text in _tensor_shapes(field_ty)]
    if isinstance(ty, relax.TensorType):
        dtype = C.dtype_of(ty) or "?"
        shape = C.static_shape(ty)
        return [dtype + (_dims(shape) if shape is not None else f"[rank {ty.ndim}]")]
    if isinstance(ty, relax.ShapeType):
        return ["shape"]
    return [type(ty).__name__] if ty is not None else []


def _call_attrs(call: Any) -> list[dict[str, str]]:
    attrs = call.attrs
    if attrs is None:
        return []
    out = []
    for name in C.attr_field_names(attrs):
        value = getattr(attrs, name)
        if C.is_tvm_object(value) and hasattr(value, "__len__") and not isinstance(value, str):
            value = "[" + ", ".join(str(item) for item in value) + "]"  # as TVMScript prints
        out.append(_kv(name, value))
    return out


class _Builder:
    """Walks a module once, appending nodes (see :func:`module_graph`)."""

    def __init__(self, mod: tvm.IRModule, graph_id: str, fold: bool):
        self.mod = mod
        self.fold = fold
        self.result = ModuleGraph({"id": graph_id, "nodes": []})
        self.nodes: list[dict[str, Any]] = self.result.graph["nodes"]
        self.group_attrs: dict[str, dict[str, str]] = {}
        self.group_configs: list[dict[str, Any]] = []
        self.used_namespaces: set[str] = set()

    # -- nodes ---------------------------------------------------------------------------
    def node(self, label: str, namespace: str, inputs: list[Source],
             attrs: list[dict[str, str]], shapes: list[str], name: str | None) -> str:
        node_id = str(len(self.nodes))
        outputs = []
        for i, text in enumerate(shapes):
            meta = [{"key": "tensor_shape", "value": text}]
            if name is not None:
                meta.append({"key": "tensor_name", "value": name if len(shapes) == 1
                             else f"{name}[{i}]"})
            outputs.append({"id": str(i), "attrs": meta})
        self.nodes.append({
            "id": node_id, "label": label, "namespace": namespace, "subgraphIds": [],
            "attrs": attrs,
            "incomingEdges": [{"sourceNodeId": src, "sourceNodeOutputId": str(out),
                               "targetNodeInputId": str(k)}
                              for k, (src, out) in enumerate(inputs)],
            "outputsMetadata": outputs, "inputsMetadata": []})
        return node_id

    def group(self, namespace: str, attrs: dict[str, str], colour: str) -> str:
        """Claim a unique group path under ``namespace``'s parent and describe it (and
        colour it, unless ``colour`` is empty).
        """
        unique, n = namespace, 1
        while unique in self.used_namespaces:
            n += 1
            unique = f"{namespace}#{n}"
        self.used_namespaces.add(unique)
        self.group_attrs[unique] = attrs
        if colour:  # else Model Explorer's own group colour
            self.group_configs.append({"namespaceRegex": "^" + re.escape(unique) + "$",
                                       "backgroundColor": colour})
        return unique

    # -- functions -----------------------------------------------------------------------
    def entry_function(self, name: str, func: relax.Function) -> None:
        namespace = self.group(_safe(name), {"function": name}, "")
        self.result.functions.append(namespace)
        env: dict[Any, Any] = {}
        for param in func.params:
            pname = C.var_name(param)
            node = self.node("input", namespace, [], [_kv("binding", pname),
                                                      _kv("function", name)],
                             _tensor_shapes(param.ty), pname)
            env[param] = (node, 0)
            self.index(name, param, node)
        result = self.body(name, func, namespace, env, region=(None, None), top=True)
        self.node("output", namespace, self.flatten(result), [_kv("function", name)], [], None)

    def body(self, fname: str, func: relax.Function, namespace: str, env: dict,
             region: tuple[str | None, str | None], top: bool = False) -> Any:
        """Nodes for ``func``'s bindings; returns the source(s) of its result."""
        seq = func.body
        if not isinstance(seq, relax.SeqExpr):
            return self.value_source(seq, fname, namespace, env, region)
        repeat = find_repeat(func, self.mod) if top and self.fold else None
        for b, block in enumerate(seq.blocks):
            for i, binding in enumerate(block.bindings):
                where = namespace
                if repeat is not None and b == repeat.block and \
                        repeat.start <= i < repeat.start + repeat.count * repeat.period:
                    where = self.layer(namespace, (i - repeat.start) // repeat.period,
                                       repeat.count, repeat.period)
                self.binding(fname, binding, where, env, region)
        return self.value_source(seq.body, fname, namespace, env, region)

    def layer(self, namespace: str, k: int, count: int, period: int) -> str:
        width = len(str(count))
        path = f"{namespace}/layer{k + 1:0{width}d}"
        if path not in self.group_attrs:
            self.used_namespaces.add(path)
            self.group_attrs[path] = {"repeated layer": f"{k + 1} of {count}",
                                      "bindings per layer": str(period)}
            if k == 0:
                self.group_configs.append({
                    "namespaceRegex": "^" + re.escape(namespace) + r"/layer\d+$",
                    "backgroundColor": LAYER_COLOUR})
        return path

    def index(self, fname: str, var: Any, node: str) -> None:
        self.result.by_name.setdefault((fname, C.var_name(var)), []).append(node)
        self.result.by_var[var] = node

    # -- bindings ------------------------------------------------------------------------
    def binding(self, fname: str, binding: Any, namespace: str, env: dict,
                region: tuple[str | None, str | None]) -> None:
        var, value = binding.var, binding.value
        name = C.var_name(var)
        if isinstance(value, relax.Function):  # a local function: drawn where it is called
            env[var] = value
            return
        if isinstance(value, (relax.Var, relax.TupleGetItem)) and \
                not isinstance(value, tvm.ir.GlobalVar):
            source = self.value_source(value, fname, namespace, env, region)
            env[var] = source
            if isinstance(source, tuple):
                self.index(fname, var, source[0])
            return
        if isinstance(value, relax.Tuple):
            fields = [self.value_source(f, fname, namespace, env, region) for f in value.fields]
            node = self.node("tuple", namespace, self.flatten(fields),
                             [_kv("binding", name), _kv("function", fname)],
                             _tensor_shapes(var.ty), name)
            env[var] = fields
            self.index(fname, var, node)
            self.note_region(node, region)
            return
        if isinstance(value, relax.Call):
            callee = self.region_callee(value.op, env)
            if callee is not None:
                result = self.inline(fname, name, callee, value, namespace, env, region)
                env[var] = result
                for src in self.flatten(result)[-1:]:
                    self.index(fname, var, src[0])
                return
        node = self.op_node(fname, name, value, namespace, env, var.ty, region)
        env[var] = (node, 0)
        self.index(fname, var, node)

    def op_node(self, fname: str, name: str, value: Any, namespace: str, env: dict,
                ty: Any, region: tuple[str | None, str | None]) -> str:
        attrs = [_kv("binding", name), _kv("function", fname)]
        inputs: list[Source] = []
        if isinstance(value, relax.Call):
            op = value.op
            op_name = C.op_name(value)
            if op_name is not None:
                label = op_name.removeprefix("relax.")
                attrs.insert(0, _kv("op", op_name))
            elif isinstance(op, tvm.ir.GlobalVar):
                label = f"call {op.name_hint}"
                attrs.insert(0, _kv("op", f"call {op.name_hint}"))
            else:
                label = "call"
                attrs.insert(0, _kv("op", "call"))
            args = list(value.args)
            if op_name in ("relax.call_tir", "relax.call_dps_packed", "relax.call_tir_inplace") \
                    and args:
                callee = args[0]
                attrs.append(_kv("callee", getattr(callee, "name_hint", None)
                                 or getattr(callee, "global_symbol", callee)))
                label = f"{label} {attrs[-1]['value']}"
                args = list(args[1].fields) if len(args) > 1 and \
                    isinstance(args[1], relax.Tuple) else args[1:]
            attrs.extend(_call_attrs(value))
            for k, arg in enumerate(args):
                source = self.arg_source(arg, fname, namespace, env, region)
                if source is None:
                    attrs.append(_kv(f"arg{k}", arg))
                else:
                    inputs.extend(self.flatten(source))
        else:
            label = type(value).__name__
            attrs.insert(0, _kv("op", label))
        node = self.node(label, namespace, inputs, attrs, _tensor_shapes(ty), name)
        self.result.ops.add(node)
        self.note_region(node, region)
        return node

    def note_region(self, node: str, region: tuple[str | None, str | None]) -> None:
        if region != (None, None):
            self.result.regions[node] = region

    def region_callee(self, op: Any, env: dict) -> tuple[str, relax.Function] | None:
        """``(name, function)`` when ``op`` calls a composite or codegen function."""
        if isinstance(op, tvm.ir.GlobalVar):
            func = self.mod.functions.get(op)
            if isinstance(func, relax.Function) and K.is_fused(func):
                return op.name_hint, func
            return None
        local = env.get(op)
        if isinstance(local, relax.Function):
            return C.var_name(op), local
        return None

    def inline(self, fname: str, name: str, callee: tuple[str, relax.Function], call: Any,
               namespace: str, env: dict, region: tuple[str | None, str | None]) -> Any:
        """The callee's body drawn in a group of its own, fed by the call's arguments."""
        gname, func = callee
        kind, label = K.cluster_kind(func)
        composite = K.attr(func, K.COMPOSITE)
        compiler = K.attr(func, K.CODEGEN) or K.attr(func, K.COMPILER) or region[1]
        if composite is not None:
            group_name, colour = str(composite), COMPOSITE_COLOUR
        else:
            group_name, colour = gname, CODEGEN_COLOUR if compiler is not None else ""
        attrs = {"kind": kind, "function": gname, "called as": name}
        if composite is not None:
            attrs["composite"] = str(composite)
        if compiler is not None:
            attrs["compiler"] = str(compiler)
        if kind == "partition":
            attrs["partitioned from"] = label
        inner = self.group(f"{namespace}/{_safe(group_name)}", attrs, colour)
        inner_env = dict(env)
        for param, arg in zip(func.params, call.args):
            source = self.arg_source(arg, fname, namespace, env, (None, None))
            if source is None:  # a constant or shape argument: drawn inside the region
                source = self.value_source(arg, fname, inner, env, (None, None))
            inner_env[param] = source
        outer = (str(composite) if composite is not None else None,
                 str(compiler) if compiler is not None else None)
        return self.body(fname, func, inner, inner_env, outer)

    # -- values --------------------------------------------------------------------------
    def arg_source(self, arg: Any, fname: str, namespace: str, env: dict,
                   region: tuple[str | None, str | None]) -> Any:
        """Where an argument comes from; ``None`` for what is shown as an attribute."""
        if isinstance(arg, (relax.Var, relax.TupleGetItem, relax.Tuple)) \
                and not isinstance(arg, tvm.ir.GlobalVar):
            return self.value_source(arg, fname, namespace, env, region)
        if C.is_tensor_constant(arg):
            return self.value_source(arg, fname, namespace, env, region)
        return None

    def value_source(self, value: Any, fname: str, namespace: str, env: dict,
                     region: tuple[str | None, str | None]) -> Any:
        if isinstance(value, relax.Var) and not isinstance(value, tvm.ir.GlobalVar):
            found = env.get(value)
            if found is None:  # a free Var (a bare function's input): its own node
                node = self.node("input", namespace, [], [_kv("binding", C.var_name(value))],
                                 _tensor_shapes(value.ty), C.var_name(value))
                found = env[value] = (node, 0)
            return found
        if isinstance(value, relax.TupleGetItem):
            source = self.value_source(value.tuple_value, fname, namespace, env, region)
            if isinstance(source, list):
                return source[int(value.index)]
            return (source[0], int(value.index))
        if isinstance(value, relax.Tuple):
            return [self.value_source(f, fname, namespace, env, region) for f in value.fields]
        if C.is_tensor_constant(value):
            node = self.node("const", namespace, [], [_kv("op", "constant")],
                             _tensor_shapes(C.type_of(value)), None)
            self.note_region(node, region)
            return (node, 0)
        node = self.node(type(value).__name__.lower(), namespace, [],
                         [_kv("value", value)], _tensor_shapes(C.type_of(value)), None)
        return (node, 0)

    @staticmethod
    def flatten(source: Any) -> list[Source]:
        if isinstance(source, list):
            return [s for item in source for s in _Builder.flatten(item)]
        return [source]

    def finish(self) -> ModuleGraph:
        self.result.graph["groupNodeAttributes"] = self.group_attrs
        self.result.graph["groupNodeConfigs"] = self.group_configs
        return self.result


def entry_functions(mod: tvm.IRModule) -> list[str]:
    """The Relax functions drawn as top-level groups: those fusion did not make."""
    names = [gv.name_hint for gv, func in mod.functions.items()
             if isinstance(func, relax.Function) and not K.is_fused(func)]
    return sorted(names, key=lambda n: (n != "main", n))


def module_graph(mod: tvm.IRModule, graph_id: str, *, fold: bool = True) -> ModuleGraph:
    """``mod`` as one Model Explorer graph with id ``graph_id``; see the module docstring.

    Parameters
    ----------
    mod : tvm.IRModule
        Read only, never modified.
    graph_id : str
        The graph's id (what node data overlays are keyed by).
    fold : bool
        Group the repeated layers of each function (default); ``False`` draws the
        bindings of a function in one group.
    """
    builder = _Builder(mod, graph_id, fold)
    for name in entry_functions(mod):
        builder.entry_function(name, mod[name])
    return builder.finish()
