"""Settings, read from ``HEED_*`` environment variables (see the README's table)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["InvalidSettings", "Settings", "default_data_dir", "load_settings"]


class InvalidSettings(ValueError):
    """Settings that do not validate; the message names each field and never its value
    (values are keys, passwords and URLs that carry them)."""


def default_data_dir() -> Path:
    """The per-user data directory: ``$XDG_DATA_HOME/heed`` or ``~/.local/share/heed``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "heed"


class Settings(BaseSettings):
    """Everything a heed server can be told; every field is ``HEED_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="HEED_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8700
    data_dir: Path = Field(default_factory=default_data_dir)
    log_level: str = "info"

    database_url: str | None = Field(
        default=None,
        description="postgresql://... to keep runs and sessions in PostgreSQL, shared by "
        "several heed processes. Unset: the embedded SQLite file in the data dir.",
    )
    database_pool_size: int = Field(
        default=16, ge=1, description="PostgreSQL connections this process may hold."
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://... to carry signals between heed processes (cancels, live "
        "journal and session events). Unset: in-process signals only.",
    )
    redis_prefix: str = Field(
        default="heed:",
        min_length=1,
        description="Prefix of heed's Redis channels: clusters sharing one Redis differ here.",
    )

    api_keys: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="key=tenant pairs, comma separated. Empty: loopback clients only, no auth.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the server answers, comma separated ('*': any). Empty: "
        "loopback names without keys (DNS-rebinding protection), any name with keys.",
    )
    metrics_key: SecretStr | None = Field(
        default=None,
        description="Bearer key for /metrics when HEED_API_KEYS is set (tenant keys are "
        "refused: the figures cover every tenant).",
    )
    ui_session_hours: float = Field(
        default=12.0, gt=0, description="How long a web UI login lasts."
    )
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_upload_bytes: int = Field(
        default=4 * 1024 * 1024 * 1024,
        ge=1024,
        description="Largest bank archive an import takes (multipart, spooled to a temporary "
        "file, not held in memory); other request bodies: HEED_MAX_BODY_BYTES.",
    )
    # Uploads (heed.api.uploads): a bank archive's bytes, spooled to disk as they arrive.
    upload_spool_dir: Path | None = Field(
        default=None,
        description="Where uploads are spooled (temporary files, deleted when the request "
        "ends); unset: the system's temporary directory.",
    )
    upload_spool_tenant_bytes: int = Field(
        default=4 * 1024**3,
        ge=1024,
        description="Upload bytes one tenant's uploads in progress may hold at once (a "
        "declared Content-Length counts from the start); past it: 429.",
    )
    upload_spool_max_bytes: int = Field(
        default=8 * 1024**3,
        ge=1024,
        description="Upload bytes all tenants' uploads in progress may hold at once; past it: 429.",
    )
    upload_min_free_bytes: int = Field(
        default=1024**3,
        ge=0,
        description="Free space the upload directory keeps: an upload that would leave less "
        "(counting what the uploads in progress will still write) is refused with 507.",
    )
    # Connections (heed.api.connection): what a client may hold open without sending.
    max_head_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Longest request line and headers; past it: 431 and the connection closes.",
    )
    head_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A request's line and headers must arrive within this of the connection "
        "opening (or of the previous response); else 408 and close.",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Longest gap in a request body; past it the connection closes and the "
        "request is abandoned.",
    )
    keep_alive_seconds: int = Field(
        default=5, ge=1, description="An idle kept-alive connection closes after this."
    )
    ready_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="GET /health/ready: how long each check (database, broker, embedding "
        "model) may take before it counts as not ready (503).",
    )
    max_in_flight: int = Field(
        default=128,
        ge=1,
        description="Requests being worked on at once (until their response starts); past it "
        "a request is refused with 503 before its body is read.",
    )
    tenant_max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="The most of those one tenant may hold (default: three quarters).",
    )
    public_max_in_flight: int = Field(
        default=16,
        ge=1,
        description="Requests without credentials to public paths (login, UI files) in "
        "flight at once, counted apart from the tenants' (with HEED_API_KEYS).",
    )
    auth_max_failures: int = Field(
        default=20,
        ge=0,
        description="Failed authentications (401s) one client address may have in "
        "HEED_AUTH_FAILURE_WINDOW_SECONDS before its key attempts get 429; 0: no limit.",
    )
    auth_failure_window_seconds: float = Field(default=60.0, gt=0)
    # MCP sessions at /mcp (heed.mcp.sessions).
    mcp_sessions_per_tenant: int = Field(
        default=100,
        ge=1,
        description="Open MCP sessions one tenant may hold at /mcp; opening one more is "
        "refused with 429 until one ends (DELETE /mcp, or idle expiry).",
    )
    mcp_max_sessions: int = Field(
        default=10_000, ge=1, description="Open MCP sessions in all; past it: 503."
    )
    mcp_session_idle_seconds: float = Field(
        default=1800.0, gt=0, description="An MCP session with no request for this long ends."
    )

    # Lanes: concurrent slots and queue length per kind of work.
    # One recall per core: a recall's embedding and scoring keep a core busy, and more
    # recalls than cores only slow each other down (measured: canary p50 -40% on 2 cores).
    recall_concurrency: int = Field(default_factory=lambda: max(2, os.cpu_count() or 2), ge=1)
    recall_queue: int = Field(default=64, ge=0)
    recall_dear_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="The most recall slots high-budget recalls may hold at once, "
        "so a cheaper recall never waits for them (default: all but one).",
    )
    reflect_concurrency: int = Field(default=2, ge=1)
    reflect_queue: int = Field(default=16, ge=0)
    retain_concurrency: int = Field(default=2, ge=1)
    retain_queue: int = Field(default=32, ge=0)
    turn_concurrency: int = Field(default=8, ge=1)
    turn_queue: int = Field(default=64, ge=0)
    # Uploaded files are parsed in child processes (niced, bounded: heed.memory.files.parse)
    # under a lane of their own, so parses never hold the retain slots another tenant's
    # retain needs; the retain slot is taken only to embed and write what a parse gave.
    parse_concurrency: int = Field(default=2, ge=1)
    parse_queue: int = Field(default=32, ge=0)
    #: Longest a piece of work may wait for a lane slot (expected or actual) before the lane
    #: sheds it with a 503; ``None``: bounded by the queue length only.
    recall_max_wait_seconds: float | None = Field(default=2.0, gt=0)
    reflect_max_wait_seconds: float | None = Field(default=30.0, gt=0)
    retain_max_wait_seconds: float | None = Field(default=60.0, gt=0)
    turn_max_wait_seconds: float | None = Field(default=None, gt=0)
    parse_max_wait_seconds: float | None = Field(default=60.0, gt=0)
    # Background work in every lane (memory consolidation's recalls and LLM calls,
    # heed.runtime.slots): it yields to interactive work; these bound its share.
    background_capacity: int | None = Field(
        default=None,
        ge=1,
        description="The most slots of each lane background work may hold at once (at most "
        "the lane's slots). Default: all but one, at least 1, so one slot stays free for a "
        "user's request while background work runs.",
    )
    background_max_defer_seconds: float = Field(
        default=10.0,
        ge=0,
        description="A background waiter that has waited this long competes as if it were "
        "interactive work, so it is never starved forever (0: at once).",
    )
    background_max_queue: int = Field(
        default=64,
        ge=1,
        description="Background waiters one tenant may have queued in one lane (tenants are "
        "served round robin); its waiters past it are deferred: they wait behind its queued "
        "ones, not aging, and background work is never refused.",
    )
    offload_threads: int = Field(default=32, ge=1)

    # Runs and streams (heed.runs, heed.sessions).
    run_unwind_window: float = Field(
        default=180.0, gt=0, description="Seconds a cancelling worker may unwind before reclaim."
    )
    run_lease_seconds: float = Field(default=15.0, gt=0, description="Worker lease length.")
    run_reaper_interval: float = Field(
        default=2.0, gt=0, description="Seconds between reaper passes (lease renewal, reclaim)."
    )
    stream_heartbeat_seconds: float = Field(default=10.0, gt=0)
    stream_poll_seconds: float = Field(
        default=20.0,
        gt=0,
        description="An idle stream re-reads the journal this often, a fallback for a lost "
        "broker hint.",
    )
    run_cancel_watch_seconds: float = Field(
        default=0.05,
        ge=0,
        description="Without Redis: while this process runs work, how often one query asks "
        "whether another process sharing the database cancelled any of it (0: only at the "
        "next lease renewal).",
    )
    stream_watch_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Without Redis: how often one query checks every followed run for events "
        "another process sharing the database wrote (0: never).",
    )
    run_queue_sweep_seconds: float = Field(
        default=30.0, gt=0, description="Seconds between the reaper's sweeps for queued runs."
    )
    max_queued_turns_per_session: int = Field(
        default=32, ge=1, description="Queued turns one session may hold (enqueue past it: 429)."
    )
    tenant_max_streams: int = Field(
        default=500, ge=1, description="Open SSE streams one tenant may hold per process (429)."
    )
    turn_max_steps: int = Field(default=6, ge=1, description="Model calls per turn (tool loops).")
    shutdown_grace_seconds: int = Field(
        default=5,
        ge=1,
        description="On shutdown, requests still open after this (SSE streams) are cancelled.",
    )
    run_journal_retention_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Finished runs' journals keep only their terminal event after this; 0: keep.",
    )
    malloc_arenas: int = Field(
        default=2,
        ge=0,
        description="glibc malloc arenas for `heed serve` (0: glibc's default, eight per "
        "core); more only grew the process under load.",
    )
    #: Both ways round: a busy worker thread delays the event loop by up to one interval,
    #: and a busy event loop (a storm of requests) delays every worker thread by up to one
    #: interval each time the thread gives the GIL up (a SQLite call, a numpy or ONNX call),
    #: which it does many times a recall. At 1 ms the storm canary's p99 was 171-250 ms over
    #: four runs; at 0.25 ms, 111-158 ms over three (benchmarks/disconnect_storm.py).
    switch_interval_ms: float = Field(
        default=0.25,
        gt=0,
        description="Python's GIL switch interval for `heed serve`: how long a thread may hold "
        "the GIL while another waits for it (Python's default is 5).",
    )

    enable_diagnostics: bool = Field(
        default=False,
        description="Mount /v1/_diag (a CPU burner for benchmarks). Never in production.",
    )

    # OpenTelemetry traces (heed.runtime.tracing, docs/tracing.md).
    tracing: Literal["off", "on"] = Field(
        default="off",
        description="on: OpenTelemetry spans per request, run and stage, exported as the "
        "standard OTEL_* variables say (OTEL_TRACES_EXPORTER, default otlp over HTTP; "
        "OTEL_EXPORTER_OTLP_ENDPOINT...). off: no span is made.",
    )
    tracing_record_content: bool = Field(
        default=False,
        description="Put what callers wrote on spans (a recall's query as "
        "gen_ai.memory.query.text). Off by default: traces leave the server.",
    )

    # LLM providers (heed.llm). The llm_* fields are the defaults; reflect_llm_* and
    # turn_llm_* override them per operation (None: use the default).
    llm_provider: str = Field(default="local", description="local, openai or scripted.")
    llm_model: str = Field(
        default="",
        description="Model name; empty: the provider's default (local: smollm2-135m-instruct).",
    )
    llm_base_url: str = Field(
        default="https://api.openai.com/v1",
        description="Base URL of an OpenAI-compatible API (the part before /chat/completions).",
    )
    llm_api_key: SecretStr | None = Field(default=None, description="Bearer key for openai.")
    llm_timeout: float = Field(
        default=60.0, gt=0, description="Seconds to connect, and between streamed chunks."
    )
    llm_retries: int = Field(
        default=2, ge=0, description="Retries of 429/5xx/unreachable before the first token."
    )
    llm_max_tokens: int = Field(default=512, ge=1, description="Default cap on reply tokens.")
    llm_concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Calls in flight at once to one remote (openai) upstream, shared by every "
        "operation; background calls hold at most all but one and yield to users' "
        "(heed.llm.gate). The embedded model is bounded by the CPU lanes instead.",
    )
    llm_queue: int = Field(
        default=256,
        ge=0,
        description="Users' calls that may wait for a remote upstream's slot; more: 503.",
    )
    llm_budget_tokens_per_hour: int | None = Field(
        default=None,
        ge=1,
        description="Default per-bank budget of background LLM tokens (extraction of "
        "asynchronous retains, consolidation, mental-model refreshes) per clock hour (UTC); "
        "a bank's llm_budget_tokens_per_hour overrides it. Unset: no budget.",
    )
    llm_budget_tokens_per_day: int | None = Field(
        default=None,
        ge=1,
        description="The same per UTC day; a bank's llm_budget_tokens_per_day overrides it.",
    )
    llm_script: str | None = Field(
        default=None, description="Scripted provider's script: JSON text or a .json file path."
    )
    llm_threads: int = Field(default=0, ge=0, description="Local model threads; 0: half the cores.")
    llm_prefill_threads: int = Field(
        default=0,
        ge=0,
        description="Local model threads for evaluating a prompt; 0: every core while one is "
        "spare (1-minute load average), else llm_threads.",
    )
    model_cache_dir: Path | None = Field(
        default=None,
        description="Where the local model's F16 copy is kept; unset: "
        "$XDG_CACHE_HOME/heed/models or ~/.cache/heed/models.",
    )
    reflect_llm_provider: str | None = None
    reflect_llm_model: str | None = None
    reflect_llm_base_url: str | None = None
    reflect_llm_api_key: SecretStr | None = None
    reflect_llm_timeout: float | None = Field(default=None, gt=0)
    reflect_llm_max_tokens: int | None = Field(default=None, ge=1)
    reflect_llm_script: str | None = None
    turn_llm_provider: str | None = None
    turn_llm_model: str | None = None
    turn_llm_base_url: str | None = None
    turn_llm_api_key: SecretStr | None = None
    turn_llm_timeout: float | None = Field(default=None, gt=0)
    turn_llm_max_tokens: int | None = Field(default=None, ge=1)
    turn_llm_script: str | None = None
    retain_llm_provider: str | None = None
    retain_llm_model: str | None = None
    retain_llm_base_url: str | None = None
    retain_llm_api_key: SecretStr | None = None
    retain_llm_timeout: float | None = Field(default=None, gt=0)
    retain_llm_max_tokens: int | None = Field(default=None, ge=1)
    retain_llm_script: str | None = None

    # Memory that learns (heed.memory.learning.extraction, heed.memory.learning.consolidation).
    retain_extraction: Literal["auto", "off", "concise", "verbose"] = Field(
        default="auto",
        description="Fact extraction at retain for banks that do not choose: auto is on "
        "(concise) when an openai provider serves retain (HEED_RETAIN_LLM_*), else off.",
    )
    observations: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Consolidation into observations for banks that do not choose "
        "(enable_observations): auto is on when an openai provider serves retain.",
    )
    consolidation_batch: int = Field(
        default=16, ge=1, le=256, description="Facts one consolidation round takes."
    )
    consolidation_debounce_seconds: float = Field(
        default=2.0, ge=0, description="Quiet after a retain before consolidation starts."
    )
    consolidation_max_seconds: float = Field(
        default=1800.0, gt=0, description="Wall-clock ceiling of one consolidation run."
    )
    # Mental models (heed.mental_models).
    mental_model_min_refresh_interval_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Least time between two refreshes of one mental model, unless its trigger"
        " or its bank's config (mental_model_min_refresh_interval_seconds) says otherwise.",
    )
    mental_model_refresh_debounce_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Quiet after a retain or consolidation before a triggered refresh starts.",
    )
    mental_model_refresh_max_seconds: float = Field(
        default=600.0, gt=0, description="Wall-clock ceiling of one mental model refresh."
    )

    # Memory engine (heed.memory).
    embeddings_provider: str = Field(
        default="onnx",
        description="onnx (all-MiniLM-L6-v2 int8, shipped in PyPI packages) or openai "
        "(an OpenAI-compatible /embeddings endpoint).",
    )
    embeddings_base_url: str = Field(
        default="https://api.openai.com/v1", description="Base URL of the embeddings endpoint."
    )
    embeddings_model: str = Field(
        default="text-embedding-3-small", description="Model name sent to the endpoint."
    )
    embeddings_api_key: SecretStr | None = Field(default=None, description="Its bearer key.")
    embeddings_dim: int = Field(default=384, ge=1, description="Vector size of the endpoint.")
    embeddings_batch_size: int = Field(default=16, ge=1, description="Texts per embedding batch.")
    reranker: str = Field(
        default="blend",
        description="none, blend or overlap (chosen by LoCoMo measurement; see the README).",
    )
    reranker_model_dir: Path | None = Field(
        default=None,
        description="A local ONNX cross-encoder (model.onnx + tokenizer.json); replaces "
        "the reranker when set.",
    )
    max_query_tokens: int = Field(default=500, ge=1, description="Longest recall query.")
    max_item_chars: int = Field(default=200_000, ge=1, description="Longest retain item.")
    # Bank transfer (heed.transfer.service): exports, imports and clones of banks.
    transfer_archive_ttl_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="How long an export's archive stays downloadable (and an uploaded "
        "archive waits for its import).",
    )
    export_tenant_max_count: int = Field(
        default=16,
        ge=1,
        description="Export archives one tenant may have stored at once (until they expire); "
        "past it an export is refused with 429 (an unchanged bank's last export is reused "
        "instead of stored again).",
    )
    export_tenant_max_bytes: int = Field(
        default=8 * 1024**3,
        ge=1024,
        description="Bytes of export archives one tenant may have stored at once; an export "
        "that would pass it is refused with 429.",
    )
    transfer_max_unpacked_bytes: int = Field(
        default=16 * 1024**3,
        ge=1024,
        description="Most bytes an imported archive's entries may declare in all "
        "(the upload itself is bounded by HEED_MAX_UPLOAD_BYTES).",
    )
    transfer_max_records: int = Field(
        default=20_000_000,
        ge=1000,
        description="Most records an imported archive may hold in all (its check keeps 8 "
        "bytes an id: this bounds its memory and time).",
    )
    transfer_check_cpu_seconds: int = Field(
        default=900,
        ge=1,
        description="CPU seconds the check of one uploaded archive may use (in a process "
        "of its own).",
    )
    transfer_check_memory_bytes: int = Field(
        default=1024**3,
        ge=64 * 1024 * 1024,
        description="Memory the check of one uploaded archive may add to its process.",
    )
    transfer_check_seconds: float = Field(
        default=1800.0, gt=0, description="Wall-clock seconds one archive check may take."
    )
    # File retain (heed.memory.files): POST .../files/retain.
    file_max_files: int = Field(
        default=20, ge=1, le=64, description="Most files in one file retain (at most 64)."
    )
    file_max_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest file in a file retain."
    )
    file_max_unpacked_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Most bytes an Office file (a zip) may unpack to: past it, refused.",
    )
    file_max_text_chars: int = Field(
        default=2_000_000, ge=1, description="Most text one file may yield."
    )
    file_max_tags: int = Field(
        default=2_000_000,
        ge=1000,
        description="Most tags a file's parse may walk: an HTML file's, or the XML an Office "
        "file's parser builds in memory (a spreadsheet's sheets are counted in cells).",
    )
    file_max_cells: int = Field(
        default=1_000_000,
        ge=1000,
        description="Most spreadsheet cells (and empty rows) a file's parse may scan.",
    )
    file_parse_cpu_seconds: int = Field(
        default=30, ge=1, description="CPU seconds one file's parsing process may use."
    )
    file_parse_memory_bytes: int = Field(
        default=1024**3,
        ge=64 * 1024 * 1024,
        description="Memory one file's parsing process may add to what it starts with.",
    )
    file_parse_seconds: float = Field(
        default=60.0, gt=0, description="Wall-clock seconds one file's parse may take."
    )
    # Webhooks (heed.webhooks).
    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhooks target loopback, private and link-local addresses.",
    )
    webhook_max_attempts: int = Field(default=6, ge=1, description="Tries per delivery.")
    webhook_backoff_seconds: float = Field(
        default=5.0, gt=0, description="First retry delay; doubled per try (capped at 1 h)."
    )
    webhook_poll_seconds: float = Field(
        default=1.0, gt=0, description="How often the delivery worker looks for due work."
    )
    webhook_lease_seconds: float = Field(
        default=90.0, gt=0, description="How long a claimed delivery is held by its worker."
    )
    webhook_max_per_bank: int = Field(
        default=100,
        ge=1,
        le=100,
        description="Most webhooks a bank may have (at most 100: what a bank archive carries).",
    )
    webhook_concurrency: int = Field(
        default=64, ge=1, le=1024, description="Deliveries one process sends at once."
    )
    webhook_concurrency_per_tenant: int = Field(
        default=8, ge=1, description="Deliveries of one tenant one process sends at once."
    )
    webhook_concurrency_per_webhook: int = Field(
        default=4, ge=1, description="Deliveries of one webhook one process sends at once."
    )
    webhook_response_excerpt_bytes: int = Field(
        default=256,
        ge=0,
        le=4096,
        description="Bytes of a receiver's answer kept in the delivery log (0: none).",
    )
    webhook_log_max_per_webhook: int = Field(
        default=1000, ge=1, description="Deliveries a webhook's log keeps (the newest)."
    )
    webhook_log_retention_seconds: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="How long a finished delivery stays in its webhook's log.",
    )
    webhook_prune_interval_seconds: float = Field(
        default=60.0, gt=0, description="How often the delivery log is pruned."
    )
    llm_request_log_content: Literal["off", "on"] = Field(
        default="off",
        description="Whether LLM request traces keep the prompts' and replies' text (secrets "
        "masked); off keeps roles and lengths only.",
    )
    llm_request_log_max_per_bank: int = Field(
        default=1000, ge=1, description="LLM request traces a bank keeps (the newest)."
    )
    llm_request_log_max_age_days: float = Field(
        default=30.0, gt=0, description="How long an LLM request trace is kept."
    )
    audit_log_max_per_bank: int = Field(
        default=10_000, ge=1, description="Audit log entries a bank keeps (the newest)."
    )
    audit_log_max_age_days: float = Field(
        default=90.0, gt=0, description="How long an audit log entry is kept."
    )
    vector_cache_mb: int = Field(
        default=2048,
        ge=1,
        description="Memory for in-process vector indexes; least recently used banks unload.",
    )

    def database_path(self) -> Path:
        """The embedded database file inside the data dir."""
        return self.data_dir / "heed.db"

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value and value.split("://", 1)[0] not in ("postgresql", "postgres"):
            raise ValueError(
                "HEED_DATABASE_URL must be a postgresql:// URL (unset for SQLite), got one "
                f"starting {value.split(':', 1)[0][:20]!r}"
            )
        return value or None

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value and value.split("://", 1)[0] not in ("redis", "rediss", "unix"):
            raise ValueError(
                "HEED_REDIS_URL must be a redis://, rediss:// or unix:// URL, got one starting "
                f"{value.split(':', 1)[0][:20]!r}"
            )
        return value or None

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return [h.strip() for h in value.split(",") if h.strip()]
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        keys: dict[str, str] = {}
        for number, pair in enumerate(filter(None, (p.strip() for p in value.split(","))), 1):
            key, sep, tenant = pair.partition("=")
            if not sep or not key.strip() or not tenant.strip():
                # never the entry itself: it is a key
                raise ValueError(
                    f"HEED_API_KEYS entries look like key=tenant; entry {number} does not"
                )
            keys[key.strip()] = tenant.strip()
        return keys


def load_settings(**overrides: object) -> Settings:
    """:class:`Settings` from the environment and *overrides*.

    Raises :class:`InvalidSettings` naming every field that does not validate, without its
    value (pydantic's own message quotes the input, which may be a key or a password).
    """
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            field = ".".join(str(part) for part in error["loc"]) or "settings"
            problems.append(f"HEED_{field.upper()}: {error['msg']}")
        raise InvalidSettings("invalid settings: " + "; ".join(problems)) from None
