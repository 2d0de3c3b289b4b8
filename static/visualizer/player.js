// Applies frames to the current run at the chosen speed and redraws on animation frames.
// Frames are never dropped: every one reaches the run state; only intermediate drawings are skipped
// when tokens arrive faster than the page can paint.

const SLOW_MS_PER_FRAME = 90;

export class Player {
  constructor(draw) {
    this.draw = draw;
    this.queue = [];
    this.speed = "live";
    this.timer = null;
    this.pending = false;
  }

  push(run, frame, at) {
    if (this.speed === "slow" && frame.type === "trace") {
      this.queue.push([run, frame, at]);
      this.pump();
      return;
    }
    this.flush(); // keep order: earlier slow frames first
    run.apply(frame, at);
    this.schedule(run);
  }

  pump() {
    if (this.timer) return;
    this.timer = setInterval(() => {
      const next = this.queue.shift();
      if (!next) {
        clearInterval(this.timer);
        this.timer = null;
        return;
      }
      const [run, frame, at] = next;
      run.apply(frame, at);
      this.schedule(run);
    }, SLOW_MS_PER_FRAME);
  }

  flush() {
    while (this.queue.length) {
      const [run, frame, at] = this.queue.shift();
      run.apply(frame, at);
    }
  }

  schedule(run) {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw(run);
    });
  }

  // Replays a recorded run with its original timing (slow motion stretches it).
  replay(run, recorded, onEnd) {
    const stretch = this.speed === "slow" ? 4 : 1;
    const start = performance.now();
    run.sentAt = start;
    recorded.frames.forEach(({ at, frame }) => {
      setTimeout(() => {
        run.apply(frame, start + at * stretch);
        this.schedule(run);
        if (frame.type === "done") onEnd?.();
      }, at * stretch);
    });
  }
}
