"""Serve a folder :meth:`patternkit.viz.explorer.Explorer.write` wrote with Model Explorer.

Run as a script (``python serve_folder.py FOLDER HOST PORT PARENT_PID``) by
:class:`~patternkit.viz.explorer.server.ExplorerServer`: a child process whose end ends
the server, since Model Explorer's server runs until its process stops.  The child also
ends when its parent does, however the parent ended (killed, crashed): no server is
left behind on a port.  It imports only
the standard library and ``model_explorer`` (not patternkit, not TVM), so it starts in a
second.  Model Explorer's check for a newer release on PyPI is switched off: the app is
served from the installed package and needs no network.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: The file listing what a folder holds (see ``Explorer.write``).
INDEX = "explorer.json"


def config_from_folder(folder: str | Path) -> Any:
    """A ``ModelExplorerConfig`` with the folder's graphs in memory, side by side, and
    each overlay applied to its model.

    Model Explorer's in-memory graphs are ``graphs://<name>/<index>`` sources (as its
    ``add_model_from_pytorch`` lists them), which its server answers from the config.
    """
    import model_explorer

    base = Path(folder)
    index = json.loads((base / INDEX).read_text())
    config = model_explorer.config()
    for model in index["models"]:
        config.model_sources.append(
            {"url": f"graphs://{model['name']}/{len(config.graphs_list)}"})
        config.graphs_list.append((base / model["file"]).read_text())
    for overlay in index["overlays"]:
        config.add_node_data(name=overlay["name"], model_name=overlay["model"],
                             node_data=(base / overlay["file"]).read_text())
    return config


def url_data(config: Any, panes: list[tuple[str, list[str]]]) -> str:
    """The ``data=`` value of Model Explorer's URL: ``config``'s models and node data
    (as ``ModelExplorerConfig.to_url_param_value``) and the ``panes`` to open, each
    ``(graph id, groups to open)``: two panes open side by side.  A group opened
    (``main``) shows its own groups (the layers) folded.
    """
    data: dict[str, Any] = {"models": config.model_sources}
    if config.node_data_sources:
        data["nodeData"] = config.node_data_sources
        data["nodeDataTargets"] = config.node_data_target_models
    if panes:
        data["uiState"] = {"paneStates": [
            {"deepestExpandedGroupNodeIds": [f"{group}___group___" for group in groups],
             "selectedNodeId": "", "selectedGraphId": graph_id,
             "selectedCollectionLabel": "", "widthFraction": 1 / len(panes)}
            for graph_id, groups in panes]}
    return quote(json.dumps(data))


def panes_of(folder: str | Path) -> list[tuple[str, list[str]]]:
    """The panes a folder opens with: its first and last graphs (the first alone if it
    has one), each with its top-level function groups open.
    """
    models = json.loads((Path(folder) / INDEX).read_text())["models"]
    shown = [models[0], models[-1]] if len(models) > 1 else models
    return [(m["name"], list(m.get("open", []))) for m in shown]


def _offline_version_check(print_msg: bool = True) -> dict[str, str]:
    return {"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}


def _exit_with(parent: int) -> None:
    """End this process once ``parent`` is gone (this process is then re-parented)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(argv: list[str]) -> None:
    """Serve ``FOLDER`` on ``HOST:PORT`` until the process is stopped or ``PARENT_PID``
    ends.
    """
    folder, host, port, parent = argv
    threading.Thread(target=_exit_with, args=(int(parent),), daemon=True).start()
    # Model Explorer imports torch, if installed, for its PyTorch adapter, which serving
    # graphs does not use: marked absent, the server starts in a fraction of the time
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    from model_explorer import server

    server._check_new_version = _offline_version_check  # no call to PyPI or GitHub
    server.start(host=host, port=int(port), config=config_from_folder(folder),
                 no_open_in_browser=True)


if __name__ == "__main__":
    main(sys.argv[1:])
