// One turn's state, built only from the frames the server sent (live or replayed): nothing here is invented.

export class Run {
  constructor(request) {
    this.request = request; // the JSON as the page sent it
    this.frames = []; // [{at, frame}] for export and replay
    this.gateway = null;
    this.accepted = null;
    this.tokenized = null;
    this.context = null;
    this.forwards = [];
    this.batches = new Map(); // engine step -> the batched forward this request took part in
    this.waiting = null; // requests ahead of this one while every slot of the batch was taken
    this.steps = new Map(); // step -> {sampled, text, forward, arrivedAt}
    this.text = "";
    this.usage = null;
    this.sse = null;
    this.finished = null;
    this.error = null;
    this.done = false;
    this.sentAt = null;
    this.tokenArrivals = []; // browser clock (ms) when each token's text frame arrived
    this.resumes = []; // browser clock (ms) when step mode's "next" was sent: the wait before it is a pause
    this.lastStep = 0;
    this.version = 0; // counts the frames applied: a view drawn at this version is up to date
  }

  step(n) {
    if (!this.steps.has(n)) this.steps.set(n, { sampled: null, text: null, forward: null });
    return this.steps.get(n);
  }

  apply(frame, at) {
    this.version += 1;
    this.frames.push({ at: at - (this.sentAt ?? at), frame });
    switch (frame.type) {
      case "gateway": this.gateway = frame; break;
      case "accepted": this.accepted = frame; break;
      case "waiting": this.waiting = frame.ahead; break;
      case "usage": this.usage = frame; break;
      case "sse": this.sse = frame.body; break; // what an API client would have received for this answer
      case "error": this.error = frame; break;
      case "done": this.done = true; break;
      case "trace": this.applyEvent(frame.event, at); break;
    }
  }

  applyEvent(event, at) {
    switch (event.event) {
      case "tokenized": this.tokenized = event; break;
      case "context": this.context = event; this.waiting = null; break;
      case "batch": this.batches.set(event.step, event); break;
      case "forward":
        this.forwards.push(event);
        // The pass that consumed token n produces the candidates for token n + 1.
        this.step(event.step + 1).forward = event;
        break;
      case "sampled":
        this.step(event.step).sampled = event;
        this.lastStep = event.step;
        break;
      case "text":
        this.step(event.step).text = event;
        this.text += event.text;
        this.tokenArrivals.push(at);
        break;
      case "finished": this.finished = event; break;
    }
  }

  // The batched forward a forward event of this request ran in.
  batchOf(forward) {
    return this.batches.get(forward.batch_step) ?? null;
  }

  // An upstream model's routing decision (the server that answered, those tried before it), from the accepted frame;
  // null for a model this server runs. An upstream's turn has no context, forward or batch events: its inside is out
  // of sight.
  get upstream() {
    return this.accepted?.upstream ?? null;
  }

  get lastForward() {
    return this.forwards[this.forwards.length - 1] ?? null;
  }

  get lastSampled() {
    return this.lastStep ? this.steps.get(this.lastStep).sampled : null;
  }

  get lastText() {
    for (let n = this.lastStep; n > 0; n--) {
      const step = this.steps.get(n);
      if (step?.text) return step.text;
    }
    return null;
  }

  // Browser-side clocks, in ms.
  get clientTtft() {
    return this.tokenArrivals.length && this.sentAt !== null ? this.tokenArrivals[0] - this.sentAt : null;
  }

  // The gaps between tokens arriving, less any pause in them (step mode: from a token to the "next" that asked for
  // the one after it), so reading time is never counted as latency.
  get clientItls() {
    return this.tokenArrivals.slice(1).map((t, i) => t - this.tokenArrivals[i] - this.clientPauses[i]);
  }

  // Per gap between tokens: the ms this page held the engine paused in it (0 for most).
  get clientPauses() {
    const arrivals = this.tokenArrivals;
    return arrivals.slice(1).map((t, i) => {
      const resumed = this.resumes.filter((r) => r >= arrivals[i] && r < t); // a "next" sent as a token arrived belongs to the gap after it
      return resumed.length ? resumed[resumed.length - 1] - arrivals[i] : 0;
    });
  }

  toJSON() {
    const resumes = this.resumes.map((r) => r - (this.sentAt ?? 0)); // on the frames' clock
    return { format: "roundtrip-run", version: 1, request: this.request, frames: this.frames, resumes };
  }
}
