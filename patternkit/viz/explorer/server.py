"""Model Explorer's own server, on localhost, in a child process patternkit can stop.

Model Explorer's ``server.start`` serves the web app bundled in its package and runs
until its process ends; started in the caller's process it could not be stopped short of
exiting.  :class:`ExplorerServer` runs it in a child (:mod:`.serve_folder`, on a folder
:meth:`~.session.Explorer.write` wrote), waits until it answers its health check, and
stops it by its process id on :meth:`~ExplorerServer.stop`, on leaving a ``with`` block,
or when the interpreter exits.  Nothing is fetched from the network.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ...errors import PatternkitError
from .serve_folder import config_from_folder, panes_of, url_data

#: What Model Explorer's ``/check_health`` answers.
HEALTHY = "model_explorer_ok"
#: The child's output, kept in the served folder.
LOG = "server.log"


class ExplorerError(PatternkitError, RuntimeError):
    """Model Explorer's server did not start."""


def free_port(host: str = "localhost") -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) == 0


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/check_health", timeout=2) as reply:
            return bool(reply.read().decode() == HEALTHY)
    except (urllib.error.URLError, OSError):
        return False


class ExplorerServer:
    """A running Model Explorer server on one folder of graphs.

    Attributes
    ----------
    url : str
        Opens the graphs (Model Explorer's ``?data=`` parameter lists them).
    base : str
        ``http://host:port``.
    folder : Path
        The folder served.
    """

    def __init__(self, process: subprocess.Popen, base: str, url: str, folder: Path):
        self.process = process
        self.base = base
        self.url = url
        self.folder = folder
        atexit.register(self.stop)

    @classmethod
    def start(cls, folder: Path, *, host: str = "localhost", port: int | None = None,
              timeout: float = 60.0) -> ExplorerServer:
        """Serve ``folder`` and return once the server answers.

        Raises
        ------
        ExplorerError
            ``port`` is in use, or the server exited or did not answer within ``timeout``
            seconds (the message has the last line it wrote); it is stopped.
        """
        if port is None:
            port = free_port(host)
        elif _in_use(host, int(port)):
            raise ExplorerError(f"cannot serve Model Explorer on {host}:{port}: the port is "
                                f"in use (leave --port out to take a free one)")
        script = Path(__file__).with_name("serve_folder.py")
        log = (folder / LOG).open("w")
        process = subprocess.Popen(  # noqa: S603 - our own script, with our arguments
            [sys.executable, str(script), str(folder), host, str(port), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        base = f"http://{host}:{port}"
        data = url_data(config_from_folder(folder), panes_of(folder))
        server = cls(process, base, f"{base}/?data={data}", folder)
        deadline = time.monotonic() + timeout
        while not _healthy(base):
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                reason = server.last_error() or f"no answer within {timeout:g} s"
                raise ExplorerError(f"Model Explorer's server did not start on {base}: "
                                    f"{reason}")
            time.sleep(0.2)
        return server

    @property
    def running(self) -> bool:
        """The child process is alive."""
        return self.process.poll() is None

    def frame_url(self) -> str:
        """:attr:`url` for a notebook frame (with Model Explorer's "open in new tab")."""
        return f"{self.url}&show_open_in_new_tab=1"

    def last_error(self) -> str:
        """The last line the server wrote."""
        path = self.folder / LOG
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return lines[-1] if lines else ""

    def stop(self) -> None:
        """End the server (its process, by id) and wait for it; safe to call twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        atexit.unregister(self.stop)

    def wait(self) -> None:
        """Block until the server ends; Ctrl+C (or SIGTERM) stops it."""
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, interrupt) if main else None
        try:
            self.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> ExplorerServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<ExplorerServer {self.base} ({state})>"
