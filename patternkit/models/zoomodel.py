"""What a zoo entry gives back: :class:`ZooModel`, its inputs, its resolved spec and errors.

A :class:`ZooModel` is everything a test, a benchmark or the main job needs to run a real
model through patternkit and judge the result: the Relax module, a reference that says
what the right numbers are (the torch module, or onnx's reference evaluator), seeded
example inputs with the ranges integer inputs must stay in, and the number of instances
of each rule family (layer norms, GELUs, attentions...) counted in the source model, so
that a coverage table can compare what was present with what the library collapsed.

A model read from the import cache (:mod:`patternkit.models.import_cache`) is rebuilt from
its :func:`description` without torch: its ``source`` (the torch module) and its
reference are built the first time something reads them (:class:`Deferred`), so a run
that only rewrites and checks the Relax module never imports torch or transformers.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from ..errors import PatternkitError

if TYPE_CHECKING:
    import tvm


class ZooError(PatternkitError):
    """A zoo spec that cannot be served: unknown model or option, bad value, missing extra."""


class ZooImportError(ZooError):
    """The model was built, but exporting it or importing it into Relax failed.

    Raised for the variants TVM 0.27 cannot import (for example SDPA attention); the
    exporter's or importer's own exception is chained as ``__cause__``.
    """


#: Rule families counted in every zoo model; the names are the library's rule prefixes
#: (``LIBRARY.by_prefix("layernorm.")``), plus ``conv2d`` for the conv composites.
FAMILIES = ("layernorm", "rmsnorm", "gelu", "gelu_tanh", "silu", "softmax", "attention",
            "batchnorm", "conv2d")


@dataclass(frozen=True)
class ZooSpec:
    """A zoo entry with every option resolved (defaults filled in): the cache key.

    Attributes
    ----------
    name : str
        The entry name (``"gpt2"``, ``"onnx:bert"``).
    options : tuple of (str, value)
        Every option of the entry, sorted by name.
    text : str
        The canonical spec, naming only the options that differ from their defaults.
    """

    name: str
    options: tuple[tuple[str, Any], ...]
    text: str

    def __getitem__(self, option: str) -> Any:
        return dict(self.options)[option]

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain ``dict``."""
        return dict(self.options)


@dataclass(frozen=True)
class InputSpec:
    """One input of a zoo model.

    Attributes
    ----------
    name : str
        The entry function's parameter name.
    dtype : str
        ``"int64"`` (token ids, type ids, masks) or ``"float32"``.
    shape : tuple of int or str
        Static sizes, or a dimension role (``"batch"``, ``"seq"``) resolved per call.
    low, high : int, optional
        Integer inputs only: valid values ``v`` satisfy ``low <= v < high`` (``high`` is the
        embedding table size for ids; reading outside it is out of bounds).
    fill : int, optional
        The example value of every element (attention masks are all ones: the models
        must be exported with an explicit mask, see the module docstring of
        :mod:`patternkit.models.zoo`), instead of a random draw in ``[low, high)``.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    low: int | None = None
    high: int | None = None
    fill: int | None = None

    @property
    def is_integer(self) -> bool:
        """Whether the input holds integers (token ids, positions)."""
        return np.dtype(self.dtype).kind in "iu"

    @property
    def bounds(self) -> tuple[int, int]:
        """``(low, high)`` of an integer input (an error if it was given none)."""
        if self.low is None or self.high is None:
            raise ZooError(f"input {self.name!r}: an integer input needs low= and high=")
        return self.low, self.high

    def concrete_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with each symbolic dimension replaced by its size."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)

    def draw(self, sizes: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
        """A seeded example value; integers stay inside ``[low, high)``."""
        shape = self.concrete_shape(sizes)
        if self.fill is not None:
            return np.full(shape, self.fill, dtype=self.dtype)
        if self.is_integer:
            low, high = self.bounds
            return rng.integers(low, high, size=shape, dtype=self.dtype)
        return rng.standard_normal(size=shape).astype(self.dtype)


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


def _read_only(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)  # shared through the build cache: nobody may change it
    return array


class Deferred:
    """A zoo model's source and reference, built on first use.

    ``build()`` returns ``(source, reference_fn)``; a :class:`ZooModel` given
    ``source=Deferred(build)`` (and ``reference_fn=None``) calls it the first time its
    ``source`` or its reference is read, once.
    """

    def __init__(self, build: Callable[[], tuple[Any, Callable[..., list[np.ndarray]]]]):
        self.build = build
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return "Deferred(built on first use)"


@dataclass(frozen=True, eq=False)
class ZooModel:
    """A real model imported into Relax, with what it takes to check it.

    Instances are cached and shared (see :func:`patternkit.models.zoo_model`): the
    IRModule is immutable, the arrays are read-only; do not change the torch module.

    Attributes
    ----------
    spec : ZooSpec
        The spec that built it; ``spec.text`` is the canonical ``zoo:...`` string.
    mod : tvm.IRModule
        The imported module; its entry function is ``entry`` (``main`` unless renamed).
    entry : str
        Name of the entry function.
    input_specs : tuple of InputSpec
        The data inputs, in the entry function's parameter order.
    sizes : Mapping[str, int]
        The example size of each dimension role (``{"batch": 2, "seq": 8}``).
    symbolic_dims : Mapping[str, str]
        Dynamic roles -> the name of their symbolic variable in the entry function
        (``{"batch": "s43"}``); empty for a static model.
    dim_bounds : Mapping[str, tuple[int, int or None]]
        Inclusive bounds of each role's size (``seq`` is bounded by the position table;
        ``None``: unbounded).
    params : Mapping[str, numpy.ndarray]
        With ``keep_params=true`` the weights, in parameter order after the inputs (the
        entry function takes them as arguments); else empty (weights are constants).
    families : Mapping[str, int]
        Instances of each family of :data:`FAMILIES` in the source model, counted from
        its torch modules (norms, activations, attention blocks) and its traced program
        (softmax); see :mod:`patternkit.models.families`.
    source : object
        The torch module (``torch.nn.Module``, in eval mode) or the ``onnx.ModelProto``;
        built when first read for a model read from the import cache.
    metadata : Mapping[str, Any]
        Facts about the build (config sizes, GELU form, attention implementation,
        exporter, opset, ONNX fix-ups).
    seconds : Mapping[str, float]
        Wall-clock seconds of each build step (``export``, ``import``, ...).
    """

    spec: ZooSpec
    mod: tvm.IRModule
    entry: str
    input_specs: tuple[InputSpec, ...]
    sizes: Mapping[str, int]
    symbolic_dims: Mapping[str, str]
    dim_bounds: Mapping[str, tuple[int, int | None]]
    params: Mapping[str, np.ndarray]
    families: Mapping[str, int]
    source: Any = field(repr=False)
    metadata: Mapping[str, Any]
    seconds: Mapping[str, float]
    reference_fn: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]] = field(repr=False)
    inputs: Mapping[str, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self):
        if isinstance(self.source, Deferred):  # read through __getattr__ until built
            object.__setattr__(self, "_deferred", self.source)
            object.__delattr__(self, "source")
            object.__delattr__(self, "reference_fn")
        for name in ("sizes", "symbolic_dims", "dim_bounds", "families", "metadata", "seconds"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "params", _frozen(
            {k: _read_only(v) for k, v in self.params.items()}))
        object.__setattr__(self, "inputs", _frozen(
            {k: _read_only(v) for k, v in self.make_inputs().items()}))

    def __getattr__(self, name: str) -> Any:
        deferred = self.__dict__.get("_deferred")
        if deferred is None or name not in ("source", "reference_fn"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with deferred.lock:
            if "source" not in self.__dict__:
                source, reference_fn = deferred.build()
                object.__setattr__(self, "reference_fn", reference_fn)
                object.__setattr__(self, "source", source)
        return self.__dict__[name]

    @property
    def name(self) -> str:
        """The canonical spec text, ``zoo:NAME[?option=value&...]``."""
        return self.spec.text

    @property
    def input_names(self) -> tuple[str, ...]:
        """The model's input names, in call order."""
        return tuple(s.name for s in self.input_specs)

    @property
    def input_ranges(self) -> dict[str, tuple[int, int]]:
        """Integer inputs -> ``(low, high)``: valid values satisfy ``low <= v < high``."""
        return {s.name: s.bounds for s in self.input_specs if s.is_integer}

    def make_inputs(self, seed: int = 0, **sizes: int) -> dict[str, np.ndarray]:
        """Seeded inputs, by name; ``sizes`` override the example size of a role.

        Only dynamic roles may change (``model.make_inputs(batch=3)`` on a
        ``batch=dynamic`` model); integer inputs stay inside :attr:`input_ranges`.
        """
        for role, size in sizes.items():
            if role not in self.symbolic_dims:
                raise ZooError(f"{self.name}: dimension {role!r} is not dynamic "
                               f"(dynamic: {', '.join(self.symbolic_dims) or 'none'})")
            low, high = self.dim_bounds.get(role, (1, None))
            if size < low or (high is not None and size > high):
                raise ZooError(f"{self.name}: {role}={size} is outside [{low}, {high}]")
        resolved = {**self.sizes, **sizes}
        rng = np.random.default_rng(seed)
        return {s.name: s.draw(resolved, rng) for s in self.input_specs}

    def shape_vars(self, **sizes: int) -> dict[str, int]:
        """Symbolic variable name -> size, for the roles given (others: example size)."""
        resolved = {**self.sizes, **sizes}
        return {var: resolved[role] for role, var in self.symbolic_dims.items()}

    def arguments(self, inputs: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """The entry function's arguments, in order: the inputs, then :attr:`params`."""
        inputs = self.inputs if inputs is None else inputs
        return [inputs[n] for n in self.input_names] + list(self.params.values())

    def reference(self, inputs: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """The source model's outputs on ``inputs`` (default: :attr:`inputs`), as numpy."""
        return self.reference_fn(self.inputs if inputs is None else inputs)


# -- a model without its source, for the import cache -----------------------------------------
def description(model: ZooModel) -> dict[str, Any]:
    """What :func:`described` needs besides the module and the weights, as JSON values
    (tuples kept as ``{"__tuple__": [...]}``): the entry, inputs, sizes, families, metadata.
    """
    return _plain({"entry": model.entry, "input_specs": [asdict(s) for s in model.input_specs],
                   "sizes": dict(model.sizes), "symbolic_dims": dict(model.symbolic_dims),
                   "dim_bounds": dict(model.dim_bounds), "families": dict(model.families),
                   "metadata": dict(model.metadata)})


def described(spec: ZooSpec, mod: tvm.IRModule, params: Mapping[str, np.ndarray],
              found: Mapping[str, Any], source: Deferred,
              seconds: Mapping[str, float]) -> ZooModel:
    """The model :func:`description` gave ``found``, with ``source`` built on first use."""
    found = _typed(found)
    return ZooModel(spec=spec, mod=mod, entry=found["entry"],
                    input_specs=tuple(InputSpec(**s) for s in found["input_specs"]),
                    sizes=found["sizes"], symbolic_dims=found["symbolic_dims"],
                    dim_bounds=found["dim_bounds"], params=params, families=found["families"],
                    source=source, metadata=found["metadata"], seconds=seconds,
                    reference_fn=None)  # type: ignore[arg-type]  # the deferred's


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ZooError(f"cannot keep {type(value).__name__} {value!r} in a model description")


def _typed(value: Any) -> Any:
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_typed(v) for v in value["__tuple__"])
        return {k: _typed(v) for k, v in value.items()}
    return value
