"""Models served by other servers: the gateway's route stage may send a request to an upstream OpenAI-compatible
server (llama-server, vLLM, a second Roundtrip, a hosted API) instead of this deployment's inference workers.

- `replicas.py`: each upstream server's state (in flight, down until, its clocks), and which one a request tries next;
- `probe.py`: the health probe that marks servers up and down;
- `connection.py`: the one HTTP client (connections kept alive) and an upstream's error as the gateway's;
- `request_body.py`: a request as the upstream is asked it;
- `chunks.py`: the upstream's streamed chunks as the wire's trace events, so the API, the page and the usage row read
  an upstream model's turn exactly as a local one's;
- `generation.py`: one request's stream (retries before its first byte, cancel, the gateway's own clocks);
- `tokenizer.py`: `/v1/tokenize` and `/v1/detokenize` by the upstream's own tokenizer where it has one.
"""
