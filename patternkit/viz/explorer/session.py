"""What :func:`patternkit.explore` returns: the drawn modules, their overlays, and the ways
to open them (files, Model Explorer's config, a local server, a notebook frame).

The graphs and overlays are JSON text, built once; :meth:`Explorer.write` puts them in
a folder (one ``<model>.json`` per module in Model Explorer's graph format, one
``<model>.<overlay>.nodedata.json`` per overlay, and ``explorer.json`` listing them),
and everything else starts from that folder: :meth:`Explorer.config` builds Model
Explorer's ``ModelExplorerConfig`` (the modules as in-memory graphs, side by side),
:meth:`Explorer.serve` runs Model Explorer's own server on it in a child process
(:mod:`.server`), and in Jupyter the object shows as a frame on that server, as Model
Explorer's notebook support does.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ...errors import PatternkitError
from .graph import ModuleGraph
from .overlays import Overlay
from .serve_folder import INDEX, config_from_folder

#: Height of the notebook frame, as Model Explorer's own (``DEFAULT_COLAB_HEIGHT``).
FRAME_HEIGHT = 850


class ExplorerUnavailable(PatternkitError, ImportError):
    """Model Explorer (the ``[explorer]`` extra) is not installed."""


def require_model_explorer() -> Any:
    """The ``model_explorer`` module, or a one-line :class:`ExplorerUnavailable`."""
    try:
        import model_explorer
    except ImportError as err:
        raise ExplorerUnavailable(
            "patternkit.explore needs Google's Model Explorer: pip install "
            "'patternkit[explorer]' (ai-edge-model-explorer)") from err
    return model_explorer


class Explorer:
    """Drawn modules with their overlays; see the module docstring.

    Attributes
    ----------
    models : dict
        Label (``"before"``, ``"after"``) -> :class:`~.graph.ModuleGraph`, in pane order.
    overlays : list of Overlay
        Non-empty overlays, each on one model.
    seconds : float
        How long drawing the modules and overlays took.
    """

    def __init__(self, models: dict[str, ModuleGraph], overlays: list[Overlay],
                 seconds: float = 0.0):
        self.models = models
        self.overlays = overlays
        self.seconds = seconds
        self._server: Any = None
        self._folder: tempfile.TemporaryDirectory | None = None

    def __repr__(self) -> str:
        parts = [f"{name}: {g.node_count} nodes" for name, g in self.models.items()]
        shown = ", ".join(f"{o.name} on {o.model}" for o in self.overlays) or "none"
        return f"<Explorer {'; '.join(parts)}; overlays: {shown}>"

    def graphs_json(self, model: str) -> str:
        """``model``'s graph as Model Explorer's ``{"graphs": [...]}`` JSON."""
        return json.dumps({"graphs": [self.models[model].graph]})

    def write(self, folder: str | os.PathLike) -> list[Path]:
        """Write the graphs, the overlays and the index into ``folder``; the paths.

        The folder is created if needed; files of earlier writes with other names are
        left alone.
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        index: dict[str, list[dict[str, Any]]] = {"models": [], "overlays": []}
        for model in self.models:
            path = out / f"{model}.json"
            path.write_text(self.graphs_json(model))
            written.append(path)
            index["models"].append({"name": model, "file": path.name,
                                    "open": self.models[model].functions})
        for overlay in self.overlays:
            path = out / f"{overlay.model}.{overlay.name.replace(' ', '_')}.nodedata.json"
            path.write_text(overlay.to_json())
            written.append(path)
            index["overlays"].append({"name": overlay.name, "model": overlay.model,
                                      "file": path.name})
        (out / INDEX).write_text(json.dumps(index, indent=1))
        return [*written, out / INDEX]

    def config(self) -> Any:
        """Model Explorer's ``ModelExplorerConfig`` for these graphs and overlays (the
        graphs in memory, side by side; each overlay applied to its model).
        """
        require_model_explorer()
        return config_from_folder(self._written())

    def _written(self) -> Path:
        """A private folder holding :meth:`write`'s files, written once."""
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="patternkit-explorer-")
            self.write(self._folder.name)
        return Path(self._folder.name)

    def serve(self, *, host: str = "localhost", port: int | None = None,
              timeout: float = 60.0) -> Any:
        """Start Model Explorer's server on these graphs (a child process); the server.

        The server's ``url`` opens the graphs; ``stop()`` (or leaving a ``with`` block,
        or the interpreter exiting) ends it.  ``port=None`` picks a free port.
        """
        from .server import ExplorerServer

        require_model_explorer()
        return ExplorerServer.start(self._written(), host=host, port=port, timeout=timeout)

    def show(self, height: int = FRAME_HEIGHT) -> Any:
        """In a notebook: start (once) a server and show it in a frame, as Model Explorer's
        notebook support does; the server.
        """
        if self._server is None or not self._server.running:
            self._server = self.serve()
        from IPython.display import IFrame, display

        display(IFrame(self._server.frame_url(), width="100%", height=height))
        return self._server

    def _repr_html_(self) -> str:
        if self._server is None or not self._server.running:
            self._server = self.serve()
        url = self._server.frame_url()
        return (f'<iframe src="{url}" width="100%" height="{FRAME_HEIGHT}" frameborder="0" '
                f'style="border: 1px solid #ccc"></iframe>')

    def stop(self) -> None:
        """Stop the server :meth:`show` started, if any."""
        if self._server is not None:
            self._server.stop()
            self._server = None
