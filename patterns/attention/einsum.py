"""``attention.einsum_matmul``: an einsum that ``torch.export`` decomposed, back to one matmul.

``torch.einsum("bhqd,bhkd->bhqk", q, k)`` and ``torch.einsum("bhqk,bhkd->bhqd", p, v)``
(attention written with einsum) reach Relax through the torch importer decomposed, as
aten's ``sumproduct_pair`` writes them: each operand ``expand_dims``-ed for the labels it
lacks, permuted (twice) into ``(batch labels, kept labels, summed labels)`` and reshaped to
3-D; one ``bmm``; the result reshaped back to the labels, permuted into the output's order
and reshaped to drop the unit axes.  Eleven bindings for one matmul, spread over 5-D
tensors: ``attention.collapse`` reads 4-D matmuls, so it would see nothing.  This rule
writes the same product as the 4-D matmul it is::

    einsum("bhqd,bhkd->bhqk", q, k)  ->  matmul(q, permute_dims(k, [0, 1, 3, 2]))
    einsum("bhqk,bhkd->bhqd", p, v)  ->  matmul(p, v)

after which ``attention.collapse`` takes the attention in its 4-D (ONNX-like) form.

How the rule proves it: every axis of the two 4-D sources that is not provably 1 is an
*atom*; the chain of ``expand_dims`` / ``permute_dims`` / ``reshape`` is followed atom by
atom (a reshape may only merge consecutive atoms or split a merged group back at atom
boundaries, the unit axes carrying no data), through the 3-D matmul (its batch atoms
paired with the right operand's, its contracted atoms too, extents proven equal), to the
4-D result.  The 4-D matmul exists when each side has at most two batch atoms and one
row, contracted and column atom, and every axis of the result is one atom or a unit
axis; the permutations of the sources and of the result are then read off the atoms.
Symbolic dimensions are compared with the arithmetic analyzer, so a dynamic batch and
sequence collapse too.  The matmul keeps its ``out_dtype`` and the cast after it (a
float16 model's importer accumulates in float32 and casts back).

Refused with reasons (each names what differs): an operand or the result of unknown
shape, a reshape that splits an atom or scrambles the axes, a matmul that pairs axes of
other extents, more axes in a group than a 4-D matmul has, sources or a result not 4-D.

Not here: the ONNX exporters (TorchScript and dynamo) keep ``Einsum``, which
``from_onnx`` 0.27 imports as a ``call_tir`` of ``topi.einsum``; the einsum family
(:mod:`patternkit.patterns.einsum`) lifts it back to ``R.einsum`` and writes that as the
4-D matmuls, which ``attention.collapse`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from patternkit.dpl import DFPattern, alt, is_op, wildcard
from patternkit.engine import RewriteRule, RoleMatch, reject
from patternkit.ir import call_args, int_list, prove_equal, static_shape, type_of

from .layout import IDENTITY, shape_text

#: An atom: ``("a", axis)`` / ``("b", axis)``, an axis of the left or right source.
Atom = tuple[str, int]
#: The atoms of each axis of a tensor, in order (an empty group: a unit axis).
Groups = list[list[Atom]]


class Unfit(Exception):
    """Why the matched chain is not a 4-D matmul (the rule's refusal reason)."""

    def __init__(self, reason: str, at: Any):
        super().__init__(reason)
        self.reason, self.at = reason, at


@dataclass(frozen=True)
class EinsumPlan:
    """``permute_dims(matmul(permute_dims(a, a_axes), permute_dims(b, b_axes)), out_axes)``."""

    a_axes: tuple[int, ...]
    b_axes: tuple[int, ...]
    out_axes: tuple[int, ...]


def _operand(side: str) -> tuple[DFPattern, DFPattern, DFPattern, DFPattern, DFPattern]:
    """``reshape(permute_dims{0,1,2}(expand_dims(source)))``: source, its three steps, root."""
    source = wildcard()
    expanded = is_op("expand_dims")(source)
    once = is_op("permute_dims")(expanded)
    twice = is_op("permute_dims")(once)
    chain = alt(tag=f"{side}_permutes", twice=twice, once=once, none=expanded)
    return source, expanded, once, twice, is_op("reshape")(chain, varg_default_wildcard=True)


class EinsumMatmul(RewriteRule):
    """Rewrite a 4-D einsum that ``torch.export`` decomposed into one 4-D ``matmul``.

    The chains of ``expand_dims``, ``permute_dims`` and ``reshape`` around a 3-D
    ``matmul`` are followed axis by axis; see the module docstring.
    """

    name = "attention.einsum_matmul"

    def __init__(self, rewrite_once: bool = False):
        super().__init__(rewrite_once=rewrite_once)
        (self.a, self.a_expanded, self.a_once, self.a_twice, a_root) = _operand("a")
        (self.b, self.b_expanded, self.b_once, self.b_twice, b_root) = _operand("b")
        self.product = is_op("matmul")(a_root, b_root)
        self.cast = is_op("astype")(self.product)
        self.split = is_op("reshape")(alt(tag="accumulate", cast=self.cast,
                                          plain=self.product), varg_default_wildcard=True)
        self.out_permute = is_op("permute_dims")(self.split)
        self.pattern: DFPattern = is_op("reshape")(
            alt(tag="out_permutes", once=self.out_permute, none=self.split),
            varg_default_wildcard=True)

    # -- check -------------------------------------------------------------------------
    def check(self, match: RoleMatch) -> Any:
        """An :class:`EinsumPlan` when the chains are a 4-D matmul's operands and result."""
        try:
            return self._plan(match)
        except Unfit as unfit:
            return reject(unfit.reason, at=unfit.at)

    def _side(self, match: RoleMatch, side: str) -> tuple[Groups, dict[Atom, Any], int]:
        """The atoms of the matmul's ``side`` operand, their extents, the source's rank."""
        source = match[side]
        shape = _known(source, f"the einsum's {'left' if side == 'a' else 'right'} operand")
        extents = {(side, i): d for i, d in enumerate(shape) if not _unit(d)}
        groups: Groups = [[(side, i)] if (side, i) in extents else [] for i in range(len(shape))]
        expanded = match[f"{side}_expanded"]
        groups = _expanded(groups, expanded)
        permutes = {"twice": ("once", "twice"), "once": ("once",), "none": ()}
        for step in permutes[match.tag(f"{side}_permutes") or "none"]:
            groups = _permuted(groups, match[f"{side}_{step}"])
        operand = call_args(match.product)[0 if side == "a" else 1]
        groups = _regrouped(groups, extents, operand)
        return groups, extents, len(shape)

    def _plan(self, match: RoleMatch) -> EinsumPlan:
        left, a_extents, a_rank = self._side(match, "a")
        right, b_extents, b_rank = self._side(match, "b")
        product = match.product
        if len(left) != 3 or len(right) != 3:
            raise Unfit(f"the einsum's matmul is {len(left)}-D by {len(right)}-D, not the "
                        f"3-D batched matmul of torch's einsum", product)
        extents = {**a_extents, **b_extents}
        for what, lhs, rhs in (("batch", left[0], right[0]), ("contracted", left[2], right[1])):
            if len(lhs) != len(rhs) or not all(prove_equal(extents[x], extents[y])
                                               for x, y in zip(lhs, rhs)):
                raise Unfit(f"the matmul pairs the {what} axes {_atoms_text(lhs, extents)} "
                            f"with {_atoms_text(rhs, extents)}: not axis for axis of the "
                            f"same extents", product)
        pairs = dict(zip(right[0], left[0]))  # a right batch atom is its left partner
        groups: Groups = [list(left[0]), list(left[1]), list(right[2])]
        split = match.split
        groups = _regrouped(groups, extents, split)
        if match.tag("out_permutes") == "once":
            groups = _permuted(groups, match.out_permute)
        groups = _regrouped(groups, extents, match.root)
        if a_rank != 4 or b_rank != 4 or len(groups) != 4:
            raise Unfit(f"the einsum reads {a_rank}-D and {b_rank}-D tensors into a "
                        f"{len(groups)}-D result: a 4-D matmul takes 4-D ones", match.root)
        sizes = (("batch", left[0], 2), ("row", left[1], 1), ("contracted", left[2], 1),
                 ("column", right[2], 1))
        for what, atoms, most in sizes:
            if len(atoms) > most:
                raise Unfit(f"the einsum's {what} axes are {len(atoms)} "
                            f"({_atoms_text(atoms, extents)}): a 4-D matmul has at most "
                            f"{most}", product)
        a_slots = [*_padded(left[0], 2), *_padded(left[1], 1), *_padded(left[2], 1)]
        b_slots = [*_padded(right[0], 2), *_padded(right[1], 1), *_padded(right[2], 1)]
        out_slots = [*_padded(left[0], 2), *_padded(left[1], 1), *_padded(right[2], 1)]
        for group in groups:
            if len(group) > 1:
                raise Unfit(f"the einsum's result merges the axes "
                            f"{_atoms_text(group, extents)} into one: not a permutation "
                            f"of a 4-D matmul's", match.root)
        final = [pairs.get(g[0], g[0]) if g else None for g in groups]
        return EinsumPlan(_axes_for(a_slots), _axes_for(b_slots),
                          _axes_from(out_slots, final, match.root))

    # -- rewrite -----------------------------------------------------------------------
    def rewrite(self, match: RoleMatch) -> Any:
        """``[permute_dims](matmul(permute_dims(a), permute_dims(b)))``, cast as before."""
        plan: EinsumPlan = match.plan
        a, b = (_permute(match[s], axes) for s, axes in (("a", plan.a_axes),
                                                           ("b", plan.b_axes)))
        out = relax.op.matmul(a, b, out_dtype=str(match.product.attrs.out_dtype))
        if match.tag("accumulate") == "cast":
            out = relax.op.astype(out, str(match.cast.attrs.dtype))
        return _permute(out, plan.out_axes)

    def example(self, **knobs: Any) -> tvm.IRModule:
        """:func:`einsum_attention` with ``knobs``: the importer's two einsums."""
        return einsum_attention(**knobs)

    def example_space(self) -> dict[str, Sequence[Any]]:
        """Both dtypes, static and symbolic shapes, the head layouts einsum names."""
        return {"dtype": ("float32", "float16"), "shape": ("static", "symbolic"),
                "layout": ("bhqd", "bqhd")}


# -- the atom algebra ------------------------------------------------------------------------
def _unit(dim: Any) -> bool:
    """The axis is provably of extent 1 (it carries no data)."""
    return prove_equal(dim, 1)


def _known(expr: Any, what: str) -> tuple:
    shape = static_shape(type_of(expr))
    if shape is None:
        raise Unfit(f"{what} has no known shape: cannot follow its axes", expr)
    return tuple(shape)


def _expanded(groups: Groups, call: Any) -> Groups:
    """``groups`` after ``expand_dims(axis=...)``: unit axes inserted."""
    axes = int_list(call.attrs.axis) or []
    rank = len(groups) + len(axes)
    inserted = sorted(a % rank for a in axes)
    out: Groups = []
    source = iter(groups)
    for i in range(rank):
        out.append([] if i in inserted else next(source))
    return out


def _permuted(groups: Groups, call: Any) -> Groups:
    """``groups`` after ``permute_dims``."""
    axes = int_list(call.attrs.axes)
    order = list(reversed(range(len(groups)))) if axes is None else axes
    return [groups[a] for a in order]


def _regrouped(groups: Groups, extents: dict[Atom, Any], expr: Any) -> Groups:
    """``groups`` reshaped to the shape of ``expr``: each new axis takes consecutive atoms
    until their product is its extent (a unit axis takes none); an atom is never split.
    """
    target = _known(expr, "the reshape")
    atoms = [atom for group in groups for atom in group]
    out: Groups = []
    position = 0
    for extent in target:
        group: list[Atom] = []
        size: Any = 1
        while not prove_equal(size, extent):
            if position == len(atoms) or _unit(extent):
                raise Unfit(f"the reshape to {shape_text(target)} splits or scrambles the "
                            f"axes {_atoms_text(atoms, extents)}: not a regrouping of "
                            f"whole axes", expr)
            group.append(atoms[position])
            size = size * extents[atoms[position]]
            position += 1
        out.append(group)
    if position != len(atoms):
        raise Unfit(f"the reshape to {shape_text(target)} leaves the axes "
                    f"{_atoms_text(atoms[position:], extents)} out: not a regrouping of "
                    f"whole axes", expr)
    return out


def _padded(atoms: list[Atom], slots: int) -> list[Atom | None]:
    return [*atoms, *[None] * (slots - len(atoms))]


def _axes_for(slots: list[Atom | None]) -> tuple[int, ...]:
    """The permutation of the 4-D ``source`` putting its atoms in ``slots`` (its unit axes
    fill the empty slots, in order).
    """
    used = {atom[1] for atom in slots if atom is not None}
    units = iter(i for i in range(4) if i not in used)
    return tuple(next(units) if atom is None else atom[1] for atom in slots)


def _axes_from(slots: list[Atom | None], final: list[Atom | None], root: Any) -> tuple[int, ...]:
    """The permutation of the 4-D matmul's result (atoms ``slots``) that is ``final``."""
    units = iter(i for i, atom in enumerate(slots) if atom is None)
    axes = []
    for atom in final:
        if atom is None:
            axes.append(next(units, -1))
        elif atom in slots:
            axes.append(slots.index(atom))
        else:
            axes.append(-1)
    if sorted(axes) != list(range(4)):  # an atom the matmul contracted cannot come back
        raise Unfit("the einsum's result is not a permutation of the matmul's axes", root)
    return tuple(axes)


def _permute(expr: Any, axes: tuple[int, ...]) -> Any:
    return expr if axes == IDENTITY else relax.op.permute_dims(expr, list(axes))


def _atoms_text(atoms: Sequence[Atom], extents: dict[Atom, Any]) -> str:
    names = {"a": "left", "b": "right"}
    return "[" + ", ".join(f"{names[s]} axis {i} ({extents[(s, i)]})" for s, i in atoms) + "]"


#: The aten decomposition's steps for one operand: ``expand_dims`` axes, two permutations.
_Steps = tuple[list[int], list[int], list[int]]


# -- examples (the rule's example(), the tests and `patternkit verify`) --------------------
def einsum_attention(dtype: str = "float32", shape: str = "static", layout: str = "bhqd",
                     scale: float = 0.25, pairing: str = "heads",
                     regroup: str = "heads", scores_only: bool = False) -> tvm.IRModule:
    """Attention written with two einsums over ``q, k, v: (B, N, S, 16)``, as the torch
    importer decomposes them (``layout="bqhd"``: the sources BSNH, the einsums
    ``"bqhd,bkhd->bhqk"`` and ``"bhqk,bkhd->bqhd"``).

    ``pairing="scrambled"`` merges the key's heads before its batch (4 batches of 2
    heads: the matmul pairs axes of other extents, a negative); ``regroup="scrambled"``
    reshapes the scores to ``(B, S, N, T)`` (a negative: not whole axes).
    ``scores_only``: the function returns the scaled scores (the first einsum alone).
    """
    batch: Any
    seq: Any
    batch, seq, heads, dim = (4 if pairing == "scrambled" else 2), 8, 2, 16
    if shape == "symbolic":
        batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    sources = (batch, heads, seq, dim) if layout == "bhqd" else (batch, seq, heads, dim)
    q, k, v = (relax.Var(n, relax.TensorType(sources, dtype)) for n in "qkv")
    wide = "float32"
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def chain(x: Any, steps: _Steps, to: tuple) -> Any:
                out = bb.emit(relax.op.expand_dims(x, steps[0]))
                out = bb.emit(relax.op.permute_dims(out, steps[1]))
                out = bb.emit(relax.op.permute_dims(out, steps[2]))
                return bb.emit(relax.op.reshape(out, to))

            def product(lhs: Any, rhs: Any, split: tuple, back: list[int], to: tuple) -> Any:
                out = bb.emit(relax.op.matmul(lhs, rhs, out_dtype=wide))
                if dtype != wide:
                    out = bb.emit(relax.op.astype(out, dtype))
                out = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(out, split)),
                                                    back))
                return bb.emit(relax.op.reshape(out, to))

            if layout == "bhqd":  # "bhqd,bhkd->bhqk" then "bhqk,bhkd->bhqd"
                q_steps = ([4], [0, 1, 2, 4, 3], [0, 1, 2, 4, 3])
                k_steps = ([4], [0, 1, 4, 2, 3], [0, 1, 4, 3, 2])
                p_steps = ([4], [0, 1, 2, 4, 3], [0, 1, 2, 4, 3])
                v_steps = ([4], [0, 1, 4, 3, 2], [0, 1, 4, 3, 2])
            else:  # "bqhd,bkhd->bhqk" then "bhqk,bkhd->bqhd"
                q_steps = ([4], [0, 2, 1, 4, 3], [0, 1, 2, 4, 3])
                k_steps = ([4], [0, 2, 4, 1, 3], [0, 1, 4, 3, 2])
                p_steps = ([4], [0, 2, 1, 4, 3], [0, 2, 1, 4, 3])
                v_steps = ([4], [0, 4, 2, 3, 1], [0, 2, 4, 3, 1])
            merged = batch * heads
            k_merged = (merged, dim, seq)
            qs = chain(q, q_steps, (merged, seq, dim))
            if pairing == "scrambled":  # heads before batch: (h, b, d, k, 1)
                k_steps = (k_steps[0], [1, 0, 4, 2, 3], k_steps[2])
            ks = chain(k, k_steps, k_merged)
            scores = product(qs, ks, (batch, heads, seq, 1, seq), [0, 1, 2, 4, 3],
                             (batch, seq, heads, seq) if regroup == "scrambled"
                             else (batch, heads, seq, seq))
            scores = bb.emit(relax.op.multiply(scores, relax.const(np.array(scale, dtype))))
            if scores_only:
                result = bb.emit_output(scores)
            else:
                result = bb.emit_output(_second_einsum(bb, scores, v, layout, p_steps, v_steps,
                                                       chain, product, (batch, heads, seq,
                                                                        dim)))
        bb.emit_func_output(result)
    return bb.get()


def _second_einsum(bb: relax.BlockBuilder, scores: Any, v: Any, layout: str, p_steps: _Steps,
                   v_steps: _Steps, chain: Any, product: Any, dims: tuple) -> Any:
    """``einsum("bhqk,bhkd->bhqd", softmax(scores), v)`` (or into BSNH), decomposed."""
    batch, heads, seq, dim = dims
    p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    ps = chain(p, p_steps, (batch * heads, seq, seq))
    vs = chain(v, v_steps, (batch * heads, seq, dim))
    if layout == "bhqd":
        return product(ps, vs, (batch, heads, seq, 1, dim), [0, 1, 2, 4, 3],
                       (batch, heads, seq, dim))
    return product(ps, vs, (batch, heads, seq, 1, dim), [0, 2, 1, 4, 3],
                   (batch, seq, heads, dim))
