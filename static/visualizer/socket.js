// The pipeline WebSocket: JSON frames (a message holds one, or an array of those that were ready together),
// automatic reconnection, and a status line that says what is happening.

export class PipelineSocket {
  constructor(path, { onFrame, onStatus }) {
    this.url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
    this.onFrame = onFrame;
    this.onStatus = onStatus;
    this.retry = 500;
    this.dropped = false;
    this.connect();
  }

  connect() {
    this.ws = new WebSocket(this.url);
    this.ws.addEventListener("open", () => {
      this.retry = 500;
      this.onStatus(this.dropped ? "reconnected" : "connected");
    });
    this.ws.addEventListener("message", (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      const at = performance.now();
      for (const frame of Array.isArray(data) ? data : [data]) this.onFrame(frame, at);
    });
    this.ws.addEventListener("close", () => {
      this.dropped = true;
      this.onStatus("reconnecting");
      setTimeout(() => this.connect(), this.retry);
      this.retry = Math.min(this.retry * 2, 5000);
    });
  }

  get open() {
    return this.ws.readyState === WebSocket.OPEN;
  }

  send(frame) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}
