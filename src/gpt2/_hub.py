"""Files from the Hugging Face hub (the released models, WikiText-2): from its cache when they
are there, else downloaded; without a network, an answer in a second rather than 25 (and the
same quick answer for a dataset streamed by name, `check_reachable`).

huggingface_hub retries a request that fails with backoff, about 25 s in all, before it says the
network is down. What is read from the hub here never changes once published, so a copy in the
cache is read without asking the hub; without one, a single quick request through the hub's own
HTTP session (proxies included) first tells whether the hub can be reached at all.
"""

from __future__ import annotations

from pathlib import Path

REACH_TIMEOUT = 5.0  # seconds to wait for the hub's first answer


def hub_file(repo: str, filename: str, repo_type: str = "model") -> Path:
    """The local path of one file of a hub repository (in the hub's cache), downloaded once.
    Any failure (offline, unreachable, not found) raises OSError with a one-line reason."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        try:
            return Path(hf_hub_download(repo, filename, repo_type=repo_type, local_files_only=True))
        except LocalEntryNotFoundError:
            if constants.HF_HUB_OFFLINE:
                raise OSError("it is not in the Hugging Face cache, and HF_HUB_OFFLINE is set") from None
        check_reachable()
        return Path(hf_hub_download(repo, filename, repo_type=repo_type))
    except Exception as e:  # huggingface_hub's and its HTTP client's errors differ between versions
        raise OSError(_first_line(e)) from None


def download_error(what: str, repo: str, reason: OSError) -> str:
    """The message for a download of `what` from the hub repository `repo` that `hub_file` refused
    with `reason`; the caller adds what to do without a network."""
    return f"could not download {what} from the Hugging Face hub ({repo}): {reason}"


def check_reachable() -> None:
    """Raise OSError (with a one-line reason) unless the hub (HF_ENDPOINT) answers one quick request:
    the test that spares a caller the hub's retries. Offline (HF_HUB_OFFLINE) nothing is asked: the
    hub's libraries then fail at once, or read their cache."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return
    endpoint = constants.ENDPOINT
    try:
        get_session().head(endpoint, timeout=REACH_TIMEOUT)
    except Exception as e:
        raise OSError(f"cannot reach {endpoint} ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].rstrip(".") if text else type(e).__name__
