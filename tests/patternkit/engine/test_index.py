"""FunctionIndex and dead_after: the facts the rewrite engine reads off a function.

The index is built once per function and pass; everything the driver, ``partition`` and
``MergeComposite`` decide (what the matcher may look through, who reads a Var, what a
rewrite leaves dead) comes from it.  The property at the end pins the subtlest part,
dead-binding removal, against TVM's own dead-code elimination.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax
from tvm.script import ir as I, relax as R

import patternkit as pk
from patternkit import ir as pk_ir
from patternkit.engine.index import (
    FunctionIndex,
    dead_after,
    forget_indexes,
    has_candidates,
)
from patternkit.ir.compat import handle
from patternkit.testing import relax_graphs


@I.ir_module
class TwoBlocks:
    """A dataflow block (tuples, a match_cast, two outputs) and an impure binding block."""

    @R.function(pure=False)
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.add(a, a)
            t = (b, y)
            c = t[0]
            m = R.match_cast(c, R.Tensor((2, 3), "float32"))
            o = R.nn.relu(m)
            R.output(a, o)
        p = R.print(o, format="{}")
        q = R.sigmoid(o)
        return (q, a)


def _index(mod):
    func = mod["main"]
    index = FunctionIndex.build(func)
    names = {handle(p): p.name for p in func.params}
    names.update({handle(b.var): b.var.name for block in index.blocks for b in block})
    return index, names


def _bound(func) -> dict:
    return {b.var.name: b for block in func.body.blocks for b in block.bindings}


# ---------------------------------------------------------------------- FunctionIndex
def test_position_gives_the_block_and_binding_index_of_every_bound_var():
    index, names = _index(TwoBlocks)
    assert {names[k]: pos for k, pos in index.position.items()} == {
        "a": (0, 0), "b": (0, 1), "t": (0, 2), "c": (0, 3), "m": (0, 4), "o": (0, 5),
        "p": (1, 0), "q": (1, 1)}
    bindings = _bound(TwoBlocks["main"])
    assert index.position_of(bindings["q"].var) == (1, 1)
    assert index.binding_at((0, 3)).same_as(bindings["c"])
    assert index.var_of(handle(bindings["o"].var)).same_as(bindings["o"].var)


def test_values_hold_per_block_only_the_pure_bindings_the_matcher_may_look_through():
    index, names = _index(TwoBlocks)
    # match_cast is not a VarBinding and print is impure: neither may be looked through
    assert [[names[k] for k in table] for table in index.values] == [
        ["a", "b", "t", "c", "o"], ["q"]]
    bindings = _bound(TwoBlocks["main"])
    assert index.values[0][handle(bindings["b"].var)].same_as(bindings["b"].value)


def test_readers_count_every_read_made_by_a_binding():
    index, names = _index(TwoBlocks)
    # b reads a twice; the function result reading a and q is not a binding's read
    assert {names[k]: n for k, n in index.readers.items()} == {
        "x": 1, "y": 1, "a": 2, "b": 1, "t": 1, "c": 1, "m": 1, "o": 2}


def test_block_outputs_and_the_function_result_escape():
    index, names = _index(TwoBlocks)
    assert {names[k] for k in index.escaping} == {"a", "o", "q"}


def test_reads_list_the_vars_each_bound_value_reads_with_repeats():
    index, names = _index(TwoBlocks)
    assert {names[k]: sorted(names[r] for r in reads) for k, reads in index.reads.items()} == {
        "a": ["x"], "b": ["a", "a"], "t": ["b", "y"], "c": ["t"], "m": ["c"], "o": ["m"],
        "p": ["o"], "q": ["o"]}


@I.ir_module
class Arities:
    """Operator calls of one to three arguments (the index reads the usual one and two
    arguments unrolled), leaves among them."""

    @R.function
    def main(x: R.Tensor((2, 3), "float32"), c: R.Tensor((2, 3), "bool")):
        with R.dataflow():
            z = R.zeros(R.shape([2, 3]), "float32")
            e = R.exp(x)
            s = R.add(e, R.const(1.0, "float32"))
            w = R.where(c, s, z)
            R.output(w)
        return w


def test_the_index_holds_each_calls_arguments_in_order_whatever_their_number():
    # The field-by-field index reads them (one read from a snapshot reads them on demand).
    func = Arities["main"]
    index = FunctionIndex.build_by_fields(func)
    names = {handle(p): p.name for p in func.params}
    names.update({handle(b.var): b.var.name for block in index.blocks for b in block})
    by_name = {names[handle(b.var)]: b.value for block in index.blocks for b in block}
    for name, arity in (("z", 1), ("e", 1), ("s", 2), ("w", 3)):
        call = by_name[name]
        args = index.call_args[handle(call)]
        assert len(args) == arity
        assert [handle(a) for a in args] == [handle(a) for a in call.args]
        assert index.call_ops[handle(call)] == handle(call.op)
    assert {names[k]: [names[r] for r in reads] for k, reads in index.reads.items()} == {
        "z": [], "e": ["x"], "s": ["e"], "w": ["c", "s", "z"]}


def test_users_of_lists_the_bindings_that_read_a_var():
    index, names = _index(TwoBlocks)
    bindings = _bound(TwoBlocks["main"])
    assert sorted(names[u] for u in index.users_of(handle(bindings["o"].var))) == ["p", "q"]
    assert index.users_of(handle(bindings["q"].var)) == []


def test_by_key_lists_var_bindings_by_operator_or_node_kind_in_program_order():
    index, _ = _index(TwoBlocks)
    assert index.by_key == {
        "relax.exp": [(0, 0)], "relax.add": [(0, 1)], "<Tuple>": [(0, 2)],
        "<TupleGetItem>": [(0, 3)], "relax.nn.relu": [(0, 5)], "relax.print": [(1, 0)],
        "relax.sigmoid": [(1, 1)]}
    assert index.candidates(["relax.sigmoid", "relax.exp"]) == [(0, 0), (1, 1)]
    assert index.candidates(None) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 5), (1, 0), (1, 1)]
    assert index.candidates(["relax.nn.conv2d"]) == []


def test_only_pure_dataflow_bindings_are_removable():
    index, names = _index(TwoBlocks)
    removable = {names[k] for block in index.keys for k, flag in block if flag}
    # a and o are block outputs, m a match_cast, p impure, q outside any dataflow block
    assert removable == {"b", "t", "c"}


@I.ir_module
class OnnxBatchnorm:
    """What the ONNX importer emits for Conv + BatchNormalization: a dead ``lv3[1]``."""

    @R.function
    def main(x: R.Tensor((1, 2, 4, 4), "float32"), w: R.Tensor((2, 2, 1, 1), "float32"),
             g: R.Tensor((2,), "float32"), b: R.Tensor((2,), "float32"),
             m: R.Tensor((2,), "float32"), v: R.Tensor((2,), "float32")):
        with R.dataflow():
            lv2 = R.nn.conv2d(x, w)
            lv3 = R.nn.batch_norm(lv2, g, b, m, v, axis=1)
            lv4 = lv3[0]
            lv5 = lv3[1]
            lv6 = R.exp(lv5)
            gv = R.nn.relu(lv4)
            R.output(gv)
        return gv


def test_dead_code_is_what_nothing_live_reads_transitively():
    index, names = _index(OnnxBatchnorm)
    assert {names[k] for k in index.dead_code} == {"lv5", "lv6"}
    # every binding of TwoBlocks is read, an output, impure or outside dataflow
    assert FunctionIndex.build(TwoBlocks["main"]).dead_code == frozenset()


def test_live_readers_leave_out_the_reads_of_dead_code():
    index, _ = _index(OnnxBatchnorm)
    bindings = _bound(OnnxBatchnorm["main"])
    lv3 = handle(bindings["lv3"].var)
    assert index.readers[lv3] == 2 and index.live_readers(lv3) == 1
    assert [handle(bindings["lv5"].var)] == index.dead_readers(lv3)


def test_has_candidates_is_a_cheap_prescan_by_key():
    func = TwoBlocks["main"]
    assert has_candidates(func, {"relax.sigmoid"}) and has_candidates(func, None)
    assert not has_candidates(func, {"relax.nn.conv2d", "relax.multiply"})


def test_a_pass_is_handed_the_index_a_previous_pass_built_for_the_same_function():
    forget_indexes()
    func = TwoBlocks["main"]
    index = FunctionIndex.of(func)
    assert FunctionIndex.of(func) is index
    assert FunctionIndex.of(TwoBlocks["main"]) is index  # another wrapper, the same function
    forget_indexes()
    assert FunctionIndex.of(func) is not index


def test_an_index_a_rewrite_made_opaque_somewhere_is_not_handed_out_again():
    forget_indexes()
    func = TwoBlocks["main"]
    index = FunctionIndex.of(func)
    b = handle(_bound(func)["b"].var)
    index.make_opaque(b)
    fresh = FunctionIndex.of(func)
    assert fresh is not index and b in fresh.values[0] and b not in index.values[0]


class CollapseOp(pk.RewriteRule):
    """``op(inner(x)) -> sigmoid(x)``: fires on ``exp(exp(x))`` in Chain, not on ``relu``."""

    name = "test.collapse_op"

    def __init__(self, op: str = "exp", inner: str = "exp"):
        super().__init__()
        self.x = pk.wildcard()
        self.pattern = pk.is_op(op)(pk.is_op(inner)(self.x))

    def rewrite(self, match):
        return relax.op.sigmoid(match.x)


def test_a_function_a_rewrite_replaced_leaves_no_index_behind_an_unchanged_one_does():
    forget_indexes()
    func = Chain["main"]
    before = FunctionIndex.of(func)  # as an earlier pass would have left it
    assert pk.rewrite(CollapseOp("nn.relu"), Chain)["main"].same_as(func)  # no match
    assert FunctionIndex.of(func) is before  # still handed to the next pass
    assert not pk.rewrite(CollapseOp(), Chain)["main"].same_as(func)
    assert FunctionIndex.of(func) is not before  # replaced: its index went with it
    forget_indexes()


# ---------------------------------------------------------------------- dead_after
@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(a)
            d = R.add(b, b)
            c = R.nn.relu(d)
            R.output(c)
        return c


@I.ir_module
class DeadReader:
    """``old`` was dead before any rewrite, and it reads ``a``."""

    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.exp(a)
            old = R.sigmoid(a)
            c = R.nn.relu(b)
            R.output(c)
        return c


@I.ir_module
class OutputRead:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.exp(x)
            c = R.nn.relu(a)
            R.output(a, c)
        return (a, c)


@I.ir_module
class NoDataflow:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        a = R.exp(x)
        c = R.nn.relu(a)
        return c


def _dead(mod, **new_values) -> set[str]:
    """Names of the bindings left dead when the named bindings get ``new_values``."""
    index, names = _index(mod)
    bindings = _bound(mod["main"])
    replaced = {handle(bindings[name].var): value for name, value in new_values.items()}
    return {names[k] for k in dead_after(index, replaced)}


def _var(mod, name):
    """The parameter or bound Var of ``mod["main"]`` called ``name``."""
    func = mod["main"]
    named = {p.name: p for p in func.params}
    named.update({n: b.var for n, b in _bound(func).items()})
    return named[name]


def test_a_replaced_root_releases_its_whole_chain_even_through_repeated_reads():
    x = _var(Chain, "x")
    assert _dead(Chain, c=relax.op.nn.relu(x)) == {"a", "b", "d"}


def test_what_the_new_value_reads_stays_alive():
    assert _dead(Chain, c=relax.op.nn.relu(_var(Chain, "a"))) == {"b", "d"}
    assert _dead(Chain, c=relax.op.nn.relu(_var(Chain, "b"))) == {"d"}
    assert _dead(Chain, c=relax.op.nn.relu(_var(Chain, "d"))) == set()


def test_a_replaced_binding_nobody_reads_any_more_is_dead_and_released_once():
    x = _var(Chain, "x")
    # b gets a new value, then c stops reading the chain: b itself is dead, and a,
    # read by b's old value only, is released once (not once per replacement)
    assert _dead(Chain, b=relax.op.exp(x), d=relax.op.add(x, x)) == {"a", "b"}
    assert _dead(Chain, b=relax.op.exp(x)) == {"a"}


def test_dead_code_that_reads_what_a_rewrite_removes_goes_with_it():
    # a is read by b (which goes) and by old (dead already): dead readers keep nothing
    # alive, so a goes, and old, which would read a value no longer computed, with it
    assert _dead(DeadReader, c=relax.op.nn.relu(_var(DeadReader, "x"))) == {"a", "b", "old"}


def test_dead_code_that_reads_only_what_stays_is_kept():
    # c's new value still reads a: a stays, and so does old, dead as it is
    assert _dead(DeadReader, c=relax.op.nn.relu(_var(DeadReader, "a"))) == {"b"}


def test_a_new_value_that_reads_dead_code_brings_it_back_with_what_it_reads():
    # old was dead; c now reads it, so it lives again and keeps a (b still goes)
    assert _dead(DeadReader, c=relax.op.nn.relu(_var(DeadReader, "old"))) == {"b"}


@I.ir_module
class SharedInput:
    @R.function
    def main(x: R.Tensor((2, 4), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            s = R.sum(x, axis=[0])
            d = R.add(s, s)
            c = R.add(d, y)
            R.output(c)
        return c


def test_a_replaced_binding_left_dead_releases_what_its_new_value_reads():
    y = _var(SharedInput, "y")
    assert _dead(SharedInput, d=_var(SharedInput, "s"), c=relax.op.negative(y)) == {"d", "s"}


def test_block_outputs_and_non_dataflow_bindings_are_never_removed():
    assert _dead(OutputRead, c=relax.op.nn.relu(_var(OutputRead, "x"))) == set()
    assert _dead(NoDataflow, c=relax.op.nn.relu(_var(NoDataflow, "x"))) == set()


# ---------------------------------------------------------------------- against TVM's DCE
_BINARY = pk.is_op("add") | pk.is_op("multiply") | pk.is_op("subtract") | pk.is_op("maximum")
_UNARY = (pk.is_op("nn.relu") | pk.is_op("sigmoid") | pk.is_op("tanh") | pk.is_op("negative")
          | pk.is_op("abs") | pk.is_op("cos"))


class RecordingRule(pk.DFPatternCallback):
    """Applied in one pass; remembers each replacement by the value it replaced.

    With ``first_only`` it accepts only the first match that changes something (the one
    nearest the function's result), so the pass makes a single replacement.
    """

    def __init__(self, first_only: bool = False):
        super().__init__(rewrite_once=True)
        self.first_only = first_only
        self.accepted = 0
        self.made = {}

    def check(self, pre, node_map):
        if self.replacement(pre, node_map).same_as(pre):
            return pk.reject("nothing to change")
        if self.first_only and self.accepted:
            return pk.reject("one rewrite per pass")
        self.accepted += 1
        return True

    def callback(self, pre, post, node_map):
        new = self.replacement(pre, node_map)
        if not new.same_as(pre):  # returning pre leaves the binding as it is
            self.made[handle(pre)] = new
        return new


class ReplaceWithZeros(RecordingRule):
    """``f(a[, b]) -> zeros`` for an elementwise ``f`` with a static shape.

    Everything that fed only ``f`` goes, however far up the graph it reaches.
    """

    name = "test.replace_with_zeros"

    def __init__(self, first_only: bool = False):
        super().__init__(first_only)
        self.pattern = _UNARY(pk.wildcard()) | _BINARY(pk.wildcard(), pk.wildcard())

    def replacement(self, pre, node_map):
        shape = pk_ir.static_shape(pre.ty)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return pre
        return relax.const(np.zeros(shape, "float32"))


class SkipInnerOp(RecordingRule):
    """``f(g(a, ...), ...) -> f(a, ...)`` for elementwise unary or binary ``f`` and ``g``.

    The inner binding is the match's interior: it goes (and with it what fed only its
    other operand) unless it is read outside the match, when the match is skipped.
    """

    name = "test.skip_inner_op"

    def __init__(self, first_only: bool = False):
        super().__init__(first_only)
        self.a, self.other = pk.wildcard(), pk.wildcard()
        inner = _UNARY(self.a) | _BINARY(self.a, pk.wildcard())
        self.pattern = _UNARY(inner) | _BINARY(inner, self.other)

    def replacement(self, pre, node_map):
        rest = [node_map[self.other][0]] if self.other in node_map else []
        return relax.Call(pre.op, [node_map[self.a][0], *rest])


def _binding_names(func) -> set[str]:
    return set(_bound(func))


def _with_bindings(func, blocks, body, ret_ty=None) -> relax.Function:
    new = relax.Function(func.params, relax.SeqExpr(blocks, body),
                         func.ret_ty if ret_ty is None else ret_ty, func.is_pure, func.attrs)
    return relax.BlockBuilder().normalize(new)


def _add_dead_code(mod, positions) -> tvm.IRModule:
    """``deadK = sigmoid(v)`` right after the K-th chosen binding ``v``: unread reads."""
    func = mod["main"]
    block = func.body.blocks[0]
    bindings = list(block.bindings)
    chosen = sorted({p % len(bindings) for p in positions}, reverse=True)
    for k, pos in enumerate(chosen):
        var = bindings[pos].var
        if not isinstance(var.ty, relax.TensorType):
            continue
        value = relax.BlockBuilder().normalize(relax.op.sigmoid(var))
        bindings.insert(pos + 1, relax.VarBinding(relax.DataflowVar(f"dead{k}", value.ty),
                                                  value))
    return tvm.IRModule({"main": _with_bindings(func, [relax.DataflowBlock(bindings)],
                                                func.body.body)})


def _reads(func) -> dict[str, set[str]]:
    """Binding name -> names of the Vars its value reads."""
    return {b.var.name: {v.name for v in relax.analysis.free_vars(b.value)}
            for block in func.body.blocks for b in block.bindings}


def _check_removal_matches_dce(rule, mod) -> bool:
    """Rewrite ``mod`` once; what went must be what TVM's DCE says the rewrite left dead.

    The reference applies the rule's replacements without removing anything and lets
    ``remove_all_unused`` decide what is live before and after.  What was live before and
    is not after must go; dead code that was already there goes exactly when it reads
    (directly or through other dead code) something that went, and stays otherwise.
    Returns whether the rewrite removed a binding.
    """
    before = mod["main"]
    log = pk.RewriteLog()
    after = pk.rewrite(rule, mod, log=log)["main"]
    assert relax.analysis.check_well_formed(tvm.IRModule({"main": after}))
    dce = relax.analysis.remove_all_unused
    live_before = _binding_names(dce(before))
    already_dead = _binding_names(before) - live_before
    normalize = relax.BlockBuilder().normalize
    bindings = before.body.blocks[0].bindings
    naive = _with_bindings(before, [relax.DataflowBlock([
        relax.VarBinding(b.var, normalize(rule.made[handle(b.value)]))
        if handle(b.value) in rule.made else b for b in bindings])], before.body.body)
    expected = live_before - _binding_names(dce(naive))
    reads = _reads(naive)
    grew = True
    while grew:
        follow = {d for d in already_dead - expected if reads[d] & expected}
        grew = bool(follow)
        expected |= follow
    removed = _binding_names(before) - _binding_names(after)
    assert removed == expected
    assert already_dead - expected <= _binding_names(after), \
        "dead code that reads nothing removed was removed"
    return bool(removed)


# rewrite plus two DCE runs per example: cheap, a third of the profile's budget (100 in ci)
DCE_EXAMPLES = max(1, settings.default.max_examples // 3)


def _removal_property(rule_class, first_only: bool) -> None:
    """The DCE property for ``rule_class``, not vacuous: a fifth of the graphs lost bindings."""
    removed = []

    @settings(max_examples=DCE_EXAMPLES)
    @given(relax_graphs(max_ops=12), st.lists(st.integers(0, 64), max_size=3))
    def removal_matches_dce(mod, dead_positions):
        rule = rule_class(first_only)
        removed.append(_check_removal_matches_dce(rule, _add_dead_code(mod, dead_positions)))

    removal_matches_dce()
    assert sum(removed) >= 0.2 * len(removed), \
        f"{rule_class.name} removed bindings in only {sum(removed)} of {len(removed)} graphs"


def test_one_rewrite_removes_exactly_what_dead_code_elimination_would():
    _removal_property(ReplaceWithZeros, first_only=True)


def test_a_pass_of_rewrites_removes_exactly_what_dead_code_elimination_would():
    _removal_property(SkipInnerOp, first_only=False)
