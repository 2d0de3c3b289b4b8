"""The gateway's own time on one streamed request, without an upstream's spread: a stand-in upstream that answers at
once, asked directly and through Roundtrip's gateway, alternating, by one blocking client.

    python benchmarks/bench_gateway_path.py [--requests 400] [--rounds 3] [--baseline-root CHECKOUT]

`bench_gateway.py` measures the gateway in front of llama-server, whose prefill wanders by tens of milliseconds from
one request to the next: a change of half a millisecond in the gateway does not show there. Here the upstream is a
bare ASGI app under uvicorn that streams a three-chunk chat answer the moment it is asked, so what the gateway adds
to the time to the first content byte is its own work (the HTTP server, Django, the key, the body, limits, route,
the upstream request, the first chunk's way back), measured to a few hundredths of a millisecond. The client is a
blocking socket (a new connection for every request, as `bench_gateway.py`'s), the same for both, taking the targets
in turn request by request (a virtual machine's neighbours slow it by the minute); the paired figure is the median of
each request's difference from the direct one before it. With
`--baseline-root` another checkout's gateway is measured in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from servers import free_port, stop, wait_ready  # noqa: E402

from benchmarks.bench_gateway import baseline_gateway, gateway  # noqa: E402
from benchmarks.bench_serving import Target  # noqa: E402


def _event(delta: dict[str, str], finish: str | None = None) -> bytes:
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "default"}
    return b"data: " + json.dumps(chunk | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
ANSWER = [
    _event({"role": "assistant", "content": "Hello"}) + b"\n\n",
    _event({"content": " world"}) + b"\n\n" + _event({}, "length") + b"\n\n",
    b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"default","choices":[],"usage":'
    + json.dumps(USAGE).encode()
    + b"}\n\ndata: [DONE]\n\n",
]


async def stand_in(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The upstream: `GET` (health, models) answers 200; `POST` streams `ANSWER` at once."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"status": "ok", "data": [{"id": "default"}]}'})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for part in ANSWER:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@contextmanager
def stand_in_server(workdir: Path) -> Iterator[Target]:
    port = free_port()
    log = workdir / "stand-in.log"
    command = [sys.executable, "-m", "uvicorn", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    command += ["--log-level", "warning", "--no-access-log", "benchmarks.bench_gateway_path:stand_in"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", [process], [log], timeout=60)
        yield Target(f"http://127.0.0.1:{port}/v1", "none", process.pid)
    finally:
        stop([process])


def first_byte_ms(target: Target, model: str, requests: int) -> list[float]:
    """Each request's time from its first byte sent to the first content byte read (ms), and its answer read whole."""
    host, port = target.url.split("//")[1].split("/")[0].split(":")
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": True, "max_tokens": 2}
    ).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {target.key}\r\n"
    request = (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    times = []
    for _ in range(requests):
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sent = time.perf_counter()
            sock.sendall(request)
            got = b""
            while b"Hello" not in got:
                data = sock.recv(65536)
                if not data:
                    raise RuntimeError(f"the answer ended before its first content: {got[:300]!r}")
                got += data
            times.append((time.perf_counter() - sent) * 1000)
            while not got.endswith(b"0\r\n\r\n") and (data := sock.recv(65536)):
                got += data
        time.sleep(0.01)  # the gateway writes the usage row after the answer: not into the next request
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per target and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-root", type=Path, help="another checkout whose gateway runs beside this one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="roundtrip-gateway-path-") as tmp:
        workdir = Path(tmp)
        with (
            stand_in_server(workdir) as upstream,
            gateway(workdir, upstream) as ours,
            baseline_gateway(workdir, upstream, args.baseline_root) as baseline,
        ):
            targets = {"direct": (upstream, "default"), "roundtrip": (ours, "llama")}
            if baseline is not None:
                targets["baseline"] = (baseline, "llama")
            found: dict[str, list[float]] = {name: [] for name in targets}
            for target, model in targets.values():
                first_byte_ms(target, model, 30)  # warm-up: connections, caches; not counted
            for _ in range(args.rounds * args.requests):  # request by request, so drift in the machine hits all alike
                for name, (target, model) in targets.items():
                    found[name] += first_byte_ms(target, model, 1)
    direct = statistics.median(found["direct"])
    print(f"\ntime to the first content byte, p50 of {args.requests * args.rounds} requests (ms)")
    for name, times in found.items():
        if name == "direct":
            print(f"  {name:<10} {direct:7.3f}")
            continue
        pairs = statistics.median(t - d for t, d in zip(times, found["direct"], strict=True))
        print(
            f"  {name:<10} {statistics.median(times):7.3f}  added {statistics.median(times) - direct:+.3f} ms, "
            f"paired {pairs:+.3f} ms"
        )


if __name__ == "__main__":
    main()
