"""Colours: a stable hash of a name into colour-blind-safe palettes.

Fills use Paul Tol's *light* scheme, outlines and diff states the Okabe-Ito scheme; both
stay distinguishable under the common colour-vision deficiencies.  The hash is CRC-32 of
the name, so a pattern keeps its colour across runs, processes and machines.

Text must stay readable on every fill it can sit on: WCAG 2.x level AA asks for a
contrast ratio of at least 4.5:1 for normal text.  The Okabe-Ito colours are fine for
outlines and edges (3:1 is the bar for graphics) but some are too light for text on a
light fill (``#E69F00`` on white is about 2.25:1), so text in a status or match colour
uses :func:`text_color`: the same hue, darkened until it clears 4.5:1 on every fill of
:data:`FILLS`.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

__all__ = ["FILLS", "STATUS_COLORS", "contrast_ratio", "fill_color", "outline_color",
           "text_color"]

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


#: Every background text is drawn on: the node/cluster fills and the palette's fills.
FILLS = ("#FFFFFF", "#F7F7F7", "#DDDDDD") + TOL_LIGHT

#: WCAG 2.x AA, normal-size text.
AA_TEXT = 4.5


def _luminance(color: str) -> float:
    """WCAG relative luminance of ``#RRGGBB``."""
    def channel(hex2: str) -> float:
        c = int(hex2, 16) / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(color[i:i + 2]) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#RRGGBB`` colours, from 1 to 21."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@lru_cache(maxsize=256)
def text_color(color: str, backgrounds: tuple[str, ...] = FILLS) -> str:
    """``color`` darkened (same hue) until it reads at AA on every one of ``backgrounds``.

    Kept per colour: a drawing asks for the same few colours hundreds of times.
    """
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    scale = 1.0
    while True:
        text = "#{:02X}{:02X}{:02X}".format(*(int(c * scale) for c in (r, g, b)))
        if all(contrast_ratio(text, bg) >= AA_TEXT for bg in backgrounds) or scale <= 0:
            return text
        scale -= 0.05


def _bucket(name: str, size: int) -> int:
    return zlib.crc32(name.encode("utf-8")) % size


def fill_color(name: str) -> str:
    """A light fill colour for ``name`` (a pattern, compiler, function or op name)."""
    return TOL_LIGHT[_bucket(name, len(TOL_LIGHT))]


def outline_color(index: int) -> str:
    """The outline colour of the ``index``-th highlighted match."""
    return OKABE_ITO[index % len(OKABE_ITO)]
