"""The engine's thread: loads the models, then feeds their schedulers and sends what each step produced.

Torch work never runs on the event loop, and all of it runs on this one thread: the
model is loaded here too, because every thread that calls into torch gets its own OpenMP
team, and two teams on two cores halve decode speed (measured: 37 ms vs 64 ms per token).
Templates and tokenization (no torch) run on a second, "prepare" thread, so a huge
prompt never stalls the decode loop. Everything else arrives as commands on a queue;
replies go out through `emit`, which hands them to the event loop in order.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from inference.chat_template import Message
from inference.errors import InvalidRequestError
from inference.loader import LoadedModel
from inference.memory import return_free_memory
from inference.params import SamplingParams
from inference.pipeline import ChatPipeline
from inference.scheduler import KVBudgetExceededError, QueueFullError, Scheduler, SchedulerConfig, SequenceOutput
from inference.sequence import SequenceRequest
from inference.tokenizer import BPETokenizer
from inference.trace import Sampled, TraceLevel
from inference.trace_json import attention_to_dict, detail_to_dict, event_to_dict
from webapp.metrics import metrics
from webapp.worker.protocol import (
    Accepted,
    DetokenizeRequest,
    GenerateRequest,
    InspectRequest,
    ModelSlots,
    PromptAttentionRequest,
    ResampleRequest,
    TokenizeRequest,
    TokensReply,
    error_reply,
    overloaded,
    params_from_dict,
)

log = logging.getLogger("roundtrip.worker")
PROMPT_MATRIX_POSITIONS = 256  # the prompt's token x token matrix covers at most its first this many positions
STEP_IDLE_LIMIT = 1800.0  # seconds a step-mode request may wait for "next" before it is dropped
INSPECT_BUDGET_POSITIONS = 2048  # asked for on purpose, one token at a time: a bigger budget than live frames
Emit = Callable[[str, Mapping[str, Any]], None]


@dataclass
class Job:
    model_id: str
    message: GenerateRequest
    received_at: float  # perf_counter when the message was sent (its channel wait counts)
    level: TraceLevel = TraceLevel.OFF
    cancelled: bool = False  # asked to stop before the scheduler had it
    in_scheduler: bool = False
    paused_since: float | None = None  # step mode: waiting for "next" after a token, since then
    ahead: int | None = None  # last queue position told to the client
    choices: dict[str, int] = field(default_factory=dict)  # the scheduler's sequence id -> choice index (n > 1)
    running: set[str] = field(default_factory=set)  # sequences not finished yet
    reply_to: str = field(init=False)
    request_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.reply_to = self.message["reply_to"]
        self.request_id = self.message["request_id"]
        self.choices = {self.request_id: 0}


@dataclass
class Served:
    """One loaded model on this worker: its pipeline (template, tokenizer) and its scheduler."""

    pipeline: ChatPipeline
    scheduler: Scheduler
    slots: ModelSlots
    pending: int = 0  # accepted by `submit`, not yet in the scheduler (being tokenized)
    prefix_seen: tuple[int, int] = (0, 0)  # prefix-cache totals already counted in the metrics


class EngineRunner:
    """One thread for all models: `loaders` maps model ids to functions that load them (on this thread)."""

    def __init__(
        self,
        loaders: dict[str, Callable[[], LoadedModel]],
        on_ready: Callable[[str], None],
        emit: Emit,
        control_channel: str,
        config: SchedulerConfig,
        worker_id: str = "worker",
        settle: Callable[[], None] | None = None,
        hold: Callable[[], None] | None = None,
    ) -> None:
        self.models: dict[str, Served] = {}
        self.failures: dict[str, str] = {}  # model id -> why it could not be loaded
        self.worker_id = worker_id
        self.config = config
        self._loaders = loaders
        self._on_ready = on_ready
        self._emit = emit
        self._settle = settle  # after a step: hand its replies on and wait until the loop has sent them
        self._hold = hold  # before a step's delivery: keep its replies for `settle`
        self._control = control_channel
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._prepare = ThreadPoolExecutor(1, thread_name_prefix="roundtrip-prepare")
        self._thread = threading.Thread(target=self._main, name="roundtrip-engine", daemon=True)
        self._thread.start()

    # --- called from the event loop (any thread) ---------------------------------------------

    def stop(self, timeout: float = 30.0) -> None:
        """End the engine thread (after the current step), dropping queued and running requests."""
        self._stopping = True
        self._commands.put(("stop", None))
        self._thread.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)

    def slots(self) -> dict[str, ModelSlots]:
        """What this worker holds, per loaded model, as of its last step (for the heartbeat)."""
        return {model_id: served.slots for model_id, served in self.models.items()}

    def submit(self, model_id: str, message: GenerateRequest) -> None:
        """Take a generate request: 503 at once when the queue is full, else "queued" and off to be tokenized."""
        job = Job(
            model_id, message, time.perf_counter() - max(0.0, time.time() - float(message.get("sent_at", time.time())))
        )
        served = self.models[model_id]
        with self._lock:
            slots = served.slots
            free = self.config.max_batch - slots["running"]
            ahead = max(0, slots["waiting"] + served.pending - free)  # what will wait for a slot before this one
            if ahead >= self.config.max_waiting:
                self._emit(job.reply_to, overloaded(job.request_id, ahead))
                return
            served.pending += 1
            self._jobs[job.request_id] = job
        self._emit(
            job.reply_to,
            {
                "type": "queued",
                "request_id": job.request_id,
                "control": self._control,
                "worker": self.worker_id,
                "ahead": ahead,
            },
        )
        self._prepare.submit(self._prepare_job, served, job)

    def tokenize(self, model_id: str, message: TokenizeRequest) -> None:
        """Answer on the prepare thread: the tokenizer needs no torch, and a long text must not block the event loop."""
        tokenizer = self.models[model_id].pipeline.loaded.tokenizer

        pipeline = self.models[model_id].pipeline

        def answer() -> None:
            try:
                if "messages" in message:
                    prompt = pipeline.loaded.chat_template.render(message["messages"], tools=message.get("tools"))  # type: ignore[arg-type]
                    reply: TokensReply = {
                        "type": "tokens",
                        "request_id": message["request_id"],
                        "ids": prompt.ids,
                        "tokens": prompt.tokens,
                        "spans": [list(s) for s in prompt.spans],
                        "text": prompt.text,
                        "segments": [dataclasses.asdict(segment) for segment in prompt.segments],
                    }
                else:
                    enc = tokenizer.encode(str(message.get("text", "")))
                    reply = {
                        "type": "tokens",
                        "request_id": message["request_id"],
                        "ids": enc.ids,
                        "tokens": enc.tokens,
                        "spans": [list(s) for s in enc.spans],
                    }
            except Exception as exc:  # a template the messages do not fit: the client's error, in its words
                self._emit(message["reply_to"], error_reply(message["request_id"], exc))
                return
            self._emit(message["reply_to"], reply)

        self._prepare.submit(answer)

    def detokenize(self, model_id: str, message: DetokenizeRequest) -> None:
        tokenizer = self.models[model_id].pipeline.loaded.tokenizer
        ids = message["ids"]
        if any(not isinstance(i, int) or not 0 <= i < tokenizer.vocab_size for i in ids):
            bad = InvalidRequestError(f"'tokens' must be token ids below {tokenizer.vocab_size}", "tokens")
            self._emit(message["reply_to"], error_reply(message["request_id"], bad))
            return
        self._emit(
            message["reply_to"],
            {"type": "text", "request_id": message["request_id"], "text": tokenizer.decode(ids, control_text=True)},
        )

    def inspect(self, model_id: str, message: InspectRequest) -> None:
        self._commands.put(("inspect", (model_id, message)))

    def prompt_attention(self, model_id: str, message: PromptAttentionRequest) -> None:
        self._commands.put(("prompt_attention", (model_id, message)))

    def resample(self, model_id: str, message: ResampleRequest) -> None:
        self._commands.put(("resample", (model_id, message)))

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client left); it leaves the batch at the next step."""
        self._commands.put(("cancel", request_id))

    def next_token(self, request_id: str) -> None:
        """Step mode: let a paused request produce its next token."""
        self._commands.put(("next", request_id))

    # --- the prepare thread ------------------------------------------------------------------

    def _prepare_job(self, served: Served, job: Job) -> None:
        msg = job.message
        try:
            prepared = served.pipeline.prepare(
                cast(list[Message], msg["messages"]),
                params_from_dict(msg["params"]),
                bool(msg.get("truncate_history")),
                received_at=job.received_at,
                fit_max_tokens=bool(msg.get("fit_max_tokens")),
                text=msg.get("prompt"),
                tools=msg.get("tools"),
                continue_final=bool(msg.get("continue_final")),
            )
            job.level = TraceLevel(msg.get("level", "off"))
            if msg.get("step") and job.level == TraceLevel.OFF:
                job.level = TraceLevel.SUMMARY  # step mode shows every token, which only traced levels send
            requests = served.pipeline.sequence_requests(
                prepared, job.request_id, int(msg.get("n", 1)), job.level, bool(msg.get("step"))
            )
        except Exception as exc:  # every failure becomes an error reply, never a dead worker
            with self._lock:
                served.pending -= 1
            self._finish(job, error_reply(job.request_id, exc))
            return
        tokenized = (
            event_to_dict(served.pipeline.tokenized(prepared), served.pipeline.loaded.tokenizer)
            if job.level != TraceLevel.OFF
            else None
        )
        self._commands.put(("add", (served, job, requests, tokenized)))

    # --- the engine thread -------------------------------------------------------------------

    def _main(self) -> None:
        for model_id, load in self._loaders.items():
            if self._stopping:
                return
            try:
                pipeline = ChatPipeline(load())
                _warm_up(pipeline)
                scheduler = pipeline.scheduler(self.config)
            except Exception as exc:  # a broken model file must not take the other models down
                log.exception("model %s failed to load", model_id)
                self.failures[model_id] = str(exc)
            else:
                slots: ModelSlots = {
                    "running": 0,
                    "waiting": 0,
                    "max_batch": self.config.max_batch,
                    "max_waiting": self.config.max_waiting,
                    "kv_usage": 0.0,
                }
                self.models[model_id] = Served(pipeline, scheduler, slots)
            self._on_ready(model_id)
        # Everything loaded so far (Django, torch, the models' Python objects) lives as long as the process: moved out
        # of the collector's sight, a full collection scans only what requests create (one took 50-140 ms mid-stream).
        gc.freeze()
        self._run()

    def _run(self) -> None:
        was_busy = False
        while not self._stopping:
            busy = any(s.scheduler.has_work for s in self.models.values())
            if was_busy and not busy:  # the last request left: give the burst's memory back
                return_free_memory()
            was_busy = busy
            self._handle_commands(block=not busy)
            for model_id, served in self.models.items():
                if self._stopping:
                    return
                if served.scheduler.has_work:
                    self._step(model_id, served)
                self._report(model_id, served)
            self._expire_paused()

    def _step(self, model_id: str, served: Served) -> None:
        scheduler = served.scheduler
        steps = scheduler.steps
        started = time.perf_counter()
        try:
            outputs = scheduler.step()
            stepped = time.perf_counter() - started  # the engine's own work: forward, sampling, bookkeeping
        except Exception as exc:  # the batched forward itself failed: every request in it fails, the worker goes on
            self._fail_all(model_id, scheduler, exc)
            return
        delivering = time.perf_counter()
        if self._hold is not None and self._settle is not None:
            self._hold()
        try:
            self._deliver(model_id, served, outputs)
            try:
                scheduler.finish_step()  # the step's bookkeeping, while the event loop sends its replies
            except Exception as exc:  # the cache is in doubt: as for a failed forward
                self._fail_all(model_id, scheduler, exc)
        finally:  # whatever happened, the replies kept since `hold` go out
            if self._settle is not None:
                self._settle()
        if scheduler.steps != steps and scheduler.last_batch is not None:  # a forward ran
            metrics.step_seconds.labels(model_id).observe(stepped)
            metrics.step_delivery_seconds.labels(model_id).observe(time.perf_counter() - delivering)
            metrics.batch_size.labels(model_id).observe(scheduler.last_batch.batch_size)

    def _fail_all(self, model_id: str, scheduler: Scheduler, exc: Exception) -> None:
        """A step (or its bookkeeping) failed for the whole batch: every request the scheduler holds ends in an error."""
        log.exception("a step of %s failed", model_id, exc_info=exc)
        for request_id in scheduler.drop_all():
            job = self._jobs.get(request_id)
            if job is not None:
                metrics.request_success.labels(model_id, "error").inc()
                self._finish(job, error_reply(request_id, exc))

    def _handle_commands(self, block: bool) -> None:
        """Run every queued command; when idle, wait (up to a second, to check step-mode timeouts) for the first."""
        try:
            command = self._commands.get(timeout=1.0) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = command
            if kind == "stop":
                return
            try:
                getattr(self, f"_on_{kind}")(arg)
            except Exception:  # a bad command must not stop the engine
                log.exception("engine command %s failed", kind)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _on_add(self, arg: tuple[Served, Job, list[SequenceRequest], dict[str, Any] | None]) -> None:
        served, job, requests, tokenized = arg
        request = requests[0]
        with self._lock:
            served.pending -= 1
        if job.cancelled:
            self._finish(job, {"type": "cancelled", "request_id": job.request_id})
            return
        try:
            for index, choice in enumerate(requests):  # all choices or none
                served.scheduler.add(choice)
                job.choices[choice.request_id] = index
                job.running.add(choice.request_id)
                self._jobs[choice.request_id] = job
        except (QueueFullError, KVBudgetExceededError) as exc:
            for sequence in job.running:
                served.scheduler.abort(sequence)
            self._finish(
                job,
                overloaded(job.request_id, exc.waiting)
                if isinstance(exc, QueueFullError)
                else error_reply(job.request_id, exc),
            )
            return
        job.in_scheduler = True
        accepted: Accepted = {
            "type": "accepted",
            "request_id": job.request_id,
            "control": self._control,
            "worker": self.worker_id,
            "weights": served.pipeline.loaded.weights_description,
            "prompt_tokens": len(request.prompt_ids),
            "seed": request.params.seed or 0,
            "queued": time.perf_counter() - job.received_at,
        }
        self._emit(job.reply_to, accepted)
        if tokenized is not None:
            self._emit(job.reply_to, {"type": "events", "request_id": job.request_id, "events": [tokenized]})
        metrics.prompt_tokens.labels(job.model_id).inc(len(request.prompt_ids))

    def _on_cancel(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is None:
            return
        if job.in_scheduler:
            for sequence in job.running:
                self.models[job.model_id].scheduler.abort(sequence)
        else:
            job.cancelled = True  # still being tokenized: dropped when it arrives

    def _on_next(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None and job.in_scheduler:
            job.paused_since = None
            self.models[job.model_id].scheduler.resume(request_id)

    def _on_inspect(self, arg: tuple[str, InspectRequest]) -> None:
        """Recompute the full-level detail for the last position of the given ids, and reply with it."""
        model_id, message = arg
        served = self.models[model_id]

        def answer() -> dict[str, Any]:
            detail = served.scheduler.inspect(self._checked_ids(served, message.get("ids"), "ids"))
            return {
                "type": "inspection",
                "detail": detail_to_dict(detail, served.pipeline.loaded.tokenizer, INSPECT_BUDGET_POSITIONS),
            }

        self._reply(message, answer)

    def _on_prompt_attention(self, arg: tuple[str, PromptAttentionRequest]) -> None:
        """Recompute the prompt with every position's attention at one layer; reply with the matrix."""
        model_id, message = arg
        served = self.models[model_id]

        def answer() -> dict[str, Any]:
            ids = self._checked_ids(served, message.get("ids"), "ids")[:PROMPT_MATRIX_POSITIONS]
            layer = message.get("layer")
            if not isinstance(layer, int) or isinstance(layer, bool):
                raise InvalidRequestError("'layer' must be a layer number", "layer")
            weights = served.scheduler.prompt_attention(ids, layer)
            return {
                "type": "prompt_attention",
                "attention": attention_to_dict(weights.numpy(), PROMPT_MATRIX_POSITIONS),
            }

        self._reply(message, answer)

    def _on_resample(self, arg: tuple[str, ResampleRequest]) -> None:
        """Draw a past step again with other settings, from its real logits; reply with the sampled event."""
        model_id, message = arg
        served = self.models[model_id]

        def answer() -> dict[str, Any]:
            prompt = self._checked_ids(served, message.get("prompt_ids"), "prompt_ids")
            generated = self._checked_ids(served, message.get("generated"), "generated", at_least=0, before=len(prompt))
            sample = served.scheduler.resample(prompt, generated, params_from_dict(message["params"]))
            event = Sampled(
                time.perf_counter(),
                len(generated) + 1,
                sample.token_id,
                sample.logprob,
                sample.rank,
                sample.token_id in served.scheduler.stop_ids,
                0.0,
                sample.top_logprobs,
                sample.detail,
            )
            return {"type": "resampled", "event": event_to_dict(event, served.pipeline.loaded.tokenizer)}

        self._reply(message, answer)

    def _reply(self, message: Mapping[str, Any], answer: Callable[[], dict[str, Any]]) -> None:
        """A one-shot question's answer, or the error that stopped it (a bad request, in the asker's words), to the asker."""
        try:
            reply = answer()
        except Exception as exc:
            self._emit(message["reply_to"], error_reply(message["request_id"], exc))
            return
        self._emit(message["reply_to"], {**reply, "request_id": message["request_id"]})

    @staticmethod
    def _checked_ids(served: Served, ids: object, name: str, at_least: int = 1, before: int = 0) -> list[int]:
        """Token ids from a message: a list of at least `at_least` ids of this vocabulary that fit the context
        after `before` others."""
        config = served.pipeline.loaded.config
        room = config.context_length - before
        if (
            not isinstance(ids, list)
            or not at_least <= len(ids) <= room
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < config.vocab_size for i in ids)
        ):
            raise InvalidRequestError(
                f"'{name}' must be {at_least} to {room} token ids below {config.vocab_size}", name
            )
        return ids

    def _deliver(self, model_id: str, served: Served, outputs: list[SequenceOutput]) -> None:
        """Send each sequence's events, in order; the end of a sequence ends its job."""
        tokenizer = served.pipeline.loaded.tokenizer
        for output in outputs:
            job = self._jobs.get(output.request_id)
            if job is None:
                continue
            try:
                self._send_events(model_id, job, output, tokenizer)
            except Exception as exc:  # serializing one request's events failed: that request ends, the rest go on
                log.exception("delivering %s failed", job.request_id)
                self._fail(served, job, exc)

    def _send_events(self, model_id: str, job: Job, output: SequenceOutput, tokenizer: BPETokenizer) -> None:
        events = [event_to_dict(event, tokenizer) for event in output.events]
        if events:
            self._emit(
                job.reply_to,
                {
                    "type": "events",
                    "request_id": job.request_id,
                    "index": job.choices.get(output.request_id, 0),
                    "events": events,
                },
            )
        for data in events:
            if data["event"] == "sampled" and job.message.get("step"):
                job.paused_since = time.perf_counter()
            elif data["event"] == "finished":
                _observe_finished(model_id, data)
        metrics.generation_tokens.labels(model_id).inc(sum(isinstance(e, Sampled) for e in output.events))
        if output.done:
            job.running.discard(output.request_id)
        if output.error is not None:
            log.error("generation %s failed", output.request_id, exc_info=output.error)
            metrics.request_success.labels(model_id, "error").inc()
            self._fail(self.models[model_id], job, output.error)
        elif output.cancelled:
            metrics.request_success.labels(model_id, "abort").inc()
            if not job.running:
                self._finish(job, {"type": "cancelled", "request_id": job.request_id})
        elif output.done and not job.running:
            self._finish(job, None)

    def _fail(self, served: Served, job: Job, exc: Exception) -> None:
        """One choice failed: the request fails, and its other choices stop."""
        for sequence in job.running:
            served.scheduler.abort(sequence)
        self._finish(job, error_reply(job.request_id, exc))

    def _report(self, model_id: str, served: Served) -> None:
        """Refresh what the heartbeat and the metrics say, and tell waiting pages their place in the queue."""
        scheduler = served.scheduler
        stats = scheduler.stats()
        served.slots = {
            "running": stats.running,
            "waiting": stats.waiting,
            "max_batch": self.config.max_batch,
            "max_waiting": self.config.max_waiting,
            "kv_usage": stats.kv_usage,
        }
        metrics.num_requests_running.labels(model_id).set(stats.running)
        metrics.num_requests_waiting.labels(model_id).set(stats.waiting + served.pending)
        metrics.kv_cache_usage_perc.labels(model_id).set(stats.kv_usage)
        metrics.prefix_cache_bytes.labels(model_id).set(stats.prefix_cache_bytes)
        queried, hit = served.prefix_seen
        metrics.prefix_cache_queries.labels(model_id).inc(stats.prefix_queried_tokens - queried)
        metrics.prefix_cache_hits.labels(model_id).inc(stats.prefix_hit_tokens - hit)
        served.prefix_seen = (stats.prefix_queried_tokens, stats.prefix_hit_tokens)
        for position, state in enumerate(scheduler.waiting):
            job = self._jobs.get(state.request_id)
            if (
                job is not None
                and state.request_id == job.request_id
                and job.level != TraceLevel.OFF
                and job.ahead != position
            ):
                job.ahead = position
                self._emit(job.reply_to, {"type": "waiting", "request_id": job.request_id, "ahead": position})

    def _expire_paused(self) -> None:
        now = time.perf_counter()
        for job in list(self._jobs.values()):
            if job.paused_since is not None and now - job.paused_since > STEP_IDLE_LIMIT:
                job.paused_since = None
                self._on_cancel(job.request_id)  # its student left without a word

    def _finish(self, job: Job, reply: Mapping[str, Any] | None) -> None:
        with self._lock:
            for sequence in job.choices:
                self._jobs.pop(sequence, None)
        if reply is not None:
            self._emit(job.reply_to, reply)


def _observe_finished(model_id: str, finished: dict[str, Any]) -> None:
    t = finished["timings"]
    metrics.request_success.labels(model_id, finished["finish_reason"]).inc()
    metrics.time_to_first_token.labels(model_id).observe(t["ttft"])
    metrics.e2e_request_latency.labels(model_id).observe(t["total"])
    metrics.request_queue_time.labels(model_id).observe(t["queue"])
    metrics.request_prefill_time.labels(model_id).observe(t["prefill"])
    metrics.request_decode_time.labels(model_id).observe(t["decode"])
    itl = metrics.inter_token_latency.labels(model_id)
    times = t["token_times"]
    for a, b in zip(times, times[1:]):
        itl.observe(b - a)


def _warm_up(pipeline: ChatPipeline) -> None:
    """One short generation, so the first real request does not pay for kernel selection and first-touch pages."""
    request = pipeline.prepare([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0.0, max_tokens=2))
    for _ in pipeline.stream(request):
        pass
