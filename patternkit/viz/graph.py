"""``VizGraph``: what ``viz_expr`` / ``viz_diff`` return.

It holds the shaped graph model and writes it as DOT (``.source``), a rendered file
(``.render``), a ``graphviz.Source`` (``.to_graphviz``), a ``networkx.MultiDiGraph``
(``.to_networkx``) or JSON (``.to_json``), and displays itself inline in Jupyter.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from .display import fallback_html, run_dot, svg_for_html
from .dot import node_label, to_dot
from .model import GraphModel, gc_paused
from .options import VizOptions

__all__ = ["VizGraph"]

logger = logging.getLogger(__name__)


class VizGraph:
    """A drawing of Relax IR.

    Attributes
    ----------
    model : GraphModel
        The nodes, edges and clusters drawn.
    options : VizOptions
        The options it was drawn with.
    """

    def __init__(self, model: GraphModel, options: VizOptions):
        self.model = model
        self.options = options
        self._source: str | None = None
        self._svg: str | None = None
        self._svg_error: str | None = None

    # ----------------------------------------------------------------- text forms
    @property
    def source(self) -> str:
        """The Graphviz DOT text (deterministic)."""
        if self._source is None:
            with gc_paused():
                self._source = to_dot(self.model, self.options)
        return self._source

    @property
    def summary(self) -> str:
        """Node/cluster counts and any messages (focus, collapse, highlight), as text."""
        lines = [self.model.summary_text()]
        lines.extend(self.model.messages)
        return "\n".join(lines)

    @property
    def layout_allowed(self) -> bool:
        """False past ``hard_limit`` nodes: only the summary and DOT are shown."""
        return len(self.model.nodes) <= self.options.hard_limit

    def __repr__(self) -> str:
        title = self.model.title or ", ".join(self.model.functions) or "relax"
        return f"<VizGraph {title}: {self.model.summary_text()}>"

    def to_dict(self) -> dict:
        """The model as plain Python data (what :meth:`to_json` serialises)."""
        return self.model.to_dict()

    def to_json(self, indent: int | None = None) -> str:
        """The model as JSON text with sorted keys."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def to_networkx(self):
        """A ``networkx.MultiDiGraph``: node attributes from the model, one edge per input.

        Edge keys are ``"<index><port>"``; clusters are listed in ``G.graph["clusters"]``.
        Needs the optional ``networkx`` package (``pip install 'patternkit[networkx]'``).

        Raises
        ------
        ImportError
            When networkx is not installed, naming the extra that provides it.
        """
        try:
            import networkx as nx
        except ImportError as err:
            raise ImportError("VizGraph.to_networkx needs networkx: "
                              "pip install 'patternkit[networkx]'") from err

        g = nx.MultiDiGraph()
        g.graph["title"] = self.model.title
        g.graph["functions"] = list(self.model.functions)
        g.graph["clusters"] = {c.id: c.to_dict() for c in self.model.clusters.values()}
        for n in self.model.nodes.values():
            data = n.to_dict()
            data.pop("id")
            data["text"] = node_label(n)
            g.add_node(n.id, **data)
        for e in self.model.edges:
            g.add_edge(e.src, e.dst, key=f"{e.index}{e.port}", index=e.index, port=e.port,
                       kind=e.kind, status=e.status)
        return g

    def to_graphviz(self, **kwargs: Any):
        """The drawing as a ``graphviz.Source`` (``.source``, ``.pipe``, ``.render``, Jupyter).

        Its layouts keep this drawing's ``timeout=`` (see
        :class:`~patternkit.viz.graphviz_source.TimedSource`).

        Parameters
        ----------
        **kwargs
            ``graphviz.Source``'s own: ``filename``, ``directory``, ``format``, ``engine``...

        Returns
        -------
        patternkit.viz.graphviz_source.TimedSource
            A ``graphviz.Source`` of :attr:`source`.

        Raises
        ------
        ImportError
            When the ``graphviz`` package is not installed, naming it.
        """
        try:
            from .graphviz_source import TimedSource
        except ImportError as err:
            raise ImportError("VizGraph.to_graphviz needs the graphviz package: "
                              "pip install graphviz") from err
        return TimedSource(self.source, timeout=self.options.timeout,
                           summary=repr(self) + "\n" + self.summary, **kwargs)

    # ----------------------------------------------------------------- rendering
    def pipe(self, format: str = "svg") -> bytes:
        """Lay out with ``dot`` and return the bytes (raises ``DotUnavailable``).

        The SVG is laid out once and kept (the display and :func:`~patternkit.viz.fit.fit`
        reuse it).
        """
        if format == "svg" and self._svg is not None:
            return self._svg.encode("utf-8")
        data = run_dot(self.source, format, self.options.timeout)
        if format == "svg":
            self._svg = data.decode("utf-8")
        return data

    def laid_out(self, options: VizOptions, svg: str) -> VizGraph:
        """The same model drawn with ``options``, whose SVG layout is ``svg`` already.

        For a layout changed without ``dot`` (:func:`patternkit.viz.fit.scale_svg`):
        ``options`` must lay out to the same picture, so that :attr:`source` and the
        SVG agree.  The model is shared, not copied.
        """
        drawing = VizGraph(self.model, options)
        drawing._svg = svg
        return drawing

    def render(self, path: str | os.PathLike = "graph", format: str = "svg") -> str:
        """Write the drawing to ``path`` (the ``.<format>`` suffix is added when missing).

        Parameters
        ----------
        path : str or PathLike
            Output file name.
        format : {"svg", "png", "pdf", "dot", "json", "plain"}
            ``dot`` writes the DOT text and ``json`` the model, without Graphviz.

        Returns
        -------
        str
            The path written.

        Raises
        ------
        DotUnavailable
            ``dot`` is missing, failed or timed out.
        """
        path = os.fspath(path)
        if not path.endswith("." + format):
            path = f"{path}.{format}"
        if format == "dot":
            data = self.source.encode("utf-8")
        elif format == "json":
            data = self.to_json(indent=1).encode("utf-8")
        else:
            data = self.pipe(format)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def _try_svg(self) -> str | None:
        if self._svg is None and self._svg_error is None:
            if not self.layout_allowed:
                self._svg_error = (
                    f"{len(self.model.nodes)} nodes is past hard_limit={self.options.hard_limit}; "
                    "collapse clusters, focus= on a node or limit functions="
                )
            else:
                try:
                    self._svg = self.pipe("svg").decode("utf-8")
                except Exception as e:  # display must never raise; keep the reason
                    self._svg_error = str(e)
                    logger.info("viz: no layout: %s", e)
        return self._svg

    # ----------------------------------------------------------------- Jupyter
    def _repr_svg_(self) -> str | None:
        try:
            return self._try_svg()
        except Exception:  # pragma: no cover - belt and braces for notebooks
            return None

    def _repr_html_(self) -> str:
        try:
            svg = self._try_svg()
            if svg is not None:
                return f'<div class="patternkit-viz">{svg_for_html(svg)}</div>'
            return fallback_html(self.summary, self._svg_error or "no layout", self.source)
        except Exception as e:  # pragma: no cover - never raise from a display hook
            return f"<pre>patternkit viz: {type(e).__name__}: {e}</pre>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = {"text/plain": repr(self) + "\n" + self.summary}
        try:
            bundle["text/html"] = self._repr_html_()
            svg = self._svg
            if svg is not None:
                bundle["image/svg+xml"] = svg
        except Exception as e:  # pragma: no cover
            bundle["text/plain"] += f"\n(display failed: {type(e).__name__}: {e})"
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle

