"""The gated-MLP composites' guards: what a backend's fused SwiGLU / GeGLU kernel assumes.

Each guard returns ``None`` when the condition holds and the :func:`patternkit.reject`
refusal (reason and expression) when it does not: a weight's ``permute_dims`` that is no
transpose, an added tensor that is no per-feature bias, a multiply that broadcasts, a
packed projection not split into a gate half and an up half.
"""

from __future__ import annotations

from typing import Any

from patternkit.engine import RoleMatch, reject
from patternkit.ir import (
    NotPerChannel,
    per_channel_axis,
    round_trips_wider,
    same_shape,
    static_shape,
    type_of,
)


def transpose_refusal(match: RoleMatch, projection: str) -> Any:
    """``None`` unless the projection's ``permute_dims`` does not swap the weight's last axes."""
    if match.tag(f"{projection}_weight") != "transposed":
        return None
    permute = match[f"{projection}_permute"]
    rank = getattr(type_of(match[f"{projection}_weight"]), "ndim", -1)
    raw = permute.attrs.axes
    axes = None if raw is None else [int(a) for a in raw]
    if rank >= 2 and (axes == [*range(rank - 2), rank - 1, rank - 2] or axes is None and rank == 2):
        return None
    return reject(f"the {projection} projection's permute_dims(weight, axes={axes}) does not "
                  f"swap the last two axes of its rank-{rank} weight: the product is not "
                  f"x @ weight^T", at=permute)


def bias_refusal(match: RoleMatch, projection: str) -> Any:
    """``None`` unless the projection adds a tensor that is no per-feature bias."""
    if match.tag(f"{projection}_bias") != "biased":
        return None
    bias = match[f"{projection}_bias"]
    out_shape = static_shape(type_of(match.var_of(f"{projection}_matmul")))
    bias_shape = static_shape(type_of(bias))
    try:
        axis = per_channel_axis(bias_shape, out_shape or (), name="it", of="the product")
    except NotPerChannel as why:
        axis, detail = -1, str(why)
    else:
        detail = f"it varies along axis {axis}"
    if out_shape is not None and axis == len(out_shape) - 1:
        return None
    return reject(f"the {projection} projection adds a tensor of shape {bias_shape} that is "
                  f"not a per-feature bias of its product {out_shape}: {detail}", at=bias)


def broadcast_refusal(match: RoleMatch) -> Any:
    """``None`` unless the multiply's two operands differ in shape (it broadcasts)."""
    gate, up = (static_shape(type_of(arg)) for arg in match.multiply.args)
    if same_shape(gate, up):
        return None
    return reject(f"the multiply broadcasts operands of shapes {gate} and {up}: a gated MLP "
                  f"multiplies the gate and the up product elementwise", at=match.multiply)


def cast_refusal(match: RoleMatch, projection: str) -> Any:
    """``None`` unless the projection's product is cast to another dtype than ``x``'s (a
    float32 accumulation cast back is the same MLP; a cast elsewhere changes its precision).
    """
    if match.tag(f"{projection}_accumulation") != "narrowed":
        return None
    cast = match[f"{projection}_cast"]
    to, of_x = str(type_of(cast).dtype), str(type_of(match.x).dtype)
    if to == of_x:
        return None
    return reject(f"the {projection} projection's product is cast to {to}, not back to the "
                  f"input's {of_x}: the MLP does not compute in its input's dtype", at=cast)


def activation_cast_refusal(match: RoleMatch) -> Any:
    """``None`` unless the activation's casts are no round trip through a float at least as
    wide as the gate's dtype.
    """
    widened, narrowed = match.tag("activation_input"), match.tag("activation_output")
    if widened == "direct" and narrowed == "direct":
        return None
    read = match.activation_widened.args[0] if widened == "widened" else match.activation.args[0]
    gate = str(type_of(read).dtype)
    inner = str(type_of(match.var_of("activation")).dtype)
    out = str(type_of(match.var_of("activation_narrowed")).dtype) if narrowed == "narrowed" \
        else inner
    if round_trips_wider(gate, inner, out):
        return None
    return reject(f"the activation computes in {inner} on a {gate} gate and gives {out}: "
                  f"only a round trip through a float as wide or wider (the gate cast up, "
                  f"the activation cast back) is the same gated MLP", at=match.activation)


def split_refusal(match: RoleMatch) -> Any:
    """``None`` unless the packed projection's halves are not two equal halves of its last
    axis read as two different parts: the items of one ``split``, or two ``strided_slice``.
    """
    forms = (match.tag("gate_half"), match.tag("up_half"))
    if forms == ("sliced", "sliced"):
        return slices_refusal(match)
    if forms != ("split", "split"):
        return reject(f"the gate is read {_FORM[forms[0]]} and the up product "
                      f"{_FORM[forms[1]]} of the packed projection: a packed gate and up "
                      f"projection is cut in two halves one way", at=match.multiply)
    split = match.split
    parts = type_of(match.var_of("split")).fields
    rank = len(static_shape(type_of(match.var_of("packed"))) or ())
    axis = int(split.attrs.axis)
    shapes = [static_shape(part) for part in parts]
    if len(parts) != 2 or axis % max(rank, 1) != rank - 1 or not same_shape(*shapes):
        return reject(f"the packed projection is split into {len(parts)} parts of shapes "
                      f"{shapes} along axis {axis}: a packed gate and up projection is split "
                      f"into two equal halves of its last axis", at=split)
    if int(match.gate.index) == int(match.up.index):
        return reject(f"the activation and the multiply read the same half "
                      f"({int(match.gate.index)}) of the packed projection: not a gate times "
                      f"an up product", at=match.multiply)
    return None


#: How each form of a packed half reads, for the refusal of mixed forms.
_FORM = {"split": "as an item of a split", "sliced": "by a strided_slice"}


def slices_refusal(match: RoleMatch) -> Any:
    """``None`` unless the two ``strided_slice`` halves are not ``[0, h)`` and ``[h, 2h)``
    (either way round) of the packed product's static last axis, stride 1.
    """
    # the slices' input: the packed product, reshaped back to x's rank when x is 3-D
    shape = static_shape(type_of(match.gate.args[0])) or ()
    width = shape[-1] if shape and isinstance(shape[-1], int) else None
    gate, up = (read_lanes(call, len(shape), width) for call in (match.gate, match.up))
    if width is not None and width % 2 == 0 and gate is not None and up is not None:
        half = width // 2
        if {gate, up} == {(0, half), (half, width)}:
            return None
    return reject(f"the packed projection's halves are sliced as {_lanes_text(gate)} (the "
                  f"gate) and {_lanes_text(up)} (the up product) of its last axis of "
                  f"{width if width is not None else 'unknown'} lanes: a packed gate and up "
                  f"projection is cut in two equal halves of its last axis", at=match.gate)


def read_lanes(call: Any, rank: int, width: int | None) -> tuple[int, int] | None:
    """``(begin, end)`` lanes of the last axis ``call`` (a ``strided_slice``) takes with
    stride 1, bounds clamped to ``[0, width]``; ``None`` when it slices another axis,
    several axes, with another stride, or with bounds that are not constants.
    """
    try:
        axes, begins, ends, strides = ([int(e.value) for e in arg.fields]
                                       for arg in call.args[1:5])
    except (AttributeError, TypeError, ValueError, IndexError):
        return None
    if width is None or len(axes) != 1 or axes[0] % max(rank, 1) != rank - 1:
        return None
    if len(begins) != 1 or len(ends) != 1 or strides not in ([1], []):
        return None

    def lane(bound: int) -> int:
        return min(max(bound + width if bound < 0 else bound, 0), width)

    return lane(begins[0]), lane(ends[0])


def _lanes_text(lanes: tuple[int, int] | None) -> str:
    return "other than one run of lanes" if lanes is None else f"[{lanes[0]}, {lanes[1]})"
