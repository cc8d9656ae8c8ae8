"""Serving on several processes or machines: the app of `create_app` as N replicas of a Ray Serve
deployment behind Ray's HTTP proxy (`gpt2 serve --replicas N`, the `cluster` extra).

    clients ──> Ray's HTTP proxy (host:port) ──> replica 1: the app, its model, its batch
                                              └─> replica 2: ...

Each replica is the whole server of one process: the same routes, limits and errors, the model
loaded once in it and its own continuous batching; the proxy spreads requests over the replicas
(Ray's power-of-two-choices: of two replicas drawn, the one with fewer requests in flight) and the
controller restarts a replica whose process dies. Each answer names its replica in the header
`x-gpt2-replica`.

With RAY_ADDRESS set, the replicas join that cluster (`ray start --head` on one machine, `ray start
--address` on the others): Ray places them where it finds the CPUs. Without it, a cluster of this
machine alone is started for the server and stopped with it: its processes talk over the loopback
(Ray's node address 127.0.0.1), its dashboard (which `serve status` asks) listens on 127.0.0.1, and
the proxy on `host`. Ray is imported where it is used, so that the rest of gpt2 runs without the extra.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from gpt2._checks import positive_int, require_package
from gpt2.devices import set_threads
from gpt2.errors import ClusterError
from gpt2.serve.launch import check_port, listen
from gpt2.serve.protocol import Limits

APP_NAME = "gpt2"  # the Ray Serve application, and its deployment
REPLICA_HEADER = "x-gpt2-replica"
LOCAL_ADDRESS = "127.0.0.1"  # the node address of a cluster started here
# Requests a replica is handed beyond its limits' batch and queue (Ray's own default, 5 in all, would
# hold the rest in the proxy): its own limits decide, as on one process, its 429 included.
_ONGOING_BEYOND_LIMITS = 8

_RAISED = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception): ")

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def replica_threads(replicas: int, cores: int | None = None) -> int:
    """Each replica's share of this machine's cores (at least one)."""
    return max(1, (cores or os.cpu_count() or 1) // replicas)


def named(app: ASGI, replica: str) -> ASGI:
    """`app`, its HTTP answers carrying the header `x-gpt2-replica: REPLICA`."""
    header = (REPLICA_HEADER.encode(), replica.encode())

    async def answer(scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await app(scope, receive, send_named)

    return answer


@dataclass(frozen=True)
class LocalCluster:
    """A Ray cluster of this machine, started for the server: where other Ray clients reach it
    (RAY_ADDRESS=address) and its dashboard's URL (`serve status -a dashboard`)."""

    address: str
    dashboard: str


class Replica:
    """One replica: the app `build` makes, its model loaded before Ray counts the replica as running."""

    def __init__(self, build: Callable[[], FastAPI], threads: int):
        from ray import serve

        set_threads(threads)
        self.server_app = build()
        self.server_app.state.server.load_model()  # a failure here is the deployment's, which Ray reports
        self.name = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self) -> ASGI:
        return named(self.server_app, self.name)

    def check_health(self) -> None:
        """Ray's health check, every 10 s: a replica whose model is not ready is restarted."""
        self.server_app.state.server.check_ready()


def serve_replicas(
    build: Callable[[], FastAPI],
    replicas: int,
    host: str = LOCAL_ADDRESS,
    port: int = 8000,
    *,
    threads: int | None = None,
    gpus: float = 0,
    limits: Limits = Limits(),
    on_start: Callable[[], None] | None = None,
    on_listen: Callable[[str, LocalCluster | None], None] | None = None,
) -> None:
    """Serve `replicas` copies of the app `build` makes (each loads its model) behind Ray's HTTP proxy on
    host:port, until Ctrl-C or SIGTERM. `build` is pickled to the replicas (cloudpickle: a closure will do).
    `threads`: each replica's torch threads and the CPUs Ray reserves for it (default: its share of this
    machine's cores); `gpus`: the GPUs it reserves; `limits`: the app's, which each replica keeps (Ray hands a
    replica as many requests as its batch and queue hold, and a few more for its own 429). `on_start` is
    called once Ray is up, before the replicas start; `on_listen`, once every replica has loaded, gets the
    API's URL and, for a cluster started here, where it is (None: a cluster joined through RAY_ADDRESS).
    Port 0: a port free now."""
    replicas = positive_int("replicas", replicas)
    threads = replica_threads(replicas) if threads is None else positive_int("threads", threads)
    port = check_port(port) or _free_port(host)
    ray, serve, local = _start_ray()
    try:
        if on_start is not None:
            on_start()
        serve.start(http_options={"host": host, "port": port})
        deployment = serve.deployment(
            serve.ingress()(Replica),
            name=APP_NAME,
            num_replicas=replicas,
            max_constructor_retry_count=replicas,  # a model that fails to load fails in each: a try each
            max_ongoing_requests=limits.max_batch_size + limits.max_queue + _ONGOING_BEYOND_LIMITS,
            ray_actor_options={"num_cpus": threads, "num_gpus": gpus},
        )
        try:
            serve.run(deployment.bind(build, threads), name=APP_NAME, route_prefix="/")
        except RuntimeError:  # a replica failed to start: the deployment's status ends with its traceback
            deployment_status = serve.status().applications[APP_NAME].deployments[APP_NAME]
            raise ClusterError(f"the replicas failed to start: {_replica_error(deployment_status.message)}") from None
        if on_listen is not None:
            on_listen(f"http://{f'[{host}]' if ':' in host else host}:{port}/v1", local)
        _wait_for_stop()
    finally:
        _stop_ray(ray, serve, local=local is not None)


def _replica_error(message: str) -> str:
    """The error a replica raised, from the last "module.SomeError: what" line of Ray's message (else its
    last line): gpt2's own errors by their message alone, as the command would say them."""
    raised = [line.strip() for line in message.splitlines() if _RAISED.match(line.strip())]
    if not raised:
        return message.strip().splitlines()[-1]
    return raised[-1].split(": ", 1)[1] if raised[-1].startswith("gpt2.errors.") else raised[-1]


def _free_port(host: str) -> int:
    """A port free on `host` now (Ray's proxy takes a port number, not a socket)."""
    sock = listen(host, 0)
    try:
        return sock.getsockname()[1]
    finally:
        sock.close()


def _start_ray() -> tuple[Any, Any, LocalCluster | None]:
    """ray and ray.serve, connected to the cluster at RAY_ADDRESS, else to one started on this machine's
    loopback; and the cluster started (None for a cluster joined)."""
    address = os.environ.get("RAY_ADDRESS", "")
    joined = bool(address)
    if not joined or address.split(":")[0] in ("127.0.0.1", "localhost"):
        # Ray's single-machine mode (its default on macOS and Windows): the node's address is the loopback,
        # so no process of this cluster talks to, or is reachable through, the machine's other addresses;
        # a client of such a cluster needs it too, else Ray reads 127.0.0.1 as the machine's own address.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = require_package("ray", "cluster", "serving replicas needs", "replicas")
    serve = require_package("ray.serve", "cluster", "serving replicas needs", "replicas")
    try:
        if joined:
            ray.init(logging_level="WARNING")
            return ray, serve, None
        context = ray.init(
            num_cpus=os.cpu_count(),
            _node_ip_address=LOCAL_ADDRESS,
            include_dashboard=True,
            dashboard_host=LOCAL_ADDRESS,
            logging_level="WARNING",
        )
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
        where = f"the Ray cluster at RAY_ADDRESS={address}" if joined else "a local Ray cluster"
        raise ClusterError(f"cannot start or reach {where}: {e}") from None
    return ray, serve, LocalCluster(context.address_info["gcs_address"], f"http://{context.dashboard_url}")


def _wait_for_stop() -> None:
    """Until Ctrl-C or SIGTERM."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_ray(ray: Any, serve: Any, local: bool) -> None:
    """The replicas stopped: with the whole cluster if started here, else this application alone."""
    try:
        if local:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
