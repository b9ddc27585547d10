"""The conv family's example modules: what its rules' ``example()`` build, and the tests reuse.

:func:`resnet_block` is ResNet's first block after batch-norm folding (the composites'
example), :func:`conv_batch_norm` a conv, an optional bias and an inference batch norm
(the fold's).  Their knobs reach the guards' edges: layouts, bias shapes that broadcast
along another axis, dtypes, a symbolic batch.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax

from patternkit.engine import NoSuchExample

#: How the examples spell each activation (relu6 as the torch importer writes it).
EXAMPLE_ACTIVATIONS = {
    "relu": relax.op.nn.relu,
    "silu": relax.op.nn.silu,
    "clip": lambda x: relax.op.clip(x, 0.0, 6.0),
}


def resnet_block(channels: int = 8, size: int = 16, seed: int = 0, layout: str = "NCHW",
                 kernel_layout: str = "OIHW", bias: str = "1C11",
                 bias_source: str = "constant", activation: str = "relu",
                 dtype: str = "float32", batch: int | str = 1) -> tvm.IRModule:
    """ResNet's first block after batch-norm folding, constants seeded.

    ``conv7x7/2 + bias + act -> max_pool -> conv3x3 + bias + act -> conv3x3 + bias``,
    then the residual ``add`` with the pooled value.

    Parameters
    ----------
    channels, size : int
        Channels of every conv, and ``x``'s spatial size (the last two convs see
        ``size / 4``: 4 channels with the default size make it the channel count).
    seed : int
        Seed of the constants.
    layout, kernel_layout : str
        Data layout of ``x`` and every op, kernel layout of every conv (the same
        weights, laid out accordingly).
    bias : {"1C11", "C11", "C", "1", "full", "none"}
        The shape of each bias as written: on the channel axis of the layout
        (``"1C11"``), right-aligned shapes that broadcast along another axis or none
        (``"C11"``, ``"C"``, ``"1"``), the conv output's whole shape, or no bias.
    bias_source : {"constant", "input"}
        Biases as constants or as inputs of ``main``.
    activation : {"relu", "silu", "clip", "none"}
        The activation after the first two biased convs (``"clip"`` is relu6 as the
        torch importer writes it); ``"none"``: none.
    dtype : str
        Of ``x`` and every weight and bias.
    batch : int or str
        ``N``; a string is a symbolic dimension.
    """
    act = None if activation == "none" else EXAMPLE_ACTIVATIONS[activation]
    rng = np.random.default_rng(seed)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    if bias == "full" and not isinstance(n, int):
        raise NoSuchExample("a full-tensor bias needs a static batch")

    def bias_shape(spatial):
        out_shape = {"N": n, "C": channels, "H": spatial, "W": spatial}
        return {"1C11": tuple(channels if a == "C" else 1 for a in layout),
                "C11": (channels, 1, 1), "C": (channels,), "1": (1,),
                "full": tuple(out_shape[a] for a in layout)}[bias]

    if bias == "none" and bias_source == "input":
        raise NoSuchExample("bias='none' has no bias to take as an input")
    spatial = (size // 2, size // 4, size // 4)  # of the three conv outputs
    inputs = [relax.Var(f"b{i}", relax.TensorType(bias_shape(s), dtype))
              for i, s in enumerate(spatial)] if bias_source == "input" else []

    def weight(out_channels, in_channels, k):
        oihw = rng.standard_normal((out_channels, in_channels, k, k)) * 0.2
        return relax.const(oihw.transpose(["OIHW".index(a) for a in kernel_layout])
                           .astype("float32"), dtype)

    def biased(bb, value, index, activation):
        if bias != "none":
            shape = bias_shape(spatial[index])
            if inputs:
                term = inputs[index]
            else:
                values = rng.standard_normal((1, channels, 1, 1)) * 0.2
                if bias == "full":
                    values = rng.standard_normal(shape) * 0.2
                term = relax.const(values.reshape(-1)[:int(np.prod(shape))]
                                   .reshape(shape).astype("float32"), dtype)
            try:
                value = bb.emit(relax.op.add(value, term))
            except ValueError as err:  # Relax's type inference: no broadcast
                raise NoSuchExample(f"a bias shaped {shape} does not broadcast against "
                                    f"{tuple(value.ty.shape)}") from err
        return bb.emit(activation(value)) if activation else value

    dims = {"N": n, "C": 3, "H": size, "W": size}
    x = relax.Var("x", relax.TensorType(tuple(dims[a] for a in layout), dtype))
    conv = functools.partial(relax.op.nn.conv2d, data_layout=layout,
                             kernel_layout=kernel_layout)
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *inputs]):
        with bb.dataflow():
            c = bb.emit(conv(x, weight(channels, 3, 7), strides=2, padding=3))
            r = biased(bb, c, 0, act)
            p = bb.emit(relax.op.nn.max_pool2d(r, pool_size=3, strides=2, padding=1,
                                               layout=layout))
            c = bb.emit(conv(p, weight(channels, channels, 3), padding=1))
            r = biased(bb, c, 1, act)
            c = bb.emit(conv(r, weight(channels, channels, 3), padding=1))
            a = biased(bb, c, 2, False)
            out = bb.emit_output(relax.op.add(a, p))
        bb.emit_func_output(out)
    return bb.get()


def conv_batch_norm(conv_bias: bool = False, training: bool = False, channels: int = 4,
                    seed: int = 0, layout: str = "NCHW", kernel_layout: str = "OIHW",
                    bias: str = "reshape", bn_axis: str = "channel", dtype: str = "float32",
                    out_dtype: str = "same", batch: int | str = 1,
                    op: str = "conv2d") -> tvm.IRModule:
    """``conv2d [+ bias] -> batch_norm[0] -> relu`` on ``x: (1, 3, 8, 8)``, constants seeded.

    Parameters
    ----------
    conv_bias : bool
        Add a bias between the conv and the batch norm.
    training : bool
        The batch norm's ``training`` flag.
    channels : int
        Output channels (8 equals the spatial size).
    seed : int
        Seed of the constants.
    layout, kernel_layout : str
        The conv's data (and output) layout and its kernel layout.
    bias : {"reshape", "1C11", "C11", "C", "1"}
        How the bias is spelled: ``"reshape"`` as the torch importer does (``reshape``
        of a ``(C,)`` constant to the output's channel axis), ``"1C11"`` a constant
        of that broadcast shape, ``"C11"``, ``"C"`` and ``"1"`` constants shaped so
        (right-aligned by broadcasting: on another axis, or on none).
    bn_axis : {"channel", "height"}
        The batch norm's axis, with parameters sized to match it.
    dtype : {"float32", "float16", "bfloat16", "int8"}
        Of ``x`` and the weight (``int8`` convolves into ``float32``).
    out_dtype : {"same", "float32", "cast_back"}
        The conv's ``out_dtype``; the bias and the batch norm take the output's.
        ``"cast_back"``: float32, the result cast straight back to ``dtype`` (a float16
        conv as ``ToMixedPrecision`` writes it).
    batch : int or str
        ``N``; a string is a symbolic dimension.
    op : {"conv2d", "conv1d", "conv2d_transpose"}
        The convolution: ``conv1d`` drops the height from ``layout`` and
        ``kernel_layout`` (``NCW``, ``OIW``); ``conv2d_transpose`` takes ``NCHW`` data
        and the ``OIHW`` knob as its ``IOHW`` kernel (input channels first).
    """
    if op == "conv1d" and bn_axis == "height":
        raise NoSuchExample("a conv1d output has no height to normalise along")
    if op == "conv2d_transpose" and (layout != "NCHW" or kernel_layout != "OIHW"):
        raise NoSuchExample("conv2d_transpose is built with NCHW data and an IOHW kernel")
    if op == "conv1d":
        layout, kernel_layout = layout.replace("H", ""), kernel_layout.replace("H", "")
    elif op == "conv2d_transpose":
        kernel_layout = "IOHW"
    rng = np.random.default_rng(seed)
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    accumulate = "float32" if dtype == "int8" or out_dtype != "same" else dtype
    cast_back = out_dtype == "cast_back"
    if cast_back and dtype in ("float32", "int8"):
        raise NoSuchExample("out_dtype='cast_back' accumulates a low-precision float conv")
    out = dtype if cast_back else accumulate
    dims = {"N": n, "C": 3, "H": 8, "W": 8}
    x = relax.Var("x", relax.TensorType(tuple(dims[a] for a in layout), dtype))
    kernel = {"O": channels, "I": 3, "H": 3, "W": 3}
    weight: np.ndarray
    if dtype == "int8":
        weight = rng.integers(-4, 4, tuple(kernel[a] for a in kernel_layout))
    else:
        weight = rng.standard_normal(tuple(kernel[a] for a in kernel_layout))
    bias_shape = {"1C11": tuple(channels if a == "C" else 1 for a in layout),
                  "C11": (channels, 1, 1), "C": (channels,), "1": (1,)}
    out_shape = tuple({"N": n, "C": channels, "H": 8, "W": 8}[a] for a in layout)
    axis = layout.index("C" if bn_axis == "channel" else "H")

    def const(values, as_dtype=out):
        return relax.const(np.asarray(values, dtype="float32"), as_dtype)

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(getattr(relax.op.nn, op)(
                x, relax.const(weight.astype("float32"), dtype), padding=1,
                data_layout=layout, kernel_layout=kernel_layout,
                out_dtype=None if accumulate == dtype else accumulate))
            if cast_back:
                y = bb.emit(relax.op.astype(y, dtype))
            if conv_bias and bias == "reshape":
                b = bb.emit(relax.op.reshape(const(rng.standard_normal(channels)),
                                             bias_shape["1C11"]))
                y = bb.emit(relax.op.add(y, b))
            elif conv_bias:
                try:
                    y = bb.emit(relax.op.add(y, const(rng.standard_normal(bias_shape[bias]))))
                except ValueError as err:  # Relax's type inference: no broadcast
                    raise NoSuchExample(f"a bias shaped {bias_shape[bias]} does not "
                                        f"broadcast against {out_shape}") from err
            size = out_shape[axis]
            bn = bb.emit(relax.op.nn.batch_norm(
                y, const(rng.uniform(0.5, 1.5, size)), const(rng.standard_normal(size)),
                const(rng.standard_normal(size)), const(rng.uniform(0.5, 2.0, size)),
                axis=axis, training=training))
            result = bb.emit_output(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
        bb.emit_func_output(result)
    return bb.get()

