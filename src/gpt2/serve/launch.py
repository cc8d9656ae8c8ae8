"""Running the server: the app of `create_app` on uvicorn, on a socket of its own, with the
model loading in the main thread (see `serve`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

import uvicorn

from gpt2._checks import int_between
from gpt2.errors import InvalidArgumentError
from gpt2.model.model import GPT2
from gpt2.serve.app import create_app
from gpt2.serve.protocol import AllowedSpecial, Limits
from gpt2.serve.server import Server
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.chat import ChatTemplate


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, which first ends the requests in flight when told to stop (Ctrl-C,
    SIGTERM): otherwise it would wait for them to finish."""

    def __init__(self, config: uvicorn.Config, server: Server):
        super().__init__(config)
        self.gpt2 = server

    def handle_exit(self, sig, frame) -> None:
        threading.Thread(target=self.gpt2.stop, daemon=True).start()
        super().handle_exit(sig, frame)


def check_port(port: object) -> int:
    return int_between("port", port, 0, 65535)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or a GPT2Error naming them."""
    check_port(port)
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as e:
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(
    load: Callable[[], tuple[GPT2, Tokenizer | None]] | None,
    model_id: str | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits = Limits(),
    log_level: str = "info",
    *,
    allowed_special: AllowedSpecial = "all",
    on_listen: Callable[[str], None] | None = None,
    ui: bool = True,
    load_draft: Callable[[], tuple[GPT2, Tokenizer | None]] | None = None,
    chat_template: ChatTemplate | str | None = None,
    transcoders: str | os.PathLike | None = None,
    feature_data: str | os.PathLike | None = None,
    runs: str | os.PathLike | None = None,
) -> None:
    """Serve until Ctrl-C or SIGTERM: the app of `create_app` on uvicorn, one log line per request.

    Once the port listens, `on_listen` gets the API's URL (http://host:port/v1) and the model
    loads, in this thread, the main one, while uvicorn answers in another (503 until then).
    So Ctrl-C (KeyboardInterrupt) stops a load as it stops any Python code, and SIGTERM, whose
    default ends the process, too; whereas a thread still loading when the interpreter exits is
    ended by unwinding its stack (pthread_exit) through torch's C++ code, which aborts the
    process ("terminate called without an active exception"). Once the model has loaded, both
    end the requests in flight and stop uvicorn, then take their usual course, as they do in
    uvicorn's own `run`. A load that fails stops the server and raises its error. A model that comes with
    no tokenizer (`load`'s None) is served on token ids (see `create_app`). `ui` serves
    the playground at /; `load_draft`, a draft model for speculative decoding; `chat_template`,
    the template of /v1/chat/completions in place of the model's own; `transcoders` and `feature_data`,
    the directories of /v1/circuits/graph's and /feature's transcoders and data; `runs`, training runs served at
    /v1/runs, where `load` None serves no model (see `create_app`)."""
    app = create_app(
        load,
        model_id,
        limits,
        allowed_special=allowed_special,
        load_in_background=False,
        ui=ui,
        load_draft=load_draft,
        chat_template=chat_template,
        transcoders=transcoders,
        feature_data=feature_data,
        runs=runs,
    )
    sock = listen(host, port)
    if on_listen is not None:
        on_listen(f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}/v1")
    server = app.state.server
    runner = _Uvicorn(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5), server)
    http = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, name="gpt2-http", daemon=True)
    http.start()
    try:
        if load is not None:
            server.load_model()
        with runner.capture_signals():  # uvicorn's handlers, which only the main thread may install
            http.join()
    finally:  # the end, or a load that failed or was interrupted: uvicorn stops first
        runner.should_exit = True
        http.join()
