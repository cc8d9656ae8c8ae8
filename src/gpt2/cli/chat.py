"""`gpt2 chat`: a conversation with a model in the terminal, through its chat template."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from gpt2.cli.common import HelpFormatter, command_line_text, whole_number
from gpt2.cli.flags import with_flags
from gpt2.cli.options import (
    add_chat_template_flag,
    add_cuda_graphs_flag,
    add_inference_device_flags,
    add_model_flag,
    add_sampling_flags,
    check_cuda_graph_flags,
    check_device,
    load_model,
    read_chat_template,
    read_sampling,
    with_top_k,
)
from gpt2.errors import GPT2Error
from gpt2.settings import CHAT_MAX_NEW_TOKENS


def cmd(args: argparse.Namespace) -> int:
    from gpt2.generation.decoding import check_max_new_tokens
    from gpt2.generation.generate import Chat

    chat_template = read_chat_template(args)  # what can fail without the model, before it loads
    sampling = read_sampling(args)
    if args.max_new_tokens is not None:
        check_max_new_tokens(args.max_new_tokens)
    check_device(args)
    check_cuda_graph_flags(args)
    system = (
        None if args.system is None else command_line_text(args.system, "the system message given on the command line")
    )
    model, tokenizer = load_model(
        args, needs="a conversation is text, which needs one (gpt2 generate --ids continues token ids)"
    )
    chat = Chat(
        model,
        tokenizer,
        chat_template=chat_template,
        system=system,
        max_new_tokens=args.max_new_tokens,
        sampling=with_top_k(sampling, model),
        seed=args.seed,
    )
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):  # line editing and history for input(), where the platform has it
            importlib.import_module("readline")
        print(
            f"gpt2: chatting with {args.model}; /reset starts over, Ctrl-C stops a reply, Ctrl-D leaves",
            file=sys.stderr,
        )
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:  # Ctrl-D, or the end of piped input
            if interactive:
                print()
            return 0
        if line.strip() == "/reset":
            chat.reset()
            print("gpt2: the conversation starts over", file=sys.stderr)
        elif line.strip():
            _chat_turn(chat, line, args)


def _chat_turn(chat, text: str, args: argparse.Namespace) -> None:
    """One reply, streamed; a message that cannot be answered is one line on stderr, and the
    conversation goes on. Ctrl-C stops the reply (which is not kept), as llama.cpp's REPL does."""
    try:
        pieces = chat.reply(text)
    except GPT2Error as e:
        print(f"gpt2: error: {with_flags(e, args.flags)}", file=sys.stderr)
        return
    if chat.dropped:
        print(f"gpt2: the {chat.dropped} oldest messages are left out, to fit the model's context", file=sys.stderr)
    try:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        print("\ngpt2: reply stopped (not kept in the conversation)", file=sys.stderr)
        return
    sys.stdout.write("\n")
    sys.stdout.flush()


EXAMPLES = """\
examples:
  gpt2 chat --model out-chat                       # a model fine-tuned on conversations
  gpt2 chat --model gpt2 --chat-template src/gpt2/tokenizer/chat_template.jinja --system "You are terse."
  printf 'Hi\\nWhat is 2+2?\\n' | gpt2 chat --model out-chat --temperature 0

Each line is a message; the reply streams as it is generated and joins the conversation.
/reset starts over (the --system message stays). Ctrl-C stops a reply (it is not kept) and
returns to the prompt; at the prompt, Ctrl-D (or the end of piped input) leaves. When the
conversation and a reply of --max-new-tokens no longer fit the model's context, its oldest
messages are left out, saying so on stderr.
"""


def add_parser(commands) -> None:
    chat = commands.add_parser(
        "chat",
        help="a conversation with a model in the terminal, through its chat template",
        description="Talk with a model: each message and the conversation before it are rendered by the chat "
        "template, and the reply streams as it is generated.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_model_flag(chat)
    add_chat_template_flag(chat, "the conversation")
    chat.add_argument("--system", metavar="TEXT", help="a system message that opens the conversation (default: none)")
    chat.add_argument(
        "--max-new-tokens",
        type=whole_number,
        default=None,
        help=f"the longest reply, in tokens (default: {CHAT_MAX_NEW_TOKENS}, or half the model's context if less)",
    )
    add_sampling_flags(chat)
    chat.add_argument(
        "--seed",
        type=whole_number,
        default=None,
        help="0 to 2**64-1: reply k samples from seed + k, so the same seed and messages give the same "
        "conversation (default: random)",
    )
    add_inference_device_flags(chat)
    add_cuda_graphs_flag(chat)
    chat.set_defaults(func=cmd, engine="torch")
