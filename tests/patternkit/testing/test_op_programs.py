"""Programs grown from each operator's typing rule: buildable, covering, shrinkable, and
able to find a pass's bug that nobody pointed the fuzzer at."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("hypothesis")

import tvm  # noqa: E402
from hypothesis import HealthCheck, find, settings  # noqa: E402
from tvm import relax  # noqa: E402

from patternkit.testing.fuzz import SKIPPED_UNBUILDABLE, draw_instances, fuzz_pass  # noqa: E402
from patternkit.testing.op_catalogue import CATALOGUE, EXCLUDED, entries_for  # noqa: E402
from patternkit.testing.op_programs import grow_program, op_programs  # noqa: E402
from patternkit.verification import numeric  # noqa: E402

#: Programs drawn by the coverage tests, from several seeds: one hypothesis run reuses
#: its earlier choices, so its programs come in clumps (drawing costs no build).
SAMPLE, SEEDS = 100, 4


@pytest.fixture(scope="module")
def sample():
    return [mod for seed in range(SEEDS) for mod in draw_instances(op_programs(), SAMPLE, seed)]


def bindings(mod):
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def calls(mod):
    return [b.value for b in bindings(mod) if isinstance(b.value, relax.Call)
            and isinstance(b.value.op, tvm.ir.Op)]


def builds_and_runs(mod):
    vm = numeric.build(mod)
    numeric.run(mod, numeric.random_inputs(mod["main"]), vm=vm)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_catalogue_entry_builds_and_runs_on_llvm(dtype):
    entries = entries_for(dtype)
    chunk = 15
    for start in range(0, len(entries), chunk):
        part = entries[start:start + chunk]
        mod = grow_program(part, seed=start, dtype=dtype, symbolic=bool(start % 2))
        assert relax.analysis.check_well_formed(mod)
        try:
            builds_and_runs(mod)
        except Exception as err:  # name the entries, not just the error
            pytest.fail(f"{[e.key for e in part]}: {type(err).__name__}: {err}")


def test_drawn_programs_build_and_every_catalogued_operator_appears(sample):
    seen = collections.Counter(c.op.name for mod in sample for c in calls(mod))
    tuples = sum(isinstance(b.value, relax.Tuple) for mod in sample for b in bindings(mod))
    missing = sorted({e.name for e in CATALOGUE if e.name != "relax.Tuple"} - set(seen))
    assert not missing, missing
    assert tuples > 0
    sizes = [len(bindings(mod)) for mod in sample]
    assert min(sizes) >= 3 and sum(sizes) / len(sizes) <= 20
    # the generator's discard rate: none of these fails to build as drawn
    unbuildable = []
    for mod in sample[:16]:
        try:
            builds_and_runs(mod)
        except Exception as err:  # noqa: BLE001 - counted, then reported
            unbuildable.append(f"{type(err).__name__}: {err}"[:200])
    assert not unbuildable, unbuildable


def test_no_excluded_operator_is_in_the_catalogue():
    assert not {e.name for e in CATALOGUE} & set(EXCLUDED)
    assert all(reason for reason in EXCLUDED.values())


def _shape(ty):
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape]


def test_programs_cover_broadcasting_symbolic_dims_float16_tuples_and_layouts(sample):
    features = collections.Counter()
    for mod in sample:
        main = mod["main"]
        params = [_shape(p.ty) for p in main.params]
        if any("n" in shape for shape in params):
            features["symbolic"] += 1
        if any(str(p.ty.dtype) == "float16" for p in main.params):
            features["float16"] += 1
        if any(len(shape) == 5 for shape in params):
            features["rank 5"] += 1
        if isinstance(main.ret_ty, relax.TupleType):
            features["tuple output"] += 1
        producers = {b.var.name: b.value for b in bindings(mod)}
        for call in calls(mod):
            name = call.op.name
            if name in ("relax.add", "relax.subtract", "relax.multiply") and len(call.args) == 2:
                a, b = (_shape(arg.ty) for arg in call.args)
                if a != b:
                    features["broadcast"] += 1
                    if len(a) != len(b):
                        features["rank difference"] += 1
                    if not a or not b:
                        features["scalar"] += 1
            if name == "relax.nn.conv2d":
                features[f"conv2d {call.attrs.data_layout} {call.attrs.kernel_layout}"] += 1
            if name in ("relax.matmul", "relax.nn.conv2d") and call.attrs.out_dtype and \
                    str(call.attrs.out_dtype) != str(call.args[0].ty.dtype):
                features["out_dtype"] += 1
            if name in ("relax.matmul", "relax.nn.conv2d", "relax.nn.conv1d"):
                for arg in call.args:
                    made = producers.get(arg.name) if isinstance(arg, relax.Var) else None
                    if isinstance(made, relax.Call) and made.op.name in (
                            "relax.permute_dims", "relax.reshape", "relax.multiply"):
                        features["computed operand"] += 1
            if isinstance(call.ty, relax.TupleType):
                features["tuple-valued op"] += 1
    for feature in ("symbolic", "float16", "rank 5", "tuple output", "broadcast",
                    "rank difference", "scalar", "conv2d NCHW OIHW", "conv2d NHWC HWIO",
                    "conv2d NHWC OIHW", "out_dtype", "computed operand", "tuple-valued op"):
        assert features[feature] > 0, (feature, features)


def test_a_symbolic_program_runs_at_a_concrete_size():
    mod = find(op_programs(symbolic=True),
               lambda m: any("n" in _shape(p.ty) for p in m["main"].params),
               settings=settings(database=None, suppress_health_check=list(HealthCheck)))
    for size in (1, 5):
        inputs = numeric.random_inputs(mod["main"], shape_vars={"n": size})
        numeric.run(mod, inputs, vm=numeric.build(mod))


@pytest.mark.slow
def test_hypothesis_shrinks_a_program_to_the_operator_it_needs():
    def has_a_strided_slice(mod):
        return any(c.op.name == "relax.strided_slice" for c in calls(mod))

    small = find(op_programs(min_ops=1, drawn_choices=True), has_a_strided_slice,
                 settings=settings(database=None, max_examples=500,
                                   suppress_health_check=list(HealthCheck)))
    assert has_a_strided_slice(small)
    assert len(bindings(small)) <= 4, small.script()


def swap_subtract(mod: tvm.IRModule) -> tvm.IRModule:
    """A deliberately broken pass: ``a - b`` becomes ``b - a`` (broadcasting allows it)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Swap(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.subtract":
                return relax.op.subtract(call.args[1], call.args[0])
            return call

    out = tvm.IRModule({gv: Swap(mod).visit_expr(f) if isinstance(f, relax.Function) else f
                        for gv, f in mod.functions.items()})
    return out


def test_fuzz_pass_finds_a_pass_that_swaps_the_operands_of_subtract():
    report = fuzz_pass(swap_subtract, "ops", budget=40, seed=0)
    mismatch = [f for f in report.failures if f.kind == "mismatch"]
    assert mismatch, report.summary()
    shrunk = mismatch[0].module
    assert any(c.op.name == "relax.subtract" for c in calls(shrunk))
    assert len(bindings(shrunk)) <= 4, mismatch[0].script
    assert SKIPPED_UNBUILDABLE not in report.targets[0].rejected


def test_an_unknown_strategy_name_is_an_error():
    with pytest.raises(ValueError, match="no strategy 'graphs'"):
        fuzz_pass(relax.transform.CanonicalizeBindings(), "graphs", budget=1)
