"""`gpt2` commands forked from one process that imported torch and gpt2 once.

A command run this way is the real program, `gpt2.cli.main`, in a process of its own, with the
command's arguments, directory, environment, standard streams, signals and exit status. Only its
start differs: it is forked from a process that imported torch and gpt2's modules, where a new
process imports them anew (about 2.5 s of CPU: torch 1.4 s, FSDP and its checkpoints 0.9 s), most of
a short command's time here. The docs pages' commands and Python blocks (`python -c`, forked the
same way) and torchrun's processes run so (`torchrun --no-python FORKS/gpt2`); a few tests still
start `python -m gpt2` as users do.

    forks = Forks(directory)  # forks.command: the `gpt2` program to run
    subprocess.run([forks.command, "generate", "Hi", ...])
    forks.stop()
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The server: for each connection, a process that takes the command's streams, directory and
# environment, forks the command, passes on the signals its client gets, and answers its exit status.
SERVER = r"""
import atexit, json, os, select, signal, socket, struct, sys, threading, traceback
import torch._dynamo  # imported by an optimizer's first step
import matplotlib.backends.backend_agg, matplotlib.figure  # loss.png
import gpt2.cli, gpt2.data, gpt2.evaluation.evaluate, gpt2.generation.generate, gpt2.inspect
import gpt2.model.pretrained, gpt2.training.train


def receive(connection):
    message, streams, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while len(message) < 8 or len(message) < 8 + struct.unpack("!Q", message[:8])[0]:
        message += connection.recv(1 << 20)
    for stream, fd in zip(streams, (0, 1, 2)):
        os.dup2(stream, fd)
        os.close(stream)
    return json.loads(message[8:])


def python_c(argv):
    # `python -c CODE ARG...` (argv: -c, CODE, ARG...): CODE runs as __main__, with sys.argv ["-c", ARG...]
    if argv[:1] != ["-c"] or len(argv) < 2:
        raise SystemExit(f"the forked python runs `python -c CODE ARG...` only, not {argv[:2]}")
    sys.argv = ["-c", *argv[2:]]
    exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})


def run(program, argv):
    # main's exit as Python's, less the teardown of every module (a second with torch's loaded):
    # the exit handlers run and the streams are flushed, as multiprocessing ends a forked process
    try:
        code = gpt2.cli.main(argv) if program == "gpt2" else python_c(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # as Python's exit: threads joined, then the handlers of threading's and of atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve(connection):
    command = receive(connection)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    if (pid := os.fork()) == 0:
        connection.close()
        # for a signal only the command may get (SIGSTOP stops its client)
        if path := os.environ.get("FORKED_PID_FILE"):
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter
        if os.environ.get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
        sys.argv = ["gpt2", *command["argv"]]
        run(command["program"], command["argv"])
    while True:
        if select.select([connection], [], [], 0.05)[0]:
            signals = connection.recv(64)
            for signum in signals or [signal.SIGKILL]:  # no signals: the client was killed
                os.kill(pid, signum)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)


signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the commands' processes are reaped as they end
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(64)
print("ready", flush=True)
while True:
    connection, _ = server.accept()
    if os.fork():
        connection.close()
        continue
    server.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    serve(connection)
"""

# The client, the `gpt2` program: the standard library only, so that it starts in milliseconds.
CLIENT = r"""
import json, os, signal, socket, struct, sys
connection = socket.socket(socket.AF_UNIX)
connection.connect({socket!r})
request = json.dumps(
    {{"program": {program!r}, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
).encode()
socket.send_fds(connection, [struct.pack("!Q", len(request)) + request], [0, 1, 2])
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, lambda signum, frame: connection.send(bytes([signum])))
status = int(connection.recv(16) or 1)
if status < 0:  # ended by a signal: so does this process
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
sys.exit(status)
"""


class Forks:
    """The server, started in `directory`; `command`, the `gpt2` program whose runs it forks, and
    `python`, whose runs (`python -c CODE ARG...` only) it forks the same way."""

    def __init__(self, directory: Path, src: Path):
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",  # each command's threads: torch reads it at its import
            "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        socket = directory / "socket"
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(socket)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.server.stdout.readline() == "ready\n", "the fork server did not start"
        self.command, self.python = (self._client(directory, program, socket) for program in ("gpt2", "python"))

    @staticmethod
    def _client(directory: Path, program: str, socket: Path) -> Path:
        (directory / f"{program}-client.py").write_text(CLIENT.format(socket=str(socket), program=program))
        command = directory / program
        command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{directory / f"{program}-client.py"}" "$@"\n')
        command.chmod(0o755)
        return command

    def stop(self) -> None:
        self.server.kill()
        self.server.wait()
