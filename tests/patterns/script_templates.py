"""Shared by the pattern tests: TVMScript modules written once for several dtypes.

A rule's float32, float16 and bfloat16 cases often differ only in the dtype of their
tensors; writing each module once with a ``{dtype}`` field keeps the cases from drifting
apart when one of them is edited.
"""

from __future__ import annotations

import tvm


def script_in_dtype(text: str, dtype: str) -> tvm.IRModule:
    """The TVMScript module ``text`` with every ``{dtype}`` in it written as ``dtype``."""
    return tvm.script.from_source(text.replace("{dtype}", dtype))
