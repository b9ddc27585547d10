"""A drawing's SVG made safe to paste into an HTML page, beside other drawings.

``report.html`` carries the job's drawings inline (one file, nothing fetched), but an SVG
file is not HTML: it starts with an XML prolog and a DOCTYPE, Graphviz numbers its
elements from ``node1`` in every file (so two drawings on one page would share ids), and
an SVG may carry script (``<script>``, ``onload=``, ``javascript:`` links) that a page
must not run.  :func:`inline_svg` parses the file, keeps drawing elements only, renames
every id with a per-drawing prefix (and the references to them), and writes the
``<svg>`` element back as text; a file that is not SVG is refused with the reason.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

__all__ = ["SvgError", "inline_svg"]

_SVG = "http://www.w3.org/2000/svg"
_XLINK = "http://www.w3.org/1999/xlink"
#: Elements that run script or embed foreign (HTML) content: dropped with what they hold.
_DROPPED = {"script", "style", "foreignObject", "iframe", "object", "embed", "handler",
            "listener"}
_REFERENCE = re.compile(r"url\(\s*#([^)\s]+)\s*\)")
_OUTSIDE = re.compile(r"url\(\s*['\"]?\s*[^#'\"\s]")


class SvgError(ValueError):
    """The text is not an SVG drawing."""


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def inline_svg(text: str, prefix: str) -> str:
    """``text`` (an SVG file) as an ``<svg>`` element for an HTML page.

    Parameters
    ----------
    text : str
        The SVG file's text (an XML prolog and a DOCTYPE are allowed).
    prefix : str
        Put before every id (``before-``): ids stay unique among the page's drawings.

    Returns
    -------
    str
        The ``<svg>`` element, without script, event handlers, foreign content or
        links out of the drawing; every text escaped by the XML writer.

    Raises
    ------
    SvgError
        ``text`` does not parse as XML, or its root is not an SVG element.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise SvgError(f"not an SVG drawing: {err}") from None
    if root.tag != f"{{{_SVG}}}svg":
        raise SvgError(f"not an SVG drawing: the root element is <{_local(root.tag)}>")
    _clean(root, prefix)
    ET.register_namespace("", _SVG)
    ET.register_namespace("xlink", _XLINK)
    return ET.tostring(root, encoding="unicode")


def _clean(element: ET.Element, prefix: str) -> None:
    """Drop what could run or load, and prefix ids and local references, in place."""
    for child in list(element):
        if not isinstance(child.tag, str) or _local(child.tag) in _DROPPED:
            element.remove(child)
            continue
        _clean(child, prefix)
    for name, value in list(element.attrib.items()):
        local = _local(name)
        if local.lower().startswith("on"):
            del element.attrib[name]
        elif local == "id":
            element.set(name, prefix + value)
        elif local == "href":
            if value.startswith("#"):
                element.set(name, "#" + prefix + value[1:])
            else:  # a link out of the drawing: the page is read offline
                del element.attrib[name]
        elif _OUTSIDE.search(value):  # a resource fetched from elsewhere
            del element.attrib[name]
        elif "url(" in value:
            element.set(name, _REFERENCE.sub(lambda m: f"url(#{prefix}{m.group(1)})", value))
