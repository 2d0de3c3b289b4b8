"""The engine's thread: loads the models, then decodes the active requests together, token by token.

Torch work never runs on the event loop, and all of it runs on this one thread: the model
is loaded here too, because every thread that calls into torch gets its own OpenMP team,
and two teams on two cores halve decode speed (measured: 37 ms vs 64 ms per token).
Each loop turn advances every active stream by one event, so several requests progress
side by side instead of waiting for each other (true batched forwards are the next step;
the model already takes a batch). Replies go out through `emit`, which hands them to the
event loop in order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

from inference.loader import LoadedModel
from inference.pipeline import ChatPipeline
from inference.sampling import SamplingParams
from inference.trace import Finished, TraceEvent, TraceLevel
from inference.errors import InvalidRequestError
from inference.trace_json import detail_to_dict, event_to_dict
from webapp.worker.protocol import error_reply, params_from_dict

log = logging.getLogger("roundtrip.worker")
STEP_IDLE_LIMIT = 1800.0  # seconds a step-mode request may wait for "next" before it is dropped
INSPECT_BUDGET_POSITIONS = 2048  # asked for on purpose, one token at a time: a bigger budget than live frames
Emit = Callable[[str, dict[str, Any]], None]


@dataclass
class Job:
    model_id: str
    message: dict[str, Any]
    received_at: float  # perf_counter when the worker got the message
    stream: Generator[TraceEvent, None, None] | None = None
    started_at: float = 0.0
    cancelled: bool = False
    paused_since: float | None = None  # step mode: waiting for "next" after a token, since then
    reply_to: str = field(init=False)
    request_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.reply_to = self.message["reply_to"]
        self.request_id = self.message["request_id"]


class EngineRunner:
    """One thread for all models: `loaders` maps model ids to functions that load them (on this thread)."""

    def __init__(
        self,
        loaders: dict[str, Callable[[], LoadedModel]],
        on_ready: Callable[[str], None],
        emit: Emit,
        control_channel: str,
        max_active: int,
        max_queued: int,
    ) -> None:
        self.pipelines: dict[str, ChatPipeline] = {}
        self.failures: dict[str, str] = {}  # model id -> why it could not be loaded
        self._loaders = loaders
        self._on_ready = on_ready
        self._emit = emit
        self._control = control_channel
        self._max_active = max_active
        self._inbox: queue.Queue[Job | None] = queue.Queue(maxsize=max_queued)  # None: stop
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._wake = threading.Event()  # something changed: a new job, a cancel, a "next"
        self._thread = threading.Thread(target=self._main, name="roundtrip-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """End the engine thread (after the current step), dropping queued and active requests."""
        self._stopping = True
        self._wake.set()
        try:
            self._inbox.put_nowait(None)
        except queue.Full:
            pass  # the loop sees _stopping at its next turn
        self._thread.join(timeout)

    def _main(self) -> None:
        for model_id, load in self._loaders.items():
            if self._stopping:
                return
            try:
                pipeline = ChatPipeline(load())
                _warm_up(pipeline)
            except Exception as exc:  # a broken model file must not take the other models down
                log.exception("model %s failed to load", model_id)
                self.failures[model_id] = str(exc)
            else:
                self.pipelines[model_id] = pipeline
            self._on_ready(model_id)
        self._run()

    def submit(self, model_id: str, message: dict[str, Any]) -> None:
        """Queue a generate (or inspect) request for a loaded model; answer 503 at once when the queue is full."""
        job = Job(model_id, message, time.perf_counter() - max(0.0, time.time() - float(message.get("sent_at", time.time()))))
        try:
            self._inbox.put_nowait(job)
        except queue.Full:
            self._emit(job.reply_to, {"type": "error", "request_id": job.request_id, "status": 503, "code": "overloaded",
                                      "message": "The model is overloaded with requests; retry shortly.", "param": None, "retry_after": 2})
            return
        with self._lock:
            self._jobs[job.request_id] = job
        self._wake.set()
        self._emit(job.reply_to, {"type": "queued", "request_id": job.request_id, "control": self._control})

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client left); it is dropped before its next token."""
        self._update(request_id, cancelled=True)

    def next_token(self, request_id: str) -> None:
        """Step mode: let a paused request produce its next token."""
        self._update(request_id, paused_since=None)

    def _update(self, request_id: str, **changes: Any) -> None:
        """Change a known job's flags from another thread and wake the engine loop to see them."""
        with self._lock:
            job = self._jobs.get(request_id)
        if job is not None:
            for name, value in changes.items():
                setattr(job, name, value)
            self._wake.set()

    def tokenize(self, model_id: str, message: dict[str, Any]) -> None:
        """Answer at once, from the calling thread: the tokenizer needs no torch."""
        enc = self.pipelines[model_id].loaded.tokenizer.encode(str(message.get("text", "")))
        self._emit(message["reply_to"], {"type": "tokens", "request_id": message["request_id"], "ids": enc.ids, "tokens": enc.tokens, "spans": [list(s) for s in enc.spans]})

    def _run(self) -> None:
        active: list[Job] = []
        while not self._stopping:
            while len(active) < self._max_active:
                try:
                    job = self._inbox.get(block=not active)
                except queue.Empty:
                    break
                if job is None:
                    break
                if self._start(job):
                    active.append(job)
                else:
                    self._forget(job)
            if active and all(job.paused_since is not None and not job.cancelled for job in active):
                self._wake.wait(1.0)  # every active request waits for its student: sleep, do not spin
            self._wake.clear()
            now = time.perf_counter()
            for job in list(active):
                if job.paused_since is not None and now - job.paused_since > STEP_IDLE_LIMIT:
                    job.cancelled = True  # its student left without a word
                if job.paused_since is not None and not job.cancelled:
                    continue
                if not self._advance(job):
                    active.remove(job)
                    self._forget(job)
        for job in active:
            if job.stream is not None:
                job.stream.close()

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.request_id, None)

    def _inspect(self, job: Job) -> None:
        """Recompute the full-level detail for the last position of the given ids, and reply with it."""
        pipeline = self.pipelines[job.model_id]
        ids = job.message.get("ids")
        config = pipeline.loaded.config
        try:
            if (
                not isinstance(ids, list)
                or not 1 <= len(ids) <= config.context_length
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < config.vocab_size for i in ids)
            ):
                raise InvalidRequestError(f"'ids' must be 1 to {config.context_length} token ids below {config.vocab_size}", "ids")
            detail = pipeline.engine.inspect(ids)
        except Exception as exc:
            self._emit(job.reply_to, error_reply(job.request_id, exc))
            return
        reply = {"type": "inspection", "request_id": job.request_id, "detail": detail_to_dict(detail, pipeline.loaded.tokenizer, INSPECT_BUDGET_POSITIONS)}
        self._emit(job.reply_to, reply)

    def _start(self, job: Job) -> bool:
        """Validate and tokenize; reply "accepted" or an error. True when the job should run."""
        if job.cancelled:
            return False
        msg = job.message
        if msg.get("type") == "inspect":
            self._inspect(job)
            return False
        pipeline = self.pipelines[job.model_id]
        try:
            prepared = pipeline.prepare(
                msg["messages"],
                params_from_dict(msg["params"]),
                bool(msg.get("truncate_history")),
                received_at=job.received_at,
                fit_max_tokens=bool(msg.get("fit_max_tokens")),
            )
            level = TraceLevel(msg.get("level", "off"))
            if msg.get("step") and level == TraceLevel.OFF:
                level = TraceLevel.SUMMARY  # step mode pauses on "text" events, which only traced levels send for every token
            job.stream = pipeline.stream(prepared, level)
        except Exception as exc:  # every failure becomes an error reply, never a dead worker
            self._emit(job.reply_to, error_reply(job.request_id, exc))
            return False
        job.started_at = time.perf_counter()
        self._emit(job.reply_to, {"type": "accepted", "request_id": job.request_id, "control": self._control,
                                  "prompt_tokens": len(prepared.prompt.ids), "seed": prepared.params.seed,
                                  "queued": job.started_at - job.received_at})
        return True

    def _advance(self, job: Job) -> bool:
        """Send the job's next event; False once it is done, failed or cancelled."""
        assert job.stream is not None
        if job.cancelled:
            job.stream.close()
            self._emit(job.reply_to, {"type": "cancelled", "request_id": job.request_id})
            return False
        try:
            event = next(job.stream)
        except StopIteration:
            return False
        except Exception as exc:
            log.exception("generation %s failed", job.request_id)
            self._emit(job.reply_to, error_reply(job.request_id, exc))
            return False
        data = event_to_dict(event, self.pipelines[job.model_id].loaded.tokenizer)
        if isinstance(event, Finished):
            data["timings"]["queue"] = job.started_at - job.received_at
        self._emit(job.reply_to, {"type": "event", "request_id": job.request_id, "event": data})
        if data["event"] == "text" and job.message.get("step"):
            job.paused_since = time.perf_counter()
        return not isinstance(event, Finished)


def _warm_up(pipeline: ChatPipeline) -> None:
    """One short generation, so the first real request does not pay for kernel selection and first-touch pages."""
    request = pipeline.prepare([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0.0, max_tokens=2))
    for _ in pipeline.stream(request):
        pass
