"""Helpers for running the site as real processes: free ports, `manage.py`, waiting for /health. The tests use them,
and so does `benchmarks/bench_serving.py` (which may point `root` at another checkout for an A/B run)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parent.parent


# What a server started by the tests may inherit from the developer's environment; everything else (a DATABASE_URL,
# a REDIS_URL, a GPU) stays out, so the servers run the layout and the device the test asks for.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "ROUNDTRIP_WEIGHTS", "ROUNDTRIP_CACHE_DIR")


def share_kernels(cache_dir: Path) -> Path:
    """`cache_dir`, with Roundtrip's compiled CPU kernels shared with the user's cache: its `kernels` folder is the
    user's. A test's own weights cache starts empty, but a server that found no kernels in it built them first (about
    30 s, more on two busy cores), once for every such cache in a run."""
    from inference.load_config import default_cache_dir

    shared = default_cache_dir() / "kernels"
    shared.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    link = cache_dir / "kernels"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return cache_dir


def server_env(**settings: str) -> dict[str, str]:
    """A server's environment: the allowlist above, CPU pinned, unbuffered output, SmolLM2 alone unless the
    settings ask for Gemma too (ROUNDTRIP_GEMMA=1), then `settings`."""
    env = {name: os.environ[name] for name in INHERITED if name in os.environ}
    defaults = {"ROUNDTRIP_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "ROUNDTRIP_GEMMA": "0"}
    return {**env, **defaults, **settings}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def manage(env: dict[str, str], *args: str, root: Path = ROOT) -> str:
    """Run a management command to completion; its stdout."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def start(env: dict[str, str], log: Path, *args: str, root: Path = ROOT) -> subprocess.Popen[bytes]:
    """Start a long-running management command, its output going to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )


class NotReady(AssertionError):
    """A server that died or did not get ready in time; the message holds its logs."""


def wait_ready(url: str, processes: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float = 120) -> None:
    """Until `url`/health says every model is loaded; fails with the logs if a process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
            raise NotReady(
                f"{url} did not get ready:\n" + "\n---\n".join(log.read_text(errors="replace") for log in logs)
            )
        time.sleep(0.2)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_samples(url: str) -> Samples:
    """Every sample a process's /metrics exports (name and labels -> value); `url` is the site or a metrics port."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def metric_value(found: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def clear_of_minute_edge(margin: float = 15.0) -> None:
    """Sleep past the next minute boundary if it is near, so a burst of requests counts in one rate window."""
    left = 60 - time.time() % 60
    if left < margin:
        time.sleep(left + 0.5)


@dataclass(frozen=True)
class Deployment:
    url: str
    key: str  # an unlimited API key
    db: Path
    pid: int


@contextmanager
def deployment(workdir: Path, **settings: str) -> Iterator[Deployment]:
    """`manage.py serve` with its own SQLite database in `workdir` and `settings`, and an unlimited key, until the
    block ends."""
    db = workdir / "db.sqlite3"
    env = {**server_env(), "ROUNDTRIP_SQLITE_PATH": str(db), **settings}
    manage(env, "migrate", "--noinput")
    key = manage(env, "createapikey", "tests", "--rpm", "0", "--tpm", "0", "--concurrent", "0").strip().split()[-1]
    port = free_port()
    log = workdir / "server.log"
    process = start(env, log, "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, [process], [log], timeout=300)
        yield Deployment(url, key, db, process.pid)
    finally:
        stop([process])


def default_deployment(workdir: Path) -> AbstractContextManager[Deployment]:
    """As `make run` starts it: both default models (SmolLM2 and Gemma 3 270M) in the format a user gets
    (`ROUNDTRIP_WEIGHTS=auto`)."""
    return deployment(workdir, ROUNDTRIP_GEMMA="1", ROUNDTRIP_WEIGHTS="auto")
