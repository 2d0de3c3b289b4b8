"""Soak: mixed API and WebSocket load on a running site for a fixed time, watching memory and the usage log.

Starts the embedded default (one web process holding the worker, SQLite) on loopback with the
tiny test model (or `--model default` for the real one), then keeps `--api` HTTP clients (streamed
and whole answers, a fifth of them leaving mid-stream) and `--ws` page clients (chat turns over
the pipeline socket) busy: first until the prefix cache holds its budget (its designed growth, which
would otherwise read as a leak), then for `--minutes`. Prints the server's RSS at the start of that
measured part and each minute after, every status seen, and whether there is exactly one usage row
per request.

    .venv/bin/python benchmarks/soak.py --minutes 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx2 as httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PREFIX_CACHE = 128 * 1024**2  # the server's default, ROUNDTRIP_PREFIX_CACHE_BYTES
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def prefix_cache_bytes(url: str) -> float:
    from servers import metric_samples, metric_value

    return metric_value(metric_samples(url), "roundtrip_prefix_cache_bytes")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Tally:
    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.request_ids: set[str] = set()
        self.left = 0


async def api_client(url: str, key: str, stop: asyncio.Event, tally: Tally, rng: random.Random) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=120) as client:
        while not stop.is_set():
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"tell me about {rng.random()}"}],
                "max_tokens": rng.randint(4, 48),
                "temperature": rng.choice([0, 0.8]),
            }
            if rng.random() < 0.6:
                body["stream"] = True
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
                    tally.request_ids.add(response.headers.get("x-request-id", ""))
                    tally.statuses[f"api {response.status_code}"] += 1
                    leave_after = rng.randint(1, 6) if rng.random() < 0.2 else None
                    seen = 0
                    async for _ in response.aiter_lines():
                        seen += 1
                        if leave_after is not None and seen >= leave_after:
                            tally.left += 1
                            break
            else:
                response = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                tally.request_ids.add(response.headers.get("x-request-id", ""))
                tally.statuses[f"api {response.status_code}"] += 1


async def ws_client(url: str, stop: asyncio.Event, tally: Tally, rng: random.Random) -> None:
    origin = url
    async with websockets.connect(url.replace("http", "ws") + "/ws/pipeline/", origin=origin, max_size=None) as socket:  # type: ignore[arg-type]
        assert json.loads(await socket.recv())["type"] == "hello"
        while not stop.is_set():
            await socket.send(
                json.dumps(
                    {
                        "type": "chat",
                        "model": "m",
                        "messages": [{"role": "user", "content": f"hi {rng.random()}"}],
                        "params": {"max_tokens": rng.randint(4, 32), "temperature": 0},
                        "level": rng.choice(["summary", "full"]),
                    }
                )
            )
            while True:
                frame = json.loads(await socket.recv())
                if frame["type"] == "request":
                    tally.request_ids.add(frame["request_id"])
                elif frame["type"] == "usage":
                    tally.statuses[f"ws {frame['record']['status']}"] += 1
                elif frame["type"] == "done":
                    break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--api", type=int, default=6, help="HTTP clients")
    parser.add_argument("--ws", type=int, default=2, help="page (WebSocket) clients")
    parser.add_argument("--model", default="tiny", help="'tiny' (written here) or 'default' (the real model)")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument(
        "--prefix-cache-mib",
        type=int,
        help="the server's prefix-cache budget (default: its own), which fills with "
        "distinct prompts; the measured part starts once it is full (0: no cache)",
    )
    parser.add_argument(
        "--max-warmup", type=float, default=10.0, help="minutes of load at most before the measured part"
    )
    args = parser.parse_args()

    from servers import server_env, wait_ready
    from tiny_gguf import write_tiny_gguf

    work = Path(tempfile.mkdtemp(prefix="roundtrip-soak-"))
    path = str(write_tiny_gguf(work / "tiny.gguf")) if args.model == "tiny" else ""
    env = server_env(
        ROUNDTRIP_SQLITE_PATH=str(work / "db.sqlite3"),
        ROUNDTRIP_MODELS=json.dumps([{"id": "m", "path": path, "aliases": []}]),
        ROUNDTRIP_ANONYMOUS_LIMITS="{}",
        ROUNDTRIP_ANONYMOUS_ADDRESS_LIMITS="{}",
        ROUNDTRIP_SECRET_KEY_FILE=str(work / "secret"),
    )
    if args.prefix_cache_mib is not None:
        env["ROUNDTRIP_PREFIX_CACHE_BYTES"] = str(args.prefix_cache_mib * 1024**2)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True, capture_output=True)
    key = (
        subprocess.run(
            [*manage, "createapikey", "soak", "--rpm", "0", "--tpm", "0", "--concurrent", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .split()[-1]
    )
    log = (work / "server.log").open("wb")
    server = subprocess.Popen(
        [*manage, "serve", "--port", str(args.port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, [server], [work / "server.log"], timeout=300)
        budget = int(env.get("ROUNDTRIP_PREFIX_CACHE_BYTES", DEFAULT_PREFIX_CACHE))
        tally = Tally()
        samples: list[tuple[float, float, float]] = []  # (minutes into the measured part, RSS MiB, prefix cache MiB)

        async def watch(stop: asyncio.Event) -> None:
            """Warm up until the prefix cache holds its budget (its designed growth), then sample RSS each minute."""
            warm_until = time.monotonic() + args.max_warmup * 60
            while time.monotonic() < warm_until and prefix_cache_bytes(url) < 0.95 * budget:  # noqa: ASYNC110 (polls a server)
                await asyncio.sleep(5)
            started = time.monotonic()
            while True:
                elapsed = (time.monotonic() - started) / 60
                samples.append((elapsed, rss_mib(server.pid), prefix_cache_bytes(url) / 1024**2))
                if elapsed >= args.minutes:
                    break
                await asyncio.sleep(min(60.0, max(0.0, args.minutes * 60 - elapsed * 60)))
            stop.set()

        async def load() -> None:
            stop = asyncio.Event()
            await asyncio.gather(
                watch(stop),
                *[api_client(url, key, stop, tally, random.Random(i)) for i in range(args.api)],
                *[ws_client(url, stop, tally, random.Random(100 + i)) for i in range(args.ws)],
            )

        asyncio.run(load())
        time.sleep(3)  # the last settlements
        samples.append((samples[-1][0], rss_mib(server.pid), prefix_cache_bytes(url) / 1024**2))
        with sqlite3.connect(work / "db.sqlite3") as db:
            rows = db.execute("SELECT request_id, status FROM usage_usagerecord").fetchall()
        ids = Counter(r[0] for r in rows)
        ours = tally.request_ids - {""}
        print(
            f"soak: {args.minutes:g} min after warm-up, {args.api} API + {args.ws} WebSocket clients, model "
            f"{args.model}, "
            f"prefix cache {budget / 1024**2:.0f} MiB, {os.cpu_count()} CPUs"
        )
        print(f"requests: {len(ours)} ({tally.left} left mid-stream); statuses: {dict(sorted(tally.statuses.items()))}")
        print(
            f"usage rows for them: {sum(ids[r] for r in ours)}; requests without exactly one row: "
            f"{sum(ids[r] != 1 for r in ours)}"
        )
        print(f"5xx rows: {sum(1 for _, status in rows if status >= 500)}")
        print("minute  RSS MiB  prefix cache MiB")
        for minute, rss, cache in samples:
            print(f"{minute:6.1f}  {rss:7.0f}  {cache:16.1f}")
        before, after = samples[0][1], samples[-1][1]
        print(
            f"server RSS: {before:.0f} MiB after warm-up, {after:.0f} MiB at the end "
            f"({(after - before) / before * 100:+.1f} %)"
        )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
