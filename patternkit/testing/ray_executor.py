"""Campaign units as Ray tasks on long-lived workers: ``--executor ray``.

Why: ``--jobs N`` stops at one machine's processes.  Where a Ray cluster exists, a
campaign's units (:class:`~patternkit.testing.campaign.Unit`) run on it through the same
executor contract as the local ones (:class:`~patternkit.testing.campaign.Executor`):
``executor(units, check)`` yields one record per unit as it ends, and the caller writes
it through the campaign's JSON Lines recorder, so ``--resume``, ``--shard`` and
``patternkit merge`` work unchanged and the records are those of a local run.

Each worker is a Ray actor holding one CPU that keeps ``check`` (and what ``check``
caches: TVM, the rules rebuilt by name, the drawn instances) for every unit it gets, so
TVM is imported once per worker, not once per unit.  Units are handed out one at a time
to whichever worker is free (``ray.wait``), so one slow subject does not hold up the
others' units.

Ray is an optional extra (``pip install 'patternkit[ray]'``): without it, or with an
address no Ray cluster answers at, :class:`RayExecutor` refuses with a one-line
:class:`RayUnavailable` before any unit runs.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

from ..errors import PatternkitError, first_line

if TYPE_CHECKING:
    from .campaign import Unit

__all__ = ["RayExecutor", "RayUnavailable", "EXTRA", "ADDRESS_ENV"]

#: How to install Ray for patternkit (the optional extra).
EXTRA = "pip install 'patternkit[ray]'"

#: Ray's own environment variable for the cluster address (used when none is given).
ADDRESS_ENV = "RAY_ADDRESS"

#: Object store of a Ray that this module starts (records are small; Ray's default takes
#: 30 % of the RAM).
_LOCAL_STORE_BYTES = 128 * 2**20


class RayUnavailable(PatternkitError, RuntimeError):
    """Ray is not installed, or no Ray cluster answers at the address given."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed: {EXTRA}") \
            from None
    return ray


def _endpoint(address: str) -> tuple[str, int] | None:
    """The (host, port) an address names (``None``: one Ray resolves itself, ``auto``)."""
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        port = parts.port
    except ValueError:
        raise RayUnavailable(f"--ray-address {address}: not host:port") from None
    if not parts.hostname:
        raise RayUnavailable(f"--ray-address {address}: not host:port")
    default = 10001 if parts.scheme == "ray" else 6379
    return parts.hostname, default if port is None else port


#: An HTTP/2 client's opening (the preface and an empty SETTINGS frame): a gRPC server,
#: as Ray's head and Ray Client's server are, answers with a SETTINGS frame of its own.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


def _probe(address: str, timeout: float) -> None:
    """Refuse, within about ``timeout`` seconds, an address where no Ray cluster answers.

    Nothing listening, or a listener that does not answer as a gRPC server (Ray's own
    connect would retry for most of a minute), is refused.  With TLS (``RAY_USE_TLS``)
    only the connection is tried.
    """
    endpoint = _endpoint(address)
    if endpoint is None:
        return
    tls = os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", "")
    try:
        with socket.create_connection(endpoint, timeout=timeout) as conn:
            if tls:
                return
            conn.sendall(_HTTP2_HELLO)
            head = conn.recv(9)
    except TimeoutError:
        head = b""
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise RayUnavailable(f"--ray-address {address}: no Ray cluster answers "
                             f"({reason}; start one with `ray start --head`)") from None
    if len(head) < 4 or head[3] != _SETTINGS:
        raise RayUnavailable(f"--ray-address {address}: something listens there but it is "
                             f"not a Ray cluster (no gRPC answer within {timeout:g} s)")


@contextmanager
def _short_connect(timeout: float) -> Iterator[None]:
    """Bound Ray's own connect retries (minutes by default) to about ``timeout`` seconds.

    Ray reads these settings from the environment when it connects; a value the user
    set is kept, and the environment is put back afterwards.
    """
    wanted = {"RAY_gcs_rpc_server_connect_timeout_s": str(max(1, round(timeout))),
              "RAY_gcs_server_port_wait_time_s": "1"}
    before = {name: os.environ.get(name) for name in wanted}
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for name, kept in before.items():
            if kept is None:
                os.environ.pop(name, None)


class _Worker:
    """A long-lived worker: keeps ``check`` (and its caches) for the units it gets."""

    def __init__(self, check: Callable[[Unit], dict]) -> None:
        self._check = check

    def run(self, unit: Unit) -> dict:
        return self._check(unit)


class RayExecutor:
    """An executor (:class:`~patternkit.testing.campaign.Executor`) on a Ray cluster.

    Parameters
    ----------
    address : str, optional
        The cluster (``host:port`` of its head, ``ray://host:port``, or ``auto``);
        default: ``$RAY_ADDRESS``, else a local Ray started with this machine's CPUs (and
        stopped when the campaign ends).  When this process is already connected to Ray
        (``ray.init`` was called), that connection is used and left open.
    workers : int, optional
        Worker actors (one CPU each); default: the cluster's CPUs.
    connect_timeout : float
        Seconds to wait for the cluster to answer before refusing it.

    Raises
    ------
    RayUnavailable
        Ray is not installed, or nothing listens at ``address``: at construction, before
        any unit runs.

    Notes
    -----
    Each unit's record is ``check(unit)``'s return value, unchanged; records arrive as
    units end, in any order.  An exception in ``check`` (a bug: a check records a
    failing unit, it does not raise) propagates as Ray's ``RayTaskError``, which is also
    an instance of the original exception's class.
    """

    def __init__(self, address: str | None = None, *, workers: int | None = None,
                 connect_timeout: float = 5.0) -> None:
        self.ray = _import_ray()
        self.address = address or os.environ.get(ADDRESS_ENV) or None
        if workers is not None and workers < 1:
            raise RayUnavailable(f"--executor ray: {workers} worker(s); give 1 or more")
        self.workers = workers
        self.connect_timeout = connect_timeout
        if self.address is not None and not self.ray.is_initialized():
            _probe(self.address, connect_timeout)

    def _connect(self) -> bool:
        """Connect to (or start) Ray; whether this call did, so must disconnect."""
        ray = self.ray
        if ray.is_initialized():
            return False
        quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
        if self.address is None:
            ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                     object_store_memory=_LOCAL_STORE_BYTES, **quiet)
            return True
        try:
            with _short_connect(self.connect_timeout):
                ray.init(address=self.address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as err:
            first = first_line(err)
            hint = ("" if os.environ.get("RAY_AUTH_MODE") else
                    " (a cluster with token authentication also needs RAY_AUTH_MODE=token "
                    "and its token, `ray get-auth-token`)")
            raise RayUnavailable(f"--ray-address {self.address}: {first}{hint}") from None
        return True

    def __call__(self, units: Iterable[Unit], check: Callable[[Unit], dict]) -> Iterator[dict]:
        """The records of ``units``, one per unit, as Ray's workers end them."""
        units = list(units)
        if not units:
            return
        ray = self.ray
        started = self._connect()
        actors: list[Any] = []
        try:
            count = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            worker = ray.remote(num_cpus=1, max_restarts=2, max_task_retries=2)(_Worker)
            shared = ray.put(check)  # one copy in the object store, not one per worker
            pending: dict[Any, Any] = {}
            queue = iter(units)
            for _ in range(count):
                unit = next(queue, None)
                if unit is None:
                    break
                actor = worker.remote(shared)
                actors.append(actor)
                pending[actor.run.remote(unit)] = actor
            while pending:
                (done,), _ = ray.wait(list(pending), num_returns=1)
                actor = pending.pop(done)
                record = ray.get(done)
                unit = next(queue, None)
                if unit is not None:  # the worker goes on while the record is written
                    pending[actor.run.remote(unit)] = actor
                yield record
        finally:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()
