r"""Relay's dominator patterns on Relax: the walk from a root back to its parent.

``dominates(parent, path, child)`` describes a *diamond*: a node matching ``child``
(the root) whose inputs lead back, through nodes matching ``path``, to one node matching
``parent``, every value computed on the way flowing into the root.  Relay's example is
a convolution followed by elementwise branches that meet again in an ``add``::

    conv2d -> relu -> relu --.
        \                      add        dominates(is_conv2d, is_unary_elemwise, is_add)
         `-> leaky_relu -----'

The rules, as :func:`walk_diamond` applies them:

1. ``child`` matches the root (with its own sub-patterns, as any pattern).
2. Walking back from the root, every *data input* of a node of the diamond (a Var, or a
   nested expression; constants, shapes and other literals are not inputs) is either
   the parent, or a *path node* (it matches ``path``; its own inputs are walked in
   turn).  The first input that matches ``parent`` becomes the parent (Relay's
   memoised parent); later inputs must be that same node or path nodes.
3. A node that reads the parent directly may have other inputs that are neither:
   they are inputs of the match (Relay's ``bias_add(conv, bias)``: ``bias`` is free).
   Any other node may not (``add(relu(input), leaky_relu(conv))`` is no diamond: the
   first branch does not lead back to the conv).
4. The root post-dominates the parent: every reader of the parent and of each path node
   is a node of the diamond (or the root), and none of them is an output of its block
   or of the function.  This is Relay's ``DominatesParent``, checked on the readers the
   diamond walked: a parent also used elsewhere gives no match.

Ambiguity is an error (:class:`AmbiguousDominator`), not a silent choice: a node the
walk takes as the parent that also matches ``path`` (unless ``path`` is a bare
``wildcard()``, Relay's "anything in between"), a path node that also matches
``parent``, or a path node that matches ``child`` and is itself the root of a complete
diamond (the diamond holds a smaller one), means the pattern does not say where the
diamond ends.  Relay resolved these silently (nearest parent, outermost root).

Cost of one root: every node of the diamond is visited once, and each of its inputs is
tested once against ``parent`` and ``path`` (one pattern match each, plus the other
pattern for the ambiguity check); the reader check reads one count per node; the
nested-diamond check is one pass over the diamond's edges in topological order.  So a
root costs O(nodes + edges of the diamond walked) pattern matches, whatever the size of
the function: the walk stops at the parent, and fails at the first input that is
neither the parent nor a path node.

Deviations from Relay, all in cases Relay's own rules leave unclear: inputs are
examined whatever their argument position (Relay stopped at the first parent it met,
so ``bias_add(conv, bias)`` matched and ``bias_add(bias, conv)`` did not); constants are
not nodes (Relay's ``relu(x) * 2.0`` broke a path); an unbound Var (a parameter) is never
a path node (with Relay's ``wildcard()`` path, the walk went on into the inputs).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from tvm import relax

from ..errors import PatternError
from ..ir import compat as C
from ..ir.rebuild import binding_text, expr_text
from ..ir.walk import CALL, GET_ITEM, KIND_OF, TUPLE, VAR, expr_kind, vars_read
from .pattern import DFPattern, WildcardPattern

__all__ = ["AmbiguousDominator", "Diamond", "DiamondTests", "Uses", "data_inputs",
           "is_anything", "uses_of_expression", "uses_of_function", "uses_of_table",
           "walk_diamond"]


class AmbiguousDominator(PatternError):
    """A dominator pattern cannot tell where its diamond ends at some binding.

    Attributes
    ----------
    at : Relax expression
        The node (usually a bound Var) where the walk met the ambiguity.
    binding : str
        That node as ``"lv3 = R.nn.relu(lv2)"`` (``"main: lv3 = ..."`` once an engine
        named the function, with :meth:`in_rule`).
    rule : str
        The rule (or pass) that used the pattern, once known.
    """

    def __init__(self, message: str, at: Any = None, binding: str = "", rule: str = ""):
        super().__init__(message)
        self.at = at
        self.binding = binding
        self.rule = rule

    def in_rule(self, rule: str, function: str) -> "AmbiguousDominator":
        """The same error, naming the rule (or pass) and the function it was met in."""
        return AmbiguousDominator(f"rule {rule}: {self} (in function {function})", self.at,
                                  f"{function}: {self.binding}", rule)


@dataclass(frozen=True)
class Uses:
    """How often each node is read, and which nodes are seen outside their block.

    ``counts`` maps a :func:`~patternkit.ir.compat.handle` to the number of reads (with
    repeats: ``add(x, x)`` reads ``x`` twice); a key it lacks is a nested expression
    read once, where it is written.  ``escaping`` holds the handles of block outputs and
    of Vars the function returns.
    """

    counts: Mapping[int, int]
    escaping: Container[int] = field(default_factory=frozenset)

    def count(self, key: int) -> int:
        """The reads of the node with handle ``key``; a nested expression (no key) once."""
        return self.counts.get(key, 1)


def uses_of_function(func: relax.Function) -> Uses:
    """The reads of every Var bound in ``func``, and its block outputs and result."""
    counts: dict[int, int] = {}
    escaping: set[int] = set()
    for block in C.array_items(func.body.blocks):
        dataflow = type(block) is relax.DataflowBlock
        for binding in C.array_items(block.bindings):
            for var in vars_read(binding.value):
                key = C.handle(var)
                counts[key] = counts.get(key, 0) + 1
            if dataflow and type(binding.var) is not relax.DataflowVar:
                escaping.add(C.handle(binding.var))
    escaping.update(C.handle(v) for v in vars_read(func.body.body))
    return Uses(counts, escaping)


def uses_of_table(table: Mapping[int, Any]) -> Uses:
    """The reads among the values of a look-up table (handle -> value); nothing escapes.

    For matchers that see one block's values and nothing else; the rewrite engine
    passes the function's own counts instead.
    """
    counts: dict[int, int] = {}
    for value in table.values():
        for var in vars_read(value):
            key = C.handle(var)
            counts[key] = counts.get(key, 0) + 1
    return Uses(counts)


def uses_of_expression(expr: Any) -> Uses:
    """The reads of each node of a nested expression (Relay's graph of one expression)."""
    counts: dict[int, int] = {}
    expanded: set[int] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        key = C.handle(node)
        if key in expanded:
            continue
        expanded.add(key)
        for child in data_inputs(node):
            child_key = C.handle(child)
            counts[child_key] = counts.get(child_key, 0) + 1
            stack.append(child)
    return Uses(counts)


def data_inputs(value: Any) -> list[Any]:
    """The inputs of a dataflow node: a call's arguments, a tuple's fields, a projection's
    tuple; literals (constants, shapes, operators, functions by name) are left out.
    """
    kind = KIND_OF.get(type(value)) or expr_kind(value)
    if kind is CALL:
        candidates = C.array_items(value.args)
    elif kind is TUPLE:
        candidates = C.array_items(value.fields)
    elif kind is GET_ITEM:
        candidates = [value.tuple_value]
    else:
        return []
    return [a for a in candidates
            if (KIND_OF.get(type(a)) or expr_kind(a)) in (VAR, CALL, TUPLE, GET_ITEM)]


@dataclass
class Diamond:
    """What :func:`walk_diamond` found.

    ``path`` holds ``(expression as written, key, value)`` of each path node in visit
    order; ``free`` the inputs of parent-adjacent nodes that are neither the parent nor
    path nodes (inputs of the match).
    """

    parent: Any
    path: list[tuple[Any, int, Any]]
    free: list[Any]


@dataclass(frozen=True)
class DiamondTests:
    """How the walk asks the matcher about one node (all take the node as written).

    resolve(expr) -> (key, value)
        The node's handle and the value it computes (``None`` for an unbound Var).
    is_parent(expr) -> bool
        The memoised parent test: the first success binds the parent.
    is_path(expr) -> bool
        ``path`` on its own, leaving no trace (every path node is a new match).
    is_parent_kind(expr) -> bool
        ``parent`` on its own, leaving no trace (for the ambiguity check).
    is_child(expr) -> bool
        ``child`` on its own, leaving no trace (for the nested-diamond check).
    path_is_anything : bool
        ``path`` is a bare ``wildcard()``: the parent matching it is no ambiguity.
    """

    resolve: Callable[[Any], tuple[int, Any]]
    is_parent: Callable[[Any], bool]
    is_path: Callable[[Any], bool]
    is_parent_kind: Callable[[Any], bool]
    is_child: Callable[[Any], bool]
    path_is_anything: bool


def walk_diamond(root_key: int, root_value: Any, tests: DiamondTests, uses: Uses,
                 pattern_text: str) -> Diamond | None:
    """The diamond rooted at ``root_value``, or ``None``; see the module docstring.

    Raises
    ------
    AmbiguousDominator
        The pattern does not say where the diamond ends at some node.
    """
    parent: tuple[Any, int] | None = None  # (expression, key)
    path: list[tuple[Any, int, Any]] = []
    free: list[Any] = []
    in_diamond = {root_key}
    reads: dict[int, int] = {}  # key -> reads by diamond nodes
    edges: list[tuple[int, int]] = []  # (input key, reader key), parent and path nodes only
    stack = [(root_key, root_value)]
    while stack:
        key, value = stack.pop()
        inputs = []
        for arg in data_inputs(value):
            arg_key, arg_value = tests.resolve(arg)
            inputs.append((arg, arg_key, arg_value))
        reads_parent = False
        for arg, arg_key, _ in inputs:
            if parent is None and arg_key not in in_diamond and tests.is_parent(arg):
                parent = (arg, arg_key)
                if not tests.path_is_anything and tests.is_path(arg):
                    raise _ambiguous(pattern_text, arg, _value_of(inputs, arg_key),
                                     "it matches the parent and the path pattern: the "
                                     "walk cannot tell whether the diamond ends there")
            if parent is not None and arg_key == parent[1]:
                reads_parent = True
        pushed = []
        for arg, arg_key, arg_value in inputs:
            reads[arg_key] = reads.get(arg_key, 0) + 1
            if parent is not None and arg_key == parent[1]:
                edges.append((arg_key, key))
                continue
            if arg_key in in_diamond:
                edges.append((arg_key, key))
                continue
            if arg_value is not None and tests.is_path(arg):
                if tests.is_parent_kind(arg):
                    raise _ambiguous(pattern_text, arg, arg_value,
                                     "it matches the path pattern and the parent pattern, "
                                     "and the parent is another node: the walk cannot tell "
                                     "which node is the parent")
                in_diamond.add(arg_key)
                path.append((arg, arg_key, arg_value))
                edges.append((arg_key, key))
                pushed.append((arg_key, arg_value))
            elif reads_parent:
                free.append(arg)
            else:
                return None  # an input that leads neither to the parent nor along the path
        stack.extend(reversed(pushed))  # Relay's order: the first input is walked first
    if parent is None:
        return None
    for node_key in (parent[1], *(k for _, k, _ in path)):
        if node_key in uses.escaping or uses.count(node_key) != reads.get(node_key, 0):
            return None  # read outside the diamond: the root does not post-dominate it
    nested = _nested_root(root_key, parent[1], path, edges, tests)
    if nested is not None:
        expr, value = nested
        raise _ambiguous(pattern_text, expr, value,
                         "it matches the child pattern and is the root of a complete "
                         "diamond of its own inside this one: the walk cannot tell which "
                         "root is meant")
    return Diamond(parent[0], path, free)


def _value_of(inputs: list[tuple[Any, int, Any]], key: int) -> Any:
    return next(value for _, k, value in inputs if k == key)


def _nested_root(root_key: int, parent_key: int, path: list[tuple[Any, int, Any]],
                 edges: list[tuple[int, int]], tests: DiamondTests) -> tuple[Any, Any] | None:
    """A path node on every way from the parent to the root that matches ``child``.

    Such a node post-dominates the parent inside the diamond, so it is the root of a
    smaller diamond with the same parent.  In a topological order of the diamond, a node
    lies on every way from the parent to the root exactly when no edge jumps over it.
    """
    inputs_of: dict[int, list[int]] = {}
    for src, dst in edges:
        inputs_of.setdefault(dst, []).append(src)
    order: dict[int, int] = {}
    stack = [(root_key, False)]
    while stack:  # post-order from the root: every input before its readers
        node, done = stack.pop()
        if done:
            order.setdefault(node, len(order))
            continue
        if node in order:
            continue
        stack.append((node, True))
        stack.extend((src, False) for src in inputs_of.get(node, ()) if src not in order)
    span = [0] * (len(order) + 1)
    for src, dst in edges:
        lo, hi = order[src], order[dst]
        if hi - lo > 1:
            span[lo + 1] += 1
            span[hi] -= 1
    covered = []
    running = 0
    for i in range(len(order)):
        running += span[i]
        covered.append(running > 0)
    for expr, key, value in path:
        if key != parent_key and not covered[order[key]] and tests.is_child(expr):
            return expr, value
    return None


def _ambiguous(pattern_text: str, expr: Any, value: Any, why: str) -> AmbiguousDominator:
    if isinstance(expr, relax.Var) and value is not None:
        where = binding_text(expr, value, limit=100)
    else:
        where = expr_text(expr, 100)
    return AmbiguousDominator(
        f"ambiguous {pattern_text} at '{where}': {why}.  Make the parent and the path "
        f"patterns disjoint (e.g. a path of K_ELEMWISE operators and a parent that is "
        f"not one), or give the child an operator the path cannot take", expr, where)


def is_anything(pattern: DFPattern) -> bool:
    """Is ``pattern`` Relay's default path, a bare ``wildcard()``?"""
    return type(pattern) is WildcardPattern
