"""Issue 28 rows 14, 15, 16 and 24: what heed's commands print, and where they send a bank.

The commands run as a user runs them (``python -m heed``, a real process), and their
stderr is searched for every secret they were given.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from heed.api.app import create_app
from heed.cli.memory import _bank_path
from heed.logs import EscapingFormatter, configure_logging, escape_control
from heed.redact import redact, safe_url, secrets_of
from heed.settings import Settings
from tests.support import free_port, live_server, wait_for

SECRET = "hunter2-s3cret"


def _heed(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEED_")}
    return subprocess.run(
        [sys.executable, "-m", "heed.cli", *args],
        env={**clean, "HEED_DATA_DIR": str(cwd), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


# -- row 15: start-up errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"HEED_API_KEYS": f"k1=a,{SECRET}"},
        {"HEED_API_KEYS": f"{SECRET}=a,broken"},
        {"HEED_REDIS_URL": f"http://:{SECRET}@127.0.0.1:6379/0"},
        {"HEED_DATABASE_URL": f"host=127.0.0.1 port=1 password={SECRET}"},
        {"HEED_DATABASE_URL": f"postgresql://u:{SECRET}@127.0.0.1:1/db"},
        {"HEED_DATABASE_URL": f"postgresql://u@127.0.0.1:1/db?password={SECRET}"},
        {"HEED_PORT": "not-a-port", "HEED_METRICS_KEY": SECRET},
    ],
)
def test_serve_start_up_errors_name_the_setting_not_its_secret(
    tmp_path: Path, env: dict[str, str]
) -> None:
    done = _heed("serve", env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert SECRET not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert "HEED_" in done.stderr or "PostgreSQL" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "target",
    [
        f"postgresql://u@127.0.0.1:1/db?password={SECRET}",
        f"postgresql://u:{SECRET}@127.0.0.1:1/db",
        f"host=127.0.0.1 port=1 password={SECRET}",
        f"postgresql://u:{SECRET}%zz@127.0.0.1:1/db",
        f"postgresql://u:{SECRET}@127.0.0.1:notaport/db",
    ],
)
def test_migrate_never_prints_the_password(tmp_path: Path, target: str) -> None:
    done = _heed("migrate", "--to", target, env={}, cwd=tmp_path)
    assert done.returncode != 0
    assert SECRET not in done.stderr + done.stdout, done.stderr
    assert "Traceback" not in done.stderr


def test_redaction_finds_every_password_shape() -> None:
    for text in (
        f"postgresql://u:{SECRET}@h/db",
        f"postgresql://u@h/db?sslmode=disable&password={SECRET}",
        f"host=h password={SECRET} dbname=x",
        f"host=h password='{SECRET}' dbname=x",
    ):
        assert SECRET not in redact(f"error near {text!r}", secrets_of(text))
        assert SECRET not in redact(text)  # shapes it recognises, without being told
    assert safe_url(f"redis://:{SECRET}@h:6379/0") == "redis://:***@h:6379/0"


# -- row 14: log injection -----------------------------------------------------------------


def test_log_lines_escape_control_characters() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        logging.getLogger("heed.http").info(
            "%s %s cancelled (499)", "POST", "/ui/x\nERROR heed.http: FORGED\x1b[2J"
        )
    finally:
        configure_logging("WARNING")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("INFO heed.http: POST /ui/x")
    assert lines[1:] == ["    ERROR heed.http: FORGED\\x1b[2J cancelled (499)"]  # not a record


def test_tracebacks_keep_their_lines() -> None:
    formatter = EscapingFormatter("%(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed\x07", None, sys.exc_info()
        )
    text = formatter.format(record)
    assert text.startswith("failed\\x07\nTraceback")  # heed's own traceback: as Python prints it
    assert escape_control("a\u2028b\tc\rd\ne") == "a\\x2028b\\tc\\rd\n    e"


def test_a_served_request_cannot_forge_a_log_line(tmp_path: Path) -> None:
    port = free_port()
    env = {"HEED_LLM_PROVIDER": "scripted", "HEED_LOG_LEVEL": "info"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEED_")}
    command = [sys.executable, "-m", "heed.cli", "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--data-dir", str(tmp_path)],
        env={**clean, **env},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for(lambda: _healthy(port) or process.poll() is not None, seconds=120)
        # a body that never completes, then gone: the 499 line quotes the decoded path
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /ui/x%0AERROR%20heed.http:%20FORGED%1B%5B2J HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\nContent-Length: 10\r\n\r\nabc"
            )
            time.sleep(0.3)
        time.sleep(0.5)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    forged = [line for line in stderr.splitlines() if line.startswith("ERROR heed.http: FORGED")]
    assert forged == []
    assert "\x1b" not in stderr
    assert "FORGED" in stderr, stderr  # the request was logged, escaped


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- row 24: the CLI's bank is one path segment ------------------------------------------------


def test_the_cli_quotes_the_bank_into_one_path_segment(tmp_path: Path) -> None:
    assert _bank_path("../../sessions?x=", "memories") == (
        "/v1/default/banks/..%2F..%2Fsessions%3Fx%3D/memories"
    )
    settings = Settings(data_dir=tmp_path, llm_provider="scripted")
    with live_server(create_app(settings)) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "heed.cli",
                "recall",
                "boat",
                "--bank",
                "../../sessions?x=",
                "--url",
                server.url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr
        sessions = httpx.get(f"{server.url}/v1/sessions", timeout=10).json()
        assert sessions["sessions"] == []
