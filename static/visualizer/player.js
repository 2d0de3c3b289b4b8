// Applies frames to the current run at the chosen speed and redraws on animation frames.
// Frames are never dropped: every one reaches the run state; only intermediate drawings are skipped
// when tokens arrive faster than the page can paint.

const SLOW_MS_PER_FRAME = 90;
// At most this often (about 7 times a second, as the server paces an answer's frames): each drawing costs the browser
// a frame's style, layout, paint and compositing, on the cores the engine needs (docs/page.md).
const DRAW_EVERY_MS = 150;

export class Player {
  constructor(draw) {
    this.draw = draw;
    this.queue = [];
    this.speed = "live";
    this.timer = null;
    this.pending = false;
    this.lastDraw = -Infinity;
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
    const wait = Math.max(0, this.lastDraw + DRAW_EVERY_MS - performance.now());
    setTimeout(() => requestAnimationFrame(() => {
      this.pending = false;
      this.lastDraw = performance.now();
      this.draw(run);
    }), wait);
  }

  // Replays a recorded run with its original timing (slow motion stretches it). With `hold`, it stops after the first
  // token's text, as the engine does in step mode; the function it returns plays the rest, from where it stopped.
  replay(run, recorded, hold = false) {
    const stretch = this.speed === "slow" ? 4 : 1;
    const frames = recorded.frames;
    const firstText = frames.findIndex(({ frame }) => frame.type === "trace" && frame.event.event === "text");
    const cut = hold && firstText >= 0 ? firstText + 1 : frames.length;
    const play = (part, offset) => {
      const start = performance.now();
      part.forEach(({ at, frame }) => {
        setTimeout(() => {
          run.apply(frame, start + (at - offset) * stretch);
          this.schedule(run);
        }, (at - offset) * stretch);
      });
    };
    run.sentAt = performance.now();
    // the recording's pauses stay pauses; a held replay's own pause ends when it is released
    if (!hold) run.resumes = (recorded.resumes ?? []).map((r) => run.sentAt + r * stretch);
    play(frames.slice(0, cut), 0);
    return () => {
      run.resumes.push(performance.now());
      play(frames.slice(cut), frames[cut]?.at ?? 0);
    };
  }
}
