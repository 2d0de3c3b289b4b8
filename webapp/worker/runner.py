"""The engine's thread: loads the models, then feeds their engines and delivers what each step produced.

Torch work never runs on the event loop, and all of it runs on this one thread: the model is loaded here too,
because every thread that calls into torch gets its own OpenMP team, and two teams on two cores halve decode speed
(measured: 37 ms vs 64 ms per token). Templates and tokenization (no torch) run on "prepare" threads, so a huge prompt
never stalls the decode loop (two of them: a long one does not hold up the next request). Everything else arrives as
typed commands on a queue; replies go out through `emit`, which hands them to the event loop in order. One-shot
questions are answered by `webapp.worker.questions`.
"""

from __future__ import annotations

import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

from inference import trace
from inference.chat_template import Message
from inference.errors import InvalidRequestError
from inference.loader import LoadedModel
from inference.memory import return_free_memory
from inference.outputs import SequenceOutput
from inference.scheduler import KVBudgetExceededError, QueueFullError, SchedulerConfig
from inference.sequence import SequenceRequest
from inference.trace import TraceLevel
from webapp.metrics import metrics
from webapp.worker import questions, serialize, wire
from webapp.worker.served import Served

log = logging.getLogger("roundtrip.worker")
STEP_IDLE_LIMIT = 1800.0  # seconds a step-mode request may wait for "next" before it is dropped
PREPARE_THREADS = 2  # templates and tokenizers for arriving requests: a long one does not hold up the next
Emit = Callable[[str, wire.Reply], None]


@dataclass
class Job:
    """One generate request on this worker, from its arrival to its last reply."""

    model_id: str
    message: wire.Generate
    received_at: float  # perf_counter when the message was sent (its channel wait counts)
    level: TraceLevel = TraceLevel.OFF
    cancelled: bool = False  # asked to stop before the scheduler had it
    in_scheduler: bool = False
    paused_since: float | None = None  # step mode: waiting for "next" after a token, since then
    ahead: int | None = None  # last queue position told to the client
    choices: dict[str, int] = field(default_factory=dict)  # the scheduler's sequence id -> choice index (n > 1)
    running: set[str] = field(default_factory=set)  # sequences not finished yet

    def __post_init__(self) -> None:
        self.choices[self.request_id] = 0

    @property
    def request_id(self) -> str:
        return self.message.request_id

    @property
    def reply_to(self) -> str:
        return self.message.reply_to


# --- commands for the engine thread ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Add:
    """A tokenized request's sequences (all its choices) join the scheduler."""

    served: Served
    job: Job
    requests: list[SequenceRequest]
    tokenized: wire.Tokenized | None


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Resume:
    request_id: str


@dataclass(frozen=True)
class Ask:
    """A question that runs the model (see `questions.HANDLERS`)."""

    served: Served
    question: wire.OneShot


@dataclass(frozen=True)
class Stop:
    pass


Command = Add | Abort | Resume | Ask | Stop


def _asker(command: Command) -> str:
    """The request a command is for, for its log line."""
    match command:
        case Add(job=job):
            return job.request_id
        case Abort(request_id) | Resume(request_id):
            return request_id
        case Ask(question=question):
            return question.request_id
    return "(none)"


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
        self._commands: queue.Queue[Command] = queue.Queue()
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._prepare = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="roundtrip-prepare")
        self._thread = threading.Thread(target=self._main, name="roundtrip-engine", daemon=True)
        self._thread.start()

    # --- called from the event loop (any thread) ---------------------------------------------

    def stop(self, timeout: float = 30.0) -> None:
        """End the engine thread (after the current step), dropping queued and running requests."""
        self._stopping = True
        self._commands.put(Stop())
        self._thread.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)

    def slots(self) -> dict[str, wire.ModelSlots]:
        """What this worker holds, per loaded model, as of its last step (for the heartbeat)."""
        return {model_id: served.slots for model_id, served in self.models.items()}

    def submit(self, model_id: str, message: wire.Generate) -> None:
        """Take a generate request: 503 at once when the queue is full, else "queued" and off to be tokenized."""
        waited = max(0.0, time.time() - message.sent_at) if message.sent_at else 0.0
        job = Job(model_id, message, time.perf_counter() - waited)
        served = self.models[model_id]
        with self._lock:
            slots = served.slots
            free = self.config.max_batch - slots.running
            ahead = max(0, slots.waiting + served.pending - free)  # what will wait for a slot before this one
            if ahead >= self.config.max_waiting:
                self._emit(job.reply_to, wire.overloaded(job.request_id, ahead))
                return
            served.pending += 1
            self._jobs[job.request_id] = job
        self._emit(
            job.reply_to,
            wire.Queued(request_id=job.request_id, control=self._control, worker=self.worker_id, ahead=ahead),
        )
        self._prepare.submit(self._prepare_job, served, job)

    def ask(self, model_id: str, question: wire.OneShot) -> None:
        """Answer a one-shot question: on the engine thread between steps when it runs the model, else on the prepare
        thread (the tokenizer needs no torch, and a long text must not block the event loop)."""
        served = self.models[model_id]
        if questions.HANDLERS[type(question)].needs_model:
            self._commands.put(Ask(served, question))
        else:
            self._prepare.submit(lambda: self._emit(question.reply_to, questions.answer(served.loaded, question)))

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client left); it leaves the batch at the next step."""
        self._commands.put(Abort(request_id))

    def next_token(self, request_id: str) -> None:
        """Step mode: let a paused request produce its next token."""
        self._commands.put(Resume(request_id))

    # --- the prepare thread ------------------------------------------------------------------

    def _prepare_job(self, served: Served, job: Job) -> None:
        msg = job.message
        pipeline = served.pipeline
        try:
            prepared = pipeline.prepare(
                cast(list[Message], msg.messages),
                msg.params,
                msg.truncate_history,
                received_at=job.received_at,
                fit_max_tokens=msg.fit_max_tokens,
                text=msg.prompt,
                tools=msg.tools,
                continue_final=msg.continue_final,
            )
            # step mode shows every token, which only traced levels send
            job.level = TraceLevel.SUMMARY if msg.step and msg.level == "off" else TraceLevel(msg.level)
            requests = pipeline.sequence_requests(prepared, job.request_id, msg.n, job.level, msg.step)
        except Exception as exc:  # every failure becomes an error reply, never a dead worker
            with self._lock:
                served.pending -= 1
            self._finish(job, wire.error_reply(job.request_id, exc))
            return
        tokenized = None
        if job.level != TraceLevel.OFF:
            tokenized = cast(wire.Tokenized, serialize.to_wire(pipeline.tokenized(prepared), served.loaded.tokenizer))
        self._commands.put(Add(served, job, requests, tokenized))

    # --- the engine thread -------------------------------------------------------------------

    def _main(self) -> None:
        for model_id, load in self._loaders.items():
            if self._stopping:
                return
            try:
                self.models[model_id] = Served.start(load(), self.config)
            except Exception as exc:  # a broken model file must not take the other models down
                log.exception("model %s failed to load", model_id)
                self.failures[model_id] = str(exc)
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
            outputs = served.engine.step()
            stepped = time.perf_counter() - started  # the engine's own work: forward, sampling, bookkeeping
        except Exception as exc:  # the batched forward itself failed: every request in it fails, the worker goes on
            self._fail_all(model_id, served, exc)
            return
        delivering = time.perf_counter()
        if self._hold is not None and self._settle is not None:
            self._hold()
        try:
            self._deliver(model_id, served, outputs)
            try:
                scheduler.finish_step()  # the step's bookkeeping, while the event loop sends its replies
            except Exception as exc:  # the cache is in doubt: as for a failed forward
                self._fail_all(model_id, served, exc)
        finally:  # whatever happened, the replies kept since `hold` go out
            if self._settle is not None:
                self._settle()
        if scheduler.steps != steps and scheduler.last_batch is not None:  # a forward ran
            metrics.step_seconds.labels(model_id).observe(stepped)
            metrics.step_delivery_seconds.labels(model_id).observe(time.perf_counter() - delivering)
            metrics.batch_size.labels(model_id).observe(scheduler.last_batch.batch_size)

    def _fail_all(self, model_id: str, served: Served, exc: Exception) -> None:
        """A step (or its bookkeeping) failed for the whole batch: every request the scheduler holds ends in an
        error."""
        log.exception("a step of %s failed", model_id, exc_info=exc)
        for request_id in served.scheduler.drop_all():
            job = self._jobs.get(request_id)
            if job is not None:
                metrics.request_success.labels(model_id, "error").inc()
                self._finish(job, wire.error_reply(request_id, exc))

    def _handle_commands(self, block: bool) -> None:
        """Run every queued command; when idle, wait (up to a second, to check step-mode timeouts) for the first."""
        try:
            command = self._commands.get(timeout=1.0) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while not isinstance(command, Stop):
            try:
                self._run_command(command)
            except Exception as exc:  # a bad command must not stop the engine, nor leave its asker waiting
                log.exception("engine command %s for %s failed", type(command).__name__, _asker(command))
                self._command_failed(command, exc)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, command: Command) -> None:
        match command:
            case Add():
                self._add(command)
            case Abort(request_id):
                self._abort(request_id)
            case Resume(request_id):
                job = self._jobs.get(request_id)
                if job is not None and job.in_scheduler:
                    job.paused_since = None
                    self.models[job.model_id].scheduler.resume(request_id)
            case Ask(served, question):
                self._emit(question.reply_to, questions.answer(served.loaded, question))

    def _command_failed(self, command: Command, exc: Exception) -> None:
        """Whoever waits on a command that failed hears why: the request ends with the error, as any failure would."""
        match command:
            case Add(served=served, job=job):
                self._fail(served, job, exc)  # stops whatever of it the scheduler already took
            case Ask(question=question):
                self._emit(question.reply_to, wire.error_reply(question.request_id, exc))

    def _add(self, command: Add) -> None:
        served, job = command.served, command.job
        with self._lock:
            served.pending -= 1
        if job.cancelled:
            self._finish(job, wire.Cancelled(request_id=job.request_id))
            return
        try:
            for index, choice in enumerate(command.requests):  # all choices or none
                served.scheduler.add(choice)
                job.choices[choice.request_id] = index
                job.running.add(choice.request_id)
                self._jobs[choice.request_id] = job
        except Exception as exc:  # full, could never fit, or refused: the request fails, the worker goes on
            for sequence in job.running:
                served.scheduler.abort(sequence)
            if isinstance(exc, InvalidRequestError):  # the client's mistake: one line, no traceback, no request text
                log.info("refused %s: %s", job.request_id, exc)
            elif not isinstance(exc, (QueueFullError, KVBudgetExceededError)):
                log.exception("adding %s failed", job.request_id)
            failed = wire.overloaded(job.request_id, exc.waiting) if isinstance(exc, QueueFullError) else None
            self._finish(job, failed or wire.error_reply(job.request_id, exc))
            return
        job.in_scheduler = True
        first = command.requests[0]
        self._emit(
            job.reply_to,
            wire.Accepted(
                request_id=job.request_id,
                control=self._control,
                worker=self.worker_id,
                weights=served.loaded.weights_description,
                prompt_tokens=len(first.prompt_ids),
                seed=first.params.seed or 0,
                queued=time.perf_counter() - job.received_at,
            ),
        )
        if command.tokenized is not None:
            self._emit(job.reply_to, wire.Events(request_id=job.request_id, events=[command.tokenized]))
        metrics.prompt_tokens.labels(job.model_id).inc(len(first.prompt_ids))

    def _abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is None:
            return
        if job.in_scheduler:
            for sequence in job.running:
                self.models[job.model_id].scheduler.abort(sequence)
        else:
            job.cancelled = True  # still being tokenized: dropped when it arrives

    def _deliver(self, model_id: str, served: Served, outputs: list[SequenceOutput]) -> None:
        """Send each sequence's events, in order; the end of a sequence ends its job."""
        for output in outputs:
            job = self._jobs.get(output.request_id)
            if job is None:
                continue
            try:
                self._send_events(model_id, served, job, output)
            except Exception as exc:  # serializing one request's events failed: that request ends, the rest go on
                log.exception("delivering %s failed", job.request_id)
                self._fail(served, job, exc)

    def _send_events(self, model_id: str, served: Served, job: Job, output: SequenceOutput) -> None:
        tokenizer = served.loaded.tokenizer
        events = [serialize.to_wire(event, tokenizer) for event in output.events]
        if events:
            self._emit(
                job.reply_to,
                wire.Events(request_id=job.request_id, index=job.choices.get(output.request_id, 0), events=events),
            )
        for event in events:
            if isinstance(event, wire.Sampled) and job.message.step:
                job.paused_since = time.perf_counter()
            elif isinstance(event, wire.Finished):
                _observe_finished(model_id, event)
        metrics.generation_tokens.labels(model_id).inc(sum(isinstance(e, trace.Sampled) for e in output.events))
        if output.done:
            job.running.discard(output.request_id)
        if output.error is not None:
            log.error("generation %s failed", output.request_id, exc_info=output.error)
            metrics.request_success.labels(model_id, "error").inc()
            self._fail(served, job, output.error)
        elif output.cancelled:
            metrics.request_success.labels(model_id, "abort").inc()
            if not job.running:
                self._finish(job, wire.Cancelled(request_id=job.request_id))
        elif output.done and not job.running:
            self._finish(job, None)

    def _fail(self, served: Served, job: Job, exc: Exception) -> None:
        """One choice failed: the request fails, and its other choices stop."""
        for sequence in job.running:
            served.scheduler.abort(sequence)
        self._finish(job, wire.error_reply(job.request_id, exc))

    def _report(self, model_id: str, served: Served) -> None:
        """Refresh what the heartbeat and the metrics say, and tell waiting pages their place in the queue."""
        scheduler = served.scheduler
        stats = scheduler.stats()
        served.slots = wire.ModelSlots(
            running=stats.running,
            waiting=stats.waiting,
            max_batch=self.config.max_batch,
            max_waiting=self.config.max_waiting,
            kv_usage=stats.kv_usage,
        )
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
                self._emit(job.reply_to, wire.Waiting(request_id=job.request_id, ahead=position))

    def _expire_paused(self) -> None:
        now = time.perf_counter()
        for job in list(self._jobs.values()):
            if job.paused_since is not None and now - job.paused_since > STEP_IDLE_LIMIT:
                job.paused_since = None
                self._abort(job.request_id)  # its student left without a word

    def _finish(self, job: Job, reply: wire.Reply | None) -> None:
        with self._lock:
            for sequence in job.choices:
                self._jobs.pop(sequence, None)
        if reply is not None:
            self._emit(job.reply_to, reply)


def _observe_finished(model_id: str, finished: wire.Finished) -> None:
    t = finished.timings
    metrics.request_success.labels(model_id, finished.finish_reason).inc()
    metrics.time_to_first_token.labels(model_id).observe(t.ttft)
    metrics.e2e_request_latency.labels(model_id).observe(t.total)
    metrics.request_queue_time.labels(model_id).observe(t.queue)
    metrics.request_prefill_time.labels(model_id).observe(t.prefill)
    metrics.request_decode_time.labels(model_id).observe(t.decode)
    itl = metrics.inter_token_latency.labels(model_id)
    times = t.token_times
    for a, b in itertools.pairwise(times):
        itl.observe(b - a)
