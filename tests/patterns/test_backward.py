"""patterns/backward.py: batch-norm and layer-norm backward chains as composites, on the
graphs ``relax.transform.Gradient`` emits."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import patternkit as pk
from patternkit.byoc import (
    CompositeLog,
    composite_counts,
    external_functions,
    inline_external,
    merge_composite,
)
from patternkit.patterns import LIBRARY
from patternkit.patterns.backward import FrozenBatchNormGradComposite, NormGradComposite
from patternkit.testing import EXACT, Negative, RuleCase, check_rule
from patternkit.training import gradient, with_loss

#: The backward composites as the library holds them (named ``byoc.<kind>_grad``).
BACKWARD = [rule for rule in LIBRARY.composites() if type(rule).__module__.endswith(".backward")]


# -- the chain as Gradient writes it, as TVMScript ---------------------------------------------
def _norm_grad_script(x_shape, stats, count, *, dtype="float32", gamma=None, upstream=False,
                      composite=None, pattern_ops=None, second_stats=None, half=0.5) -> str:
    """TVMScript of the input gradient of a norm over ``x_shape`` with ``stats``-shaped
    statistics, as ``Gradient`` emits it for ``layernorm.expand`` / ``batchnorm.expand``.

    ``gamma``: the scale's shape (``None``: no ``dy * gamma``); ``upstream``: the
    running-statistics adjoints added to the mean's and the variance's gradients (a
    training-mode batch norm); ``composite``: the chain wrapped in a local composite of
    that name instead; ``second_stats`` / ``half``: edges for negatives.  A ``"n"`` in a
    shape is a symbolic dimension.
    """
    dims = lambda shape: ", ".join(str(d) for d in shape)
    sym = any(d == "n" for d in x_shape)
    def ty(shape, outer: bool = True) -> str:
        """The type; ``n`` is declared by the outer signature and read by the composite's."""
        text = ", ".join(repr(d) if d == "n" and outer else str(d) for d in shape)
        return f'R.Tensor(({text}{"," if len(shape) == 1 else ""}), "{dtype}")'

    second = second_stats or stats
    params = [("dy", x_shape)] + ([("gamma", gamma)] if gamma else []) + [
        ("std", stats), ("xhat", x_shape), ("xc", x_shape)]
    if upstream:
        params += [("dvar_up", stats), ("dmean_up", second)]

    def chain(p: str, indent: str) -> str:
        arg = lambda name: name + p
        g = "g" if gamma else arg("dy")
        lines = ([f"g = R.multiply({arg('dy')}, {arg('gamma')})"] if gamma else []) + [
            f"neg_g = R.negative({g})",
            f"g_xhat = R.multiply(neg_g, {arg('xhat')})",
            f"direct = R.divide({g}, {arg('std')})",
            f"through_std = R.divide(g_xhat, {arg('std')})",
            f"dstd = R.collapse_sum_to(through_std, R.shape([{dims(stats)}]))",
            f'half = R.multiply(R.const({half}, "{dtype}"), dstd)',
            f"dvar = R.divide(half, {arg('std')})"]
        dvar = "dvar"
        if upstream:
            lines.append(f"dvar_all = R.add({arg('dvar_up')}, dvar)")
            dvar = "dvar_all"
        lines += [
            f'dvar_mean = R.divide({dvar}, R.const({count}, "{dtype}"))',
            f"dsq = R.broadcast_to(dvar_mean, R.shape([{dims(x_shape)}]))",
            f"left = R.multiply(dsq, {arg('xc')})",
            "dxc1 = R.add(direct, left)",
            f"right = R.multiply(dsq, {arg('xc')})",
            "dxc = R.add(dxc1, right)",
            "neg_dxc = R.negative(dxc)",
            f"dmean = R.collapse_sum_to(neg_dxc, R.shape([{dims(second)}]))"]
        dmean = "dmean"
        if upstream:
            lines.append(f"dmean_all = R.add({arg('dmean_up')}, dmean)")
            dmean = "dmean_all"
        lines += [f'dmean_n = R.divide({dmean}, R.const({count}, "{dtype}"))',
                  f"dmean_b = R.broadcast_to(dmean_n, R.shape([{dims(x_shape)}]))",
                  "dx = R.add(dxc, dmean_b)", "R.output(dx)"]
        return "\n".join(indent + line for line in lines)

    def signature(p: str, order) -> str:
        return (", ".join(f"{name}{p}: {ty(shape, not p)}" for name, shape in order)
                + f") -> {ty(x_shape, not p)}:")

    # the composite's parameters in the order the match meets its inputs
    inner = sorted(params, key=lambda param: ["dy", "gamma", "std", "dvar_up", "xhat", "xc",
                                              "dmean_up"].index(param[0]))

    n = "        n = T.int64()\n" if sym else ""
    head = ("@I.ir_module\nclass Module:\n    @R.function\n"
            f"    def main({signature('', params)}\n{n}")
    if composite is None:
        return head + f"        with R.dataflow():\n{chain('', ' ' * 12)}\n        return dx\n"
    return (head + "        with R.dataflow():\n            @R.function\n"
            f"            def composite({signature('1', inner)}\n"
            f'                R.func_attr({{"Composite": "{composite}", '
            f'"PartitionedFromPattern": "{pattern_ops}"}})\n'
            f"                with R.dataflow():\n{chain('1', ' ' * 20)}\n"
            "                return dx\n\n"
            f"            dx = composite({', '.join(name for name, _ in inner)})\n"
            "            R.output(dx)\n        return dx\n")


def _ops(gamma: bool, upstream: bool) -> str:
    """``PartitionedFromPattern`` of the chain: its ops in pattern order."""
    ops = (["multiply"] if gamma else []) + [
        "divide", "negative", "multiply", "divide", "collapse_sum_to", "multiply", "divide"]
    ops += ["add"] * upstream + ["divide", "broadcast_to", "multiply", "add", "multiply", "add",
                                 "negative", "collapse_sum_to"]
    ops += ["add"] * upstream + ["divide", "broadcast_to", "add"]
    return "".join(op + "_" for op in ops)


def _module(script: str) -> tvm.IRModule:
    return tvm.script.from_source(script)


def _norm_case(rule, x_shape, stats, count, negatives, **knobs) -> RuleCase:
    gamma, upstream = knobs.get("gamma"), knobs.get("upstream", False)
    return RuleCase(rule, _module(_norm_grad_script(x_shape, stats, count, **knobs)),
                    _module(_norm_grad_script(x_shape, stats, count, composite=rule.name,
                                              pattern_ops=_ops(gamma is not None, upstream),
                                              **knobs)),
                    negatives=negatives, tolerance=EXACT, positive=("std",))


def _refused(name, reason, x_shape, stats, count, **knobs) -> Negative:
    return Negative(name, _module(_norm_grad_script(x_shape, stats, count, **knobs)), reason)


# -- layer_norm_grad ------------------------------------------------------------------------------
LN = {"x_shape": (2, 5, 8), "stats": (2, 5, 1), "count": 8.0}

#: Without gamma, a symbolic batch in float16: the statistics keep the batch.
LAYER_NORM_GRAD_UNSCALED_CASE = _norm_case(
    NormGradComposite(kind="layer_norm", scale=False), ("n", 5, 8), ("n", 5, 1), 8.0,
    dtype="float16", negatives=[
        _refused("batch_norm_statistics", "a layer norm reduces trailing axes",
                 (2, 7, 4, 3), (1, 7, 1, 1), 24.0, dtype="float16"),
        _refused("symbolic_normalised_axis",
                 "the statistics average a symbolic number of elements (n)",
                 (2, 5, "n"), (2, 5, 1), 8.0),
    ])

LAYER_NORM_GRAD_CASE = _norm_case(
    NormGradComposite(kind="layer_norm"), **LN, gamma=(8,), negatives=[
        _refused("batch_norm_statistics",
                 "the statistics reduce axes [0, 2, 3] and keep [1] of a rank-4 input: a "
                 "layer norm reduces trailing axes", (2, 7, 4, 3), (1, 7, 1, 1), 24.0,
                 gamma=(1, 7, 1, 1)),
        _refused("gamma_along_the_kept_axis",
                 "gamma varies along axes [1]: a layer norm's gamma scales the normalised "
                 "axes [2]", **LN, gamma=(5, 1)),
        _refused("divides_by_the_wrong_count",
                 "the gradient divides by [7.0], the statistics average 8 elements over "
                 "axes [2]", (2, 5, 8), (2, 5, 1), 7.0, gamma=(8,)),
        _refused("half_is_not_a_half", "no match", **LN, gamma=(8,), half=0.25),
        _refused("no_gamma", "no match", **LN),
        _refused("scaled_by_a_full_tensor",
                 "the upstream gradient is scaled by a tensor of shape (2, 5, 8), not by a "
                 "gamma that broadcasts against the input (2, 5, 8)", **LN, gamma=(2, 5, 8)),
        _refused("two_statistics_shapes",
                 "the statistics (2, 5, 1) and (2, 1, 1) are not one keepdims shape of the "
                 "input (2, 5, 8)", (2, 5, 8), (2, 5, 1), 8.0, gamma=(8,),
                 second_stats=(2, 1, 1)),
    ])


def test_layer_norm_grad_meets_the_rule_contract():
    check_rule(LAYER_NORM_GRAD_CASE)


def test_layer_norm_grad_unscaled_meets_the_rule_contract_in_float16_with_a_symbolic_batch():
    check_rule(LAYER_NORM_GRAD_UNSCALED_CASE)


# -- batch_norm_grad ------------------------------------------------------------------------------
BN = {"x_shape": (2, 7, 4, 3), "stats": (1, 7, 1, 1), "count": 24.0}

#: Without gamma, in float16, and without the running-statistics adjoints.
BATCH_NORM_GRAD_UNSCALED_CASE = _norm_case(
    NormGradComposite(kind="batch_norm", scale=False), **BN, dtype="float16", negatives=[
        _refused("layer_norm_statistics", "a batch norm keeps one channel axis", **LN,
                 dtype="float16"),
        _refused("a_batch_of_one",
                 "the statistics reduce axes [2, 3], not a batch: without a gamma to show "
                 "the channel axis this is a layer norm's gradient",
                 (1, 7, 4, 3), (1, 7, 1, 1), 12.0),
        _refused("no_reduction", "the statistics reduce no axis of the input",
                 (2, 7), (2, 7), 1.0),
    ])

BATCH_NORM_GRAD_CASE = _norm_case(
    NormGradComposite(kind="batch_norm"), **BN, gamma=(1, 7, 1, 1), upstream=True, negatives=[
        _refused("layer_norm_statistics",
                 "the statistics keep axes [0, 1] of a rank-3 input: a batch norm keeps one "
                 "channel axis", **LN, gamma=(8,)),
        _refused("gamma_along_a_reduced_axis",
                 "gamma varies along axes [3]: a batch norm's gamma scales its channel axis 1",
                 **BN, gamma=(3,)),
        Negative("statistics_without_shape", _module(_norm_grad_script(
            **BN, gamma=(1, 7, 1, 1)).replace(
                'xc: R.Tensor((2, 7, 4, 3), "float32")', 'xc: R.Tensor(ndim=4, dtype="float32")')),
            "the gradient or its statistics have no known shape"),
    ])


def test_batch_norm_grad_meets_the_rule_contract():
    check_rule(BATCH_NORM_GRAD_CASE)


def test_batch_norm_grad_unscaled_meets_the_rule_contract_in_float16():
    check_rule(BATCH_NORM_GRAD_UNSCALED_CASE)


# -- frozen_batch_norm_grad -----------------------------------------------------------------------
def _frozen(dy=(2, 7, 4, 3), gamma=(1, 7, 1, 1), std=(1, 7, 1, 1),
            dtype="float32") -> tvm.IRModule:
    """``(dy * gamma) / std`` on parameters (``dy="ndim"``: of unknown shape)."""
    dy_, gamma_, std_ = (relax.Var(name, relax.TensorType(shape, dtype) if shape != "ndim"
                                   else relax.TensorType(ndim=4, dtype=dtype))
                         for name, shape in (("dy", dy), ("gamma", gamma), ("std", std)))
    return pk.from_expr(relax.op.divide(relax.op.multiply(dy_, gamma_), std_))


def _frozen_script(composite: bool, batch="2", dtype="float32") -> str:
    x = f'R.Tensor(({batch}, 7, 4, 3), "{dtype}")'
    c = f'R.Tensor((1, 7, 1, 1), "{dtype}")'
    outer_x = x.replace("(n,", '("n",')
    sig = f"(dy{{p}}: {{x}}, gamma{{p}}: {c}, std{{p}}: {c}) -> {{x}}:"
    ops = "g = R.multiply(dy{p}, gamma{p})\n{i}dx = R.divide(g, std{p})\n{i}R.output(dx)"
    head = ("@I.ir_module\nclass Module:\n    @R.function\n"
            f"    def main{sig.format(p='', x=outer_x)}\n")
    if not composite:
        return (head + f"        with R.dataflow():\n            {ops.format(p='', i=' ' * 12)}\n"
                "        return dx\n")
    return (head + "        with R.dataflow():\n            @R.function\n"
            f"            def composite{sig.format(p='1', x=x)}\n"
            '                R.func_attr({"Composite": "byoc.frozen_batch_norm_grad", '
            '"PartitionedFromPattern": "multiply_divide_"})\n'
            "                with R.dataflow():\n"
            f"                    {ops.format(p='1', i=' ' * 20)}\n"
            "                return dx\n\n            dx = composite(dy, gamma, std)\n"
            "            R.output(dx)\n        return dx\n")


def _frozen_case(batch="2", dtype="float32") -> RuleCase:
    return RuleCase(
        FrozenBatchNormGradComposite(), _module(_frozen_script(False, batch, dtype)),
        _module(_frozen_script(True, batch, dtype)), negatives=[
            Negative("gradient_without_shape", _frozen(dy="ndim", dtype=dtype),
                     "the gradient has no known shape"),
            Negative("full_tensor_gamma", _frozen(gamma=(2, 7, 4, 3), dtype=dtype),
                     "not a batch norm's input gradient: gamma has shape (2, 7, 4, 3)"),
            Negative("gamma_and_std_on_different_axes", _frozen(std=(1, 1, 1, 3), dtype=dtype),
                     "gamma varies along axis 1 and std along axis 3"),
            Negative("per_sample_scale", _frozen(gamma=(2, 1, 1, 1), std=(2, 1, 1, 1),
                                                 dtype=dtype),
                     "gamma varies along axis 0 and std along axis 0"),
        ], tolerance=EXACT, positive=("std",))


FROZEN_BATCH_NORM_GRAD_CASE = _frozen_case()
FROZEN_BATCH_NORM_GRAD_SYMBOLIC_FP16_CASE = _frozen_case(batch="n", dtype="float16")


def test_frozen_batch_norm_grad_meets_the_rule_contract():
    check_rule(FROZEN_BATCH_NORM_GRAD_CASE)


def test_frozen_batch_norm_grad_meets_the_rule_contract_in_float16_with_a_symbolic_batch():
    check_rule(FROZEN_BATCH_NORM_GRAD_SYMBOLIC_FP16_CASE)


def test_every_example_of_the_space_forms_its_composite():
    """float16 and a symbolic batch included: each example is what Gradient emits."""
    import itertools

    for rule in BACKWARD:
        space = rule.example_space()
        for values in itertools.product(*space.values()):
            knobs = dict(zip(space, values))
            log = CompositeLog()
            merge_composite(rule.example(**knobs), [rule], log=log)
            assert [f.entry for f in log.formed] == [rule.name], (rule.name, knobs)


@pytest.mark.parametrize("rule", BACKWARD, ids=lambda rule: rule.name)
def test_the_float16_example_keeps_its_numbers_bit_for_bit(rule):
    """The last example of the space: float16, and a symbolic batch where there is one
    (the default float32 example is the library meta-test's)."""
    knobs = {name: values[-1] for name, values in rule.example_space().items()}
    before = rule.example(**knobs)
    pk.assert_same_numerics(before, merge_composite(before, [rule]), positive=("std",),
                            rtol=0.0, atol=0.0)


# -- on what pk.training.gradient emits ------------------------------------------------------------
def _formed(mod: tvm.IRModule, rules=BACKWARD) -> dict[str, int]:
    """Composite name -> how many ``MergeComposite`` formed on ``mod``."""
    log = CompositeLog()
    pk.MergeComposite(rules, log=log)(mod)
    names = [f.entry for f in log.formed]
    return {name: names.count(name) for name in sorted(set(names))}


def _adjoint(grad: tvm.IRModule, name: str = "main_adjoint") -> tvm.IRModule:
    """The adjoint function alone, the part an accelerator takes for the backward pass
    (the whole module partitions too: see the test after the layer-norm tests)."""
    return tvm.IRModule({name: grad[name]})


def _partitioned_and_inlined(grad: tvm.IRModule, compiler: str = "xpu") -> tvm.IRModule:
    """The library's composites (backward ones included) handed to ``compiler``, then the
    external functions inlined back for llvm."""
    merged = pk.MergeComposite(LIBRARY.for_compiler(compiler))(grad)
    return inline_external(pk.PartitionGraph(compiler)(merged))


def _seed_batch_norm(training: bool, batch=2) -> tvm.IRModule:
    """The seed's test, ``sum(batch_norm(data (batch, 7, 4, 3), per-channel params)[0])``."""
    data = relax.Var("data", relax.TensorType((batch, 7, 4, 3), "float32"))
    params = [relax.Var(n, relax.TensorType((7,), "float32"))
              for n in ("bn_gamma", "bn_beta", "bn_moving_mean", "bn_moving_var")]
    bn = relax.op.nn.batch_norm(data, *params, axis=1, epsilon=1e-5, training=training)
    return pk.from_expr(relax.op.sum(relax.TupleGetItem(bn, 0)))


def _layer_norm(batch=2, dtype="float32") -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((batch, 5, 8), dtype))
    gamma, beta = (relax.Var(n, relax.TensorType((8,), dtype)) for n in ("gamma", "beta"))
    return pk.from_expr(relax.op.sum(relax.op.nn.layer_norm(x, gamma, beta, axes=[-1])))


@pytest.mark.parametrize("canonical", [False, True], ids=["as_emitted", "canonicalized"])
def test_the_seed_batch_norm_gradient_in_training_mode_is_one_batch_norm_grad(canonical):
    grad = _adjoint(gradient(_seed_batch_norm(training=True)))
    if canonical:
        grad = relax.transform.CanonicalizeBindings()(grad)
    assert _formed(grad) == {"byoc.batch_norm_grad": 1}
    pk.assert_same_numerics(grad, _partitioned_and_inlined(grad), func_name="main_adjoint",
                            positive=("var",), rtol=0.0, atol=0.0)


def test_the_seed_batch_norm_gradient_with_running_statistics_is_one_frozen_batch_norm_grad():
    grad = _adjoint(gradient(_seed_batch_norm(training=False), wrt=["data", "bn_gamma", "bn_beta"]))
    assert _formed(grad) == {"byoc.frozen_batch_norm_grad": 1}
    pk.assert_same_numerics(grad, _partitioned_and_inlined(grad), func_name="main_adjoint",
                            positive=("var",), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("batch, cse", [(2, False), ("n", False), (2, True)],
                         ids=["static", "symbolic_batch", "after_cse"])
def test_a_layer_norm_gradient_is_one_layer_norm_grad(batch, cse):
    """After common-subexpression elimination the two ``dsq * xc`` are one binding."""
    size = tvm.tirx.Var("n", "int64") if batch == "n" else batch
    grad = _adjoint(gradient(_layer_norm(size)))
    if cse:
        grad = relax.transform.EliminateCommonSubexpr()(grad)
    assert _formed(grad) == {"byoc.layer_norm_grad": 1}
    pk.assert_same_numerics(grad, _partitioned_and_inlined(grad), func_name="main_adjoint",
                            rtol=0.0, atol=0.0)


def test_a_whole_gradient_module_partitions_with_its_primal_and_adjoint_composites():
    """The primal function keeps its ``layer_norm`` composite beside the adjoint's
    ``layer_norm_grad``; PartitionGraph takes both functions, and both keep their numbers."""
    grad = gradient(_layer_norm())
    assert _formed(grad, LIBRARY) == {"byoc.layer_norm": 1, "byoc.layer_norm_grad": 1}
    partitioned = pk.PartitionGraph("xpu")(pk.MergeComposite(LIBRARY.for_compiler("xpu"))(grad))
    assert relax.analysis.check_well_formed(partitioned)
    assert len(external_functions(partitioned, "xpu")) == 2
    assert composite_counts(partitioned) == {"xpu.layer_norm": 1, "xpu.layer_norm_grad": 1}
    out = inline_external(partitioned)
    for func in ("main", "main_adjoint"):
        pk.assert_same_numerics(grad, out, func_name=func, rtol=0.0, atol=0.0)


# -- real models -----------------------------------------------------------------------------------
def _model_gradient(model) -> tuple[tvm.IRModule, str, list]:
    adjoint = model.entry + "_loss_adjoint"
    grad = gradient(with_loss(model.mod, model.entry), func=model.entry + "_loss",
                    wrt=list(model.params))
    inputs = [model.inputs[n] for n in model.input_names] + list(model.params.values())
    return _adjoint(grad, adjoint), adjoint, inputs


@pytest.mark.models
def test_every_layer_norm_backward_of_a_two_layer_bert_is_a_layer_norm_grad(zoo):
    model = zoo("bert", layers=2, keep_params=True)
    grad, adjoint, inputs = _model_gradient(model)
    assert _formed(grad) == {"byoc.layer_norm_grad": model.families["layernorm"]}
    pk.assert_same_numerics(grad, _partitioned_and_inlined(grad), func_name=adjoint,
                            inputs=inputs, rtol=0.0, atol=0.0)


@pytest.mark.slow
@pytest.mark.models
def test_every_batch_norm_backward_of_resnet18_in_eval_mode_is_a_frozen_batch_norm_grad(zoo):
    model = zoo("resnet18", keep_params=True)
    grad, adjoint, inputs = _model_gradient(model)
    assert _formed(grad) == {"byoc.frozen_batch_norm_grad": model.families["batchnorm"]}
    pk.assert_same_numerics(grad, _partitioned_and_inlined(grad), func_name=adjoint,
                            inputs=inputs, rtol=0.0, atol=0.0)


@pytest.mark.models
def test_every_batch_norm_backward_of_resnet18_in_training_mode_is_a_batch_norm_grad(zoo):
    """The zoo's ResNet-18 exported in training mode: 20 batch norms with batch statistics.

    (Numerics through PartitionGraph are checked on the eval-mode ResNet and on the seed's
    training batch norm; two more llvm builds of this gradient cost a minute.)
    """
    import copy

    import torch
    from tvm.relax.frontend.torch import from_exported_program

    model = zoo("resnet18", keep_params=True)
    source = copy.deepcopy(model.source).train()  # the zoo's model is shared: leave it in eval
    pixels = torch.from_numpy(np.asarray(model.inputs["pixel_values"]))
    mod = from_exported_program(torch.export.export(source, (pixels,)),
                                unwrap_unit_return_tuple=True, keep_params_as_input=True)
    loss = with_loss(mod, "main")
    grad = _adjoint(gradient(loss, func="main_loss",
                             wrt=[p.name for p in loss["main_loss"].params[1:]]),
                    "main_loss_adjoint")
    assert _formed(grad) == {"byoc.batch_norm_grad": model.families["batchnorm"]}


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "resnet18", "gpt2"])
def test_backward_composites_never_form_on_forward_graphs(zoo, name):
    from patternkit.patterns import EXPANSIONS

    model = zoo(name)
    assert _formed(model.mod) == {}
    assert _formed(pk.rewrite(EXPANSIONS, model.mod, max_growth=None)) == {}
