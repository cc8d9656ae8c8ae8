"""The server's one generation loop: a thread stepping a `gpt2.generation.decoding.Decoder` over every
row in flight, so that a request joins the running batch at the next step and leaves it when
it ends; and the server's Prometheus metrics, which the loop keeps.

    routes ──submit(rows, listener)──> Scheduler thread ──step──> Decoder ──> the model's engine
           <──listener(row, token, finish reason, error)──┘
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpt2.generation.caches import PrefixCache
from gpt2.generation.decoding import Decoder, Engine, Row, finish_reasons
from gpt2.model.model import GPT2
from gpt2.serve.protocol import BATCH_HINT, Limits, RequestError

CANCELLED = "cancelled"  # a row whose client left, or whose server stops: never reported


class Metrics:
    """Prometheus metrics of one server (its own registry, so that servers in one process do not mix)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpt2_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("gpt2_prompt_tokens", "prompt tokens of completion requests", registry=r)
        self.generated_tokens = Counter("gpt2_generated_tokens", "tokens generated", registry=r)
        self.queue = Gauge("gpt2_queue_length", "rows waiting for a slot in the batch", registry=r)
        self.batch = Gauge("gpt2_batch_size", "rows decoded at the last step", registry=r)
        # prompt tokens looked up in the prefix cache, and found there (vLLM's prefix_cache_queries, _hits)
        self.prefix_cache_queries = Counter(
            "gpt2_prefix_cache_queries", "prompt tokens looked up in the prefix cache", registry=r
        )
        self.prefix_cache_hits = Counter(
            "gpt2_prefix_cache_hits", "prompt tokens found in the prefix cache", registry=r
        )
        self.prefix_cache_bytes = Gauge(
            "gpt2_prefix_cache_bytes",
            "memory the prefix cache's blocks hold (at most the server's prefix_cache_mb)",
            registry=r,
        )
        # the two above miss the rows whose prompts are going in (and those not yet taken): this
        # one is 0 exactly when the loop holds no row, as it is once idle
        self.in_flight = Gauge(
            "gpt2_rows_in_flight", "rows the loop holds: waiting, filling their prompts or decoding", registry=r
        )
        self.ttft = Histogram(
            "gpt2_time_to_first_token_seconds",
            "from a completion request to its first token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        # speculative decoding's, as vLLM's spec_decode_num_draft_tokens and num_accepted_tokens
        self.draft_tokens = Counter("gpt2_draft_tokens", "tokens a draft model proposed", registry=r)
        self.accepted_tokens = Counter("gpt2_draft_accepted_tokens", "draft tokens the model kept", registry=r)


# (row, token, finish reason, error) from the loop's thread: the reason as the row had it then, for
# the row itself may have moved on by the time its route reads the event
Listener = Callable[[Row, "int | None", "str | None", "str | None"], None]


class Scheduler:
    """The server's one generation loop: a thread stepping a Decoder over every row in flight
    (speculatively, with a `draft` model: its engine beside the model's, limits.draft_tokens a step;
    or with limits.speculative "ngram", by prompt lookup)."""

    def __init__(self, model: GPT2, limits: Limits, metrics: Metrics, draft: GPT2 | None = None):
        def engine(
            m: GPT2, prefix_cache: PrefixCache | None = None
        ) -> Engine:  # a KV cache of the whole context for each row
            return m.engine(
                limits.max_batch_size,
                model.config.n_ctx,
                hint=BATCH_HINT,
                param="max_batch_size",
                prefix_cache=prefix_cache,
            )

        self.limits, self.metrics = limits, metrics
        prefix = None  # the model's prompts' blocks (the draft computes its own: it is cheap)
        if limits.prefix_cache_mb:
            prefix = PrefixCache(
                model.config, limits.prefix_cache_mb << 20, dtype=model.compute_dtype, device=model.device
            )
        self.counted = (0, 0)  # the prefix cache's queries and hits, as the metrics have them
        self.decoder = self._decoder(engine(model, prefix), None if draft is None else engine(draft))
        self.incoming: list[tuple[Row, Listener]] = []
        self.listeners: dict[Row, Listener] = {}
        self.wake = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="gpt2-decoder", daemon=True)
        self.thread.start()

    def submit(self, rows: Sequence[Row], listener: Listener) -> None:
        with self.wake:
            if self.closed:
                raise RequestError(503, "the server is shutting down", kind="server_error")
            if len(rows) > self.limits.max_queue:
                raise RequestError(
                    400,
                    f"the request asks for {len(rows)} rows (prompts times n), over the {self.limits.max_queue} "
                    f"that may wait at once (the server's max_queue)",
                    "n",
                )
            if self._waiting() + len(rows) > self.limits.max_queue:
                raise RequestError(
                    429,
                    f"the server is busy: {self.limits.max_queue} rows wait already; retry shortly",
                    kind="server_error",
                    headers={"Retry-After": "1"},
                )
            self.incoming += [(row, listener) for row in rows]
            self.wake.notify()

    def _waiting(self) -> int:
        """Rows waiting for a slot, less those whose clients left (they leave the queue at the next
        step): a client that leaves and asks again at once is not refused for its own old row."""
        waiting = [row for row, _ in self.incoming] + list(
            self.decoder.waiting
        )  # list(): one step of the loop's thread
        return sum(not row.done for row in waiting)

    def close(self) -> None:
        """Stop the loop: the rows in flight end with an error, new requests get a 503."""
        with self.wake:
            self.closed = True
            self.wake.notify()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        with torch.inference_mode():
            while self._take():
                stats = self.decoder.stats
                proposed, accepted = stats.proposed, stats.accepted
                try:
                    events = self.decoder.step()
                except Exception as e:  # noqa: BLE001  (a model that fails fails its rows, not the server)
                    self._fail(f"generation failed: {e}")
                    continue
                for (row, token), reason in zip(events, finish_reasons(events)):
                    self.listeners[row](row, token, reason, None)
                    self.metrics.generated_tokens.inc(token is not None)
                self.metrics.draft_tokens.inc(stats.proposed - proposed)
                self.metrics.accepted_tokens.inc(stats.accepted - accepted)
                self._count_prefix_cache()
                self._report()
                for row in [row for row in self.listeners if row.done]:
                    del self.listeners[row]
        self._fail("the server is shutting down")

    def _count_prefix_cache(self) -> None:
        cache = self.decoder.engine.prefix_cache
        if cache is not None:
            queries, hits = self.counted
            self.metrics.prefix_cache_queries.inc(cache.queries - queries)
            self.metrics.prefix_cache_hits.inc(cache.hits - hits)
            self.metrics.prefix_cache_bytes.set(cache.reserved_bytes)
            self.counted = (cache.queries, cache.hits)

    def _take(self) -> bool:
        """Move new rows into the decoder; wait while there is nothing to do. False: closed."""
        with self.wake:
            while not self.closed and not self.incoming and not self.decoder.busy:
                self._report()  # idle: every gauge 0
                self.wake.wait()
            for row, listener in self.incoming:
                self.decoder.add(row)
                self.listeners[row] = listener
            self.incoming.clear()
            self._report()
            return not self.closed

    def _report(self) -> None:
        """The gauges of the rows in flight, as the decoder holds them now."""
        decoder = self.decoder
        self.metrics.batch.set(len(decoder.active))
        self.metrics.queue.set(len(decoder.waiting))
        self.metrics.in_flight.set(
            len(self.incoming) + len(decoder.waiting) + len(decoder.filling) + len(decoder.active)
        )

    def _fail(self, message: str) -> None:
        """Every row in flight ends with an error (its route ends the row, after the tokens before it)."""
        for row, listener in list(self.listeners.items()):
            listener(row, None, None, message)
        self.listeners.clear()
        self.decoder = self._decoder(self.decoder.engine, self.decoder.draft)  # the rows that were in it are gone

    def _decoder(self, engine: Engine, draft: Engine | None) -> Decoder:
        return Decoder(engine, self.limits.max_num_batched_tokens, draft, self.limits.draft_tokens, self.limits.lookup)
