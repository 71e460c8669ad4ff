"""`heed retain`, `heed recall` and `heed import-locomo` against a running server."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from heed.cli import main
from tests.support import LiveServer


def test_retain_stdin_then_recall(server: LiveServer) -> None:
    runner = CliRunner()
    text = "\n".join(
        json.dumps({"content": c})
        for c in ["Dana: I bought a red kayak.", "Eli: My sister lives in Lisbon."]
    )
    result = runner.invoke(main, ["retain", "-", "--bank", "cli", "--url", server.url], input=text)
    assert result.exit_code == 0, result.output
    assert "retained 2 items" in result.output
    result = runner.invoke(main, ["recall", "kayak", "--bank", "cli", "--url", server.url])
    assert result.exit_code == 0, result.output
    assert "red kayak" in result.output.splitlines()[0]


def test_recall_reports_server_errors(server: LiveServer) -> None:
    result = CliRunner().invoke(main, ["recall", "?!", "--bank", "cli", "--url", server.url])
    assert result.exit_code != 0
    assert "no words" in result.output


def test_import_locomo(server: LiveServer, tmp_path: Path) -> None:
    sample = {
        "sample_id": "tiny",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I started pottery classes."},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Nice! I ran a marathon."},
            ],
        },
        "qa": [],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    result = CliRunner().invoke(main, ["import-locomo", str(path), "--url", server.url])
    assert result.exit_code == 0, result.output
    assert "imported 2 turns into 1 banks" in result.output
    result = CliRunner().invoke(
        main, ["recall", "pottery", "--bank", "locomo-tiny", "--url", server.url, "--json"]
    )
    body = json.loads(result.output)
    assert body["results"][0]["metadata"] == {"dia_id": "D1:1"}
    assert body["results"][0]["occurred_start"].startswith("2023-05-08")
