"""README.md and docs/*.md stay true: their shell and Python blocks run, on a tiny model.

Each page runs in a directory of its own (`sandbox`), where the released names (`gpt2`,
`gpt2-large`, ...) load a tiny GPT-2 with random weights from a Hugging Face cache, offline, and
the files the examples read and do not write themselves (notes.txt, my_text.txt, ...) are made
from the tests' corpus; what they write must be what .gitignore keeps out of a clone. How a
page marks a block it cannot run, and what is checked then: docs/testing.md.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from forks import Forks
from helpers import REPO, corpus

from gpt2.cli.main import REFERENCES, build_parser

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = ("sh", "bash", "console", "python")  # the blocks that are code; others (a tree, a table) are text
MARKS = ("not run", "output not compared", "run in the background")
RELEASED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
ELLIPSIS = "…"  # in a console block's output: any text; a line of it alone: any lines


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


# Long runs, shortened where a block runs (and only there): written as the docs show them.
SHORTER = [
    (re.compile(r"(--max-iters[ =]|max_iters=)(\d+)"), lambda n: max(1, n // 1000)),  # 2000 -> 2 iterations
    (re.compile(r"(--eval-iters[ =]|eval_iters=)(\d+)"), lambda n: min(n, 2)),
    (re.compile(r"(--grad-accum[ =]|grad_accum=)(\d+)"), lambda n: 1),
]


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str | None  # one of MARKS, from the comment just before the block
    reason: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the mark of the `<!-- MARK: reason -->` line before it."""
    lines, found, i = page.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)\s*", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark, reason = None, ""
        if before.startswith("<!--"):
            comment = re.fullmatch(rf"<!-- ({'|'.join(MARKS)}): (.+) -->", before)
            assert comment, f"{page.name}:{i}: unknown mark {before!r}: one of {MARKS}, then ': reason'"
            mark, reason = comment.groups()
        found.append(Block(page, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", mark, reason))
        i = end + 1
    return found


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (`$ ` lines, continued by a final backslash), each with its output lines."""
    commands: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command += "\n" + next(lines)
            commands.append((command, []))
        else:
            assert commands, f"output before any command: {line!r}"
            commands[-1][1].append(line)
    return commands


def shell_text(block: Block) -> str:
    """The shell commands of a sh, bash or console block."""
    if block.lang == "console":
        return "".join(command + "\n" for command, _ in console_commands(block.text))
    return block.text


def invocations(script: str) -> list[tuple[str, list[str]]]:
    """The `gpt2 ...` and `make ...` commands of a shell script, as (program, arguments); `gpt2` also
    under `torchrun -m gpt2` and as .venv/bin/gpt2. Shell syntax beyond pipes, lists, comments
    and VAR=value prefixes is not read."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split, lexer.commenters = True, "#"
        segment: list[str] = []
        for word in [*lexer, ";"]:
            if word and set(word) <= set(";&|()"):
                words = [w for w in segment if not re.fullmatch(r"[A-Za-z_]\w*=.*", w)] or [""]  # VAR=value first
                if Path(words[0]).name in ("gpt2", "make"):
                    found.append((Path(words[0]).name, words[1:]))
                elif "-m" in words and words[words.index("-m") + 1 :][:1] == ["gpt2"]:
                    found.append(("gpt2", words[words.index("-m") + 2 :]))
                segment = []
            else:
                segment.append(word)
    return found


def check_command(program: str, argv: list[str]) -> None:
    """A `gpt2` command must parse with gpt2's own parser (a renamed flag fails); `make`, name a target."""
    if program == "make":
        targets = set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), re.M))
        named = [a for a in argv if "=" not in a and not a.startswith("-")]
        assert set(named) <= targets, f"make {' '.join(argv)}: no target {set(named) - targets} in the Makefile"
        return
    try:
        args, unknown = build_parser().parse_known_args(argv)
    except (Exception, SystemExit) as e:
        raise AssertionError(f"gpt2 {shlex.join(argv)}: {e}") from None
    assert not unknown, f"gpt2 {shlex.join(argv)}: unrecognized arguments {unknown}"
    named = {a.split("=")[0] for a in argv if a.startswith("--")}
    assert named <= flags(args.command), (
        f"gpt2 {shlex.join(argv)}: {named - flags(args.command)} not spelled out in its --help"
    )


@functools.cache
def flags(command: str) -> frozenset[str]:
    """The flags `gpt2 COMMAND --help` names: argparse would take an abbreviation (or a flag since
    renamed to a longer one) without a word, and the docs must spell each flag out."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        build_parser().parse_args([command, "--help"])
    return frozenset(re.findall(r"--[a-z][\w-]*", shown.getvalue()))


ALL_BLOCKS = [block for page in PAGES for block in blocks(page) if block.lang in RUN]


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=str)
def test_every_block_parses_and_its_commands_exist(block):
    """Checks only, for every block run or not: it parses, and its gpt2 flags and make targets exist."""
    if block.lang == "python":
        compile(block.text, str(block), "exec")
        return
    syntax = subprocess.run(["bash", "-n"], input=shell_text(block), capture_output=True, text=True)
    assert syntax.returncode == 0, f"{block}: {syntax.stderr}"
    for program, argv in invocations(shell_text(block)):
        check_command(program, argv)


def test_each_command_has_a_page_that_its_help_and_the_readme_name(capsys):
    from gpt2.cli import main

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^    ([\w-]+)(?:  |$)", build_parser().format_help(), re.M)
    assert sorted(commands) == sorted(REFERENCES)
    for command, page in REFERENCES.items():
        assert (REPO / page).is_file() and f"]({page})" in readme, page
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"reference: {page} " in capsys.readouterr().out


OTHER_PROGRAMS_FLAGS = {
    "--corpus",
    "--quick",
    "--graph_file_dir",
    *("--nnodes", "--max-restarts", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf"),
    "--monitor-interval",
}  # flags the prose gives to other programs (benchmarks/*.py, circuit-tracer, torchrun)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_flags_the_prose_names_exist(page):
    """A flag in the text (`--top-p`), outside the blocks, is one of some gpt2 command's."""
    known = set().union(*map(flags, REFERENCES), re.findall(r"--[a-z][\w-]*", build_parser().format_help()))
    prose = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    named = {flag for code in re.findall(r"`([^`]+)`", prose) for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", code)}
    assert named - OTHER_PROGRAMS_FLAGS <= known, (
        f"{page.name}: no gpt2 command has {named - OTHER_PROGRAMS_FLAGS - known}"
    )


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_and_paths_lead_somewhere(page):
    """Every relative link reaches a file (and its heading), and every path of the code the page names exists."""
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        path = (page.parent / path).resolve() if path else page
        assert path.exists(), f"{page.name}: link to {target}: no such file"
        assert not anchor or anchor in anchors(path), f"{page.name}: link to {target}: no such heading"
    for path in re.findall(r"`(?:src/)?(gpt2/[\w/]+\.py)", text):  # a module the prose names
        assert (REPO / "src" / path).exists(), f"{page.name}: {path} does not exist"
    for block in blocks(page):
        if block.lang == "":
            for path in re.findall(r"^((?:src|tests|scripts|benchmarks|docs)/\S*)", block.text, re.M):
                assert (REPO / path).exists(), f"{block}: {path} does not exist"


def test_no_two_runs_the_pages_start_share_a_directory():
    """A user who follows one page after another keeps each run: every training run a page starts
    (`gpt2 train` without --resume or --overwrite, run or not; `train(OUT, ...)` from Python)
    writes a directory of its own, its --out or its recipe's out."""
    from gpt2.settings import read_recipe

    starts: dict[str, list[str]] = {}
    for block in ALL_BLOCKS:
        outs = (
            re.findall(r"\btrain\(\s*[\"']([^\"']+)", block.text)
            if block.lang == "python"
            else [
                argv[argv.index("--out") + 1]
                if "--out" in argv
                else read_recipe(argv[argv.index("--recipe") + 1])["out"]
                for program, argv in invocations(shell_text(block))
                if program == "gpt2" and argv[:1] == ["train"] and not {"--resume", "--overwrite", "--help"} & set(argv)
            ]
        )
        for out in outs:
            starts.setdefault(out, []).append(str(block))
    assert {out: where for out, where in starts.items() if len(where) > 1} == {}


def unignored(paths: list[str]) -> list[str]:
    """Of `paths`, relative to a clone's root, those its .gitignore does not keep out."""
    if not paths:
        return []
    done = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin", "-z"],
        input="\0".join(paths) + "\0",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr  # 0: some are ignored, 1: none
    return sorted(set(paths) - set(done.stdout.split("\0")))


def test_gitignore_keeps_no_file_of_the_project_out():
    """Its patterns name what the docs write in a clone's root (/data/, not src/gpt2/data/)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True, timeout=60, check=True
    )
    assert unignored(tracked := done.stdout.split("\0")[:-1]) == sorted(tracked)


# --------------------------------------------------------------------- running the pages


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """A Hugging Face cache in which every released name is one tiny GPT-2 with random weights."""
    import torch

    from gpt2 import GPT2, GPT2Config

    home = tmp_path_factory.mktemp("hf-home")
    torch.manual_seed(0)
    model = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2(GPT2Config(n_layer=2, n_head=2, n_embd=32)).save_pretrained(model)  # GPT-2's vocabulary and context
    for name in RELEASED:
        snapshot = home / "hub" / f"models--openai-community--{name}" / "snapshots" / ("0" * 40)
        shutil.copytree(model, snapshot)
        (snapshot.parents[1] / "refs").mkdir()
        (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)  # the cache's layout, as huggingface_hub writes it
    return home


# A page's gpt2 commands are forked from one process that imported torch once (tests/forks.py);
# `gpt2 serve`, run in the background until the page ends and then stopped by a signal, is started
# as a user starts it. A `gpt2 train` that names no --eval-iters (its default's or its recipe's
# 200 or 20 batches) evaluates on 2, as SHORTER makes those that name it; a resume keeps its run's.
GPT2_COMMAND = """#!/bin/sh
if [ "$1" = serve ]; then exec "{python}" -m gpt2 "$@"; fi
if [ "$1" = train ]; then
    case " $* " in *" --eval-iters"*|*" --resume "*|*" -h "*|*" --help "*) ;; *) set -- "$@" --eval-iters 2 ;; esac
fi
exec "{forked}" "$@"
"""


# Pages run as a user's fresh clone runs them: offline, in an empty directory, no released model
# in the Hugging Face cache, no ../shared: what they use, they make or take from what gpt2 ships.
AS_A_USER = [REPO / "README.md"]


def sandbox(root: Path, hf_home: Path, page: Path, forks: Forks) -> tuple[Path, dict[str, str]]:
    """A page's working directory, with the files its examples read, and the environment to run them in."""
    text = corpus()[1]
    work = root / "work"
    work.mkdir()
    files = {
        "notes.txt": text[:3_000],
        "my_text.txt": text[:40_000],
        "corpus.txt": text[:10_000],
        "wiki.test.raw": text[:5_000],
        "books/a.txt": text[:20_000],
        "books/b.txt": text[20_000:30_000],
        "corpus/one.txt": text[:10_000],
        "corpus/two.txt": text[10_000:20_000],
        "lambada_test.jsonl": "".join(
            f'{{"text": "{" ".join(line.split())}"}}\n'
            for line in [text[i : i + 200].replace('"', "'").replace("\\", "/") for i in range(0, 4000, 200)]
        ),
    }
    if page in AS_A_USER:
        files, hf_home = {}, root / "empty-hf-home"
    for name, content in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(content, encoding="utf-8")
    if page not in AS_A_USER:
        snapshot = hf_home / "hub" / "models--openai-community--gpt2" / "snapshots" / ("0" * 40)
        shutil.copytree(snapshot, work / "path" / "to" / "dir")  # the docs' placeholder for a model directory
        shutil.copytree(REPO / "tests" / "fixtures" / "tf_gpt2_tiny", work / "models" / "124M")  # OpenAI's layout, tiny
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpt2").write_text(GPT2_COMMAND.format(python=sys.executable, forked=forks.command))
    (bin_dir / "gpt2").chmod(0o755)
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "GPT2_CACHE": str(root / "gpt2-cache"),
        "OMP_NUM_THREADS": "1",  # many small runs: torch's threads would wait on each other (docs/devices.md)
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    return work, env


def shorter(text: str) -> str:
    for pattern, value in SHORTER:
        text = pattern.sub(lambda m, value=value: f"{m.group(1)}{value(int(m.group(2)))}", text)
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matches(expected: list[str], output: str) -> bool:
    """Output against a console block's lines: `…` is any text, a line of `…` alone any lines.
    Progress bars (lines redrawn with carriage returns) are left out."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line == ELLIPSIS else re.escape(line).replace(ELLIPSIS, r"[^\n]*") + r"\n"
        for line in expected
    )
    kept = "".join(line for line in re.split(r"(?<=\n)", output) if "\r" not in line)
    return re.fullmatch(pattern, kept) is not None


# What a new user following the README meets nowhere: its generations fit the models' context.
NOT_FOR_A_NEW_USER = "exceed the context"


def run_shell(block: Block, script: str, work: Path, env: dict[str, str]) -> None:
    if block.lang != "console":
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{block}: exit status {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        assert block.page not in AS_A_USER or NOT_FOR_A_NEW_USER not in done.stderr, f"{block}:\n{done.stderr[-3000:]}"
        return
    for command, expected in console_commands(script):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
        output = done.stdout.decode("utf-8", errors="replace")  # carriage returns kept, as a terminal gets them
        status = 2 if any(line.startswith("gpt2: error:") for line in expected) else 0
        assert done.returncode == status, (
            f"{block}: {command}: exit status {done.returncode}, not {status}\n{output[-3000:]}"
        )
        if block.mark != "output not compared":
            assert matches(expected, output), (
                f"{block}: {command}: expected\n" + "\n".join(expected) + f"\ngot\n{output}"
            )


class Background:
    """A block run in the background (a server), until the page ends."""

    def __init__(self, block: Block, script: str, port: int, work: Path, env: dict[str, str]) -> None:
        self.log = work.parent / "background.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", script], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while not self.healthy(port):
            assert self.process.poll() is None and time.monotonic() < deadline, (
                f"{block}: {self.log.read_text()[-3000:]}"
            )
            time.sleep(0.2)

    @staticmethod
    def healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the shell and the server it started
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


# Python blocks of a page run in one interpreter, one after another, sharing their names; it is
# forked as the page's gpt2 commands are (tests/forks.py).
PYTHON_RUNNER = """
import sys
names = {"__name__": "__main__"}
for path in sys.argv[1:]:
    exec(compile(open(path, encoding="utf-8").read(), path, "exec"), names)
"""


def run_page(page: Path, hf_home: Path, root: Path, forks: Forks) -> None:
    """The page's shell blocks in order, then its Python blocks, in its own directory; a server it
    starts in the background serves on a free port instead of 8000."""
    work, env = sandbox(root, hf_home, page, forks)
    placed = set(work.rglob("*"))  # the test's; the rest the page writes
    port = free_port()
    local = lambda text: shorter(text).replace("127.0.0.1:8000", f"127.0.0.1:{port}")  # noqa: E731
    background, python = [], []
    try:
        for block in blocks(page):
            if block.lang not in RUN or block.mark == "not run":
                continue
            if block.lang == "python":
                python.append(root / f"{page.stem}-line-{block.line}.py")
                python[-1].write_text(local(block.text), encoding="utf-8")
            elif block.mark == "run in the background":
                script = local(block.text).replace("gpt2 serve", f"gpt2 serve --port {port}")
                background.append(Background(block, script, port, work, env))
            else:
                run_shell(block, local(block.text), work, env)
        if python:
            done = subprocess.run(
                [forks.python, "-c", PYTHON_RUNNER, *map(str, python)],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{page.name}'s Python blocks:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            assert page not in AS_A_USER or NOT_FOR_A_NEW_USER not in done.stderr, (
                f"{page.name}'s Python blocks:\n{done.stderr}"
            )
    finally:
        for server in background:
            server.stop()
    written = [str(path.relative_to(work)) for path in set(work.rglob("*")) - placed if not path.is_dir()]
    assert unignored(written) == [], f"{page.name} writes what .gitignore lets into a clone: {unignored(written)}"


def commands_run(page: Path) -> list[object]:
    """The commands a page runs: its gpt2 commands and its Python blocks."""
    run = [b for b in blocks(page) if b.lang in RUN and b.mark != "not run"]
    return [b for b in run if b.lang == "python"] + [
        c for b in run if b.lang != "python" for c in invocations(shell_text(b))
    ]


RUNNABLE = [page for page in PAGES if any(b.lang in RUN and b.mark != "not run" for b in blocks(page))]


@pytest.fixture(scope="module")
def ran(request, hf_home, forks, tmp_path_factory) -> dict[Path, BaseException | None]:
    """The pages this session tests, run a few at a time (each command is one process of one
    thread, and most of their time is Python and torch starting): what each raised, or None."""
    wanted = [
        item.callspec.params["page"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_page_runs"
    ]
    wanted.sort(key=lambda page: -len(commands_run(page)))  # the longest first
    workers = max(2, min(4, os.cpu_count() or 1))

    def run(page: Path) -> BaseException | None:
        try:
            run_page(page, hf_home, tmp_path_factory.mktemp(page.stem), forks)
        except BaseException as e:  # noqa: BLE001 (reported by the page's own test)
            return e
        return None

    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(wanted, pool.map(run, wanted)))


@pytest.mark.parametrize("page", RUNNABLE, ids=page_id)
def test_page_runs(page, ran):
    if ran[page] is not None:
        raise ran[page]
