"""Colours: a stable hash of a name into colour-blind-safe palettes.

Fills use Paul Tol's *light* scheme, outlines and diff states the Okabe-Ito scheme; both
stay distinguishable under the common colour-vision deficiencies.  The hash is CRC-32 of
the name, so a pattern keeps its colour across runs, processes and machines.
"""

from __future__ import annotations

import zlib

__all__ = ["STATUS_COLORS", "fill_color", "outline_color"]

TOL_LIGHT = (
    "#77AADD",
    "#99DDFF",
    "#44BB99",
    "#BBCC33",
    "#AAAA00",
    "#EEDD88",
    "#EE8866",
    "#FFAABB",
    "#DDDDDD",
)
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442", "#000000")

STATUS_COLORS = {
    "removed": "#D55E00",
    "added": "#009E73",
    "changed": "#E69F00",
}


def _bucket(name: str, size: int) -> int:
    return zlib.crc32(name.encode("utf-8")) % size


def fill_color(name: str) -> str:
    """A light fill colour for ``name`` (a pattern, compiler, function or op name)."""
    return TOL_LIGHT[_bucket(name, len(TOL_LIGHT))]


def outline_color(index: int) -> str:
    """The outline colour of the ``index``-th highlighted match."""
    return OKABE_ITO[index % len(OKABE_ITO)]
