"""The observer behind heed_llm_retries_total / heed_llm_failures_total: one per process
while any app serves, none once they all stopped, none for an app that never started.

Its own module: the other LLM metrics tests keep a server up for their whole module.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from heed.api.app import create_app
from heed.llm.observe import current_observers, notify_failure, notify_retry
from heed.settings import Settings
from tests.support import LiveServer, live_server, metric_value

RETRIES = "heed_llm_retries_total"
FAILURES = "heed_llm_failures_total"


def scrape(server: LiveServer) -> str:
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, llm_provider="scripted")


def test_one_observer_however_many_apps_serve_and_none_after_they_stop(
    tmp_path: Path,
) -> None:
    """Two apps serving in one process share one observer: an event counts once in each
    app's /metrics (the process's figures), never twice. An app built but never started
    adds none, and when the last app stops the observer is gone."""
    baseline = current_observers()
    create_app(settings(tmp_path / "never-started"))
    assert current_observers() == baseline
    one_app = create_app(settings(tmp_path / "one"))
    two_app = create_app(settings(tmp_path / "two"))
    labels = {"provider": "openai", "reason": "unreachable"}
    with live_server(one_app) as one:
        assert len(current_observers()) == len(baseline) + 1
        with live_server(two_app) as two:
            assert len(current_observers()) == len(baseline) + 1
            before = [metric_value(scrape(s), RETRIES, **labels) for s in (one, two)]
            notify_retry("openai", None, "unreachable", 0.0)
            after = [metric_value(scrape(s), RETRIES, **labels) for s in (one, two)]
            assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
        assert len(current_observers()) == len(baseline) + 1  # one still serves
        notify_retry("openai", None, "unreachable", 0.0)
        text = scrape(one)
        retries = metric_value(text, RETRIES, **labels)
        assert retries == after[0] + 1
        failures = metric_value(text, FAILURES, **labels)
    assert current_observers() == baseline
    # Nothing counts while no app serves; a later app exports the process's figures.
    notify_retry("openai", None, "unreachable", 0.0)
    notify_failure("openai", None, "unreachable")
    with live_server(create_app(settings(tmp_path / "three"))) as three:
        text = scrape(three)
        assert metric_value(text, RETRIES, **labels) == retries
        assert metric_value(text, FAILURES, **labels) == failures
    assert current_observers() == baseline
