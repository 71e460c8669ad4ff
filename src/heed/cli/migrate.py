"""``heed migrate``: copy a SQLite database into PostgreSQL, then verify the copy.

Unlike the other client commands this one works on the databases themselves, not through
a server: stop the server that uses the SQLite file first. The copier and its model (what
is copied, idempotency, seq remapping, the checks) are :mod:`heed.migrate`; this
module parses options, draws the progress bars on stderr and prints the summary.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from heed.cli.options import settings_of
from heed.redact import redact, secrets_of

FC = TypeVar("FC", bound=Callable[..., Any])

if TYPE_CHECKING:
    from heed.migrate import MigrationSummary, Verification

__all__ = ["migrate"]

# heed.migrate's defaults, written out: it loads the PostgreSQL driver, numpy and the memory
# engine, so it is imported only when the command runs (tests check the two agree).
DEFAULT_BATCH_SIZE = 500
DEFAULT_VERIFY_QUERIES = 20

_PHASES = {"copy": "copy", "verify": "recall check"}
_LABEL_WIDTH = 34


class _Bars:
    """One ``click.progressbar`` per phase (all rows, then the recall queries), on stderr."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, phase: str, total: int) -> None:
        self.finish()
        self._bar = click.progressbar(
            length=max(0, total),
            label=_PHASES.get(phase, phase).ljust(_LABEL_WIDTH),
            file=sys.stderr,
            show_pos=True,
        )
        self._bar.__enter__()

    def advance(self, label: str, steps: int) -> None:
        if self._bar is not None:
            self._bar.label = label[:_LABEL_WIDTH].ljust(_LABEL_WIDTH)
            self._bar.update(steps)

    def finish(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.__exit__(None, None, None)


def _verification_lines(verification: Verification) -> list[str]:
    lines = []
    mismatches = verification.mismatches
    if mismatches:
        lines.append(f"counts: {len(mismatches)} of {len(verification.counts)} differ")
    else:
        lines.append(f"counts: all {len(verification.counts)} match")
    if verification.recall:
        lines.append(
            f"recall: top-1 agreement {verification.top1_agreement:.3f} over "
            f"{verification.queries} queries in {len(verification.recall)} banks "
            f"(at least {verification.min_top1} needed), mean top-10 overlap "
            f"{verification.mean_top10_overlap:.3f}"
        )
        for bank in verification.recall:
            lines.append(
                f"  {bank.tenant}/{bank.bank_id}: {bank.queries} queries, top-1 "
                f"{bank.top1_agreement:.3f}, top-10 overlap {bank.mean_top10_overlap:.3f}"
            )
    else:
        lines.append("recall: not compared (no units, or --verify-queries 0)")
    lines.extend(f"FAILED: {problem}" for problem in verification.problems())
    return lines


def _summary_lines(summary: MigrationSummary) -> list[str]:
    lines = [
        f"migrated {summary.source} -> {summary.target} "
        f"({summary.dim}-dimensional vectors, {summary.seconds:.1f} s)",
        f"  {'table':<24} {'copied':>9} {'existing':>9}",
    ]
    for table, copied in summary.copied.items():
        lines.append(f"  {table:<24} {copied:>9} {summary.existing.get(table, 0):>9}")
    lines.append(f"  {'total':<24} {summary.total_copied:>9}")
    runs, events = summary.left_out.get("runs", 0), summary.left_out.get("run_events", 0)
    lines.append(
        f"left out: {runs} unfinished runs ({events} journal events): stale once their "
        "server stopped"
    )
    for table in ("memory_unit_entities", "memory_links"):
        if summary.left_out.get(table):
            lines.append(f"left out: {summary.left_out[table]} {table} rows pointing at no unit")
    if summary.left_out.get("transfer_archives"):
        lines.append(
            f"left out: {summary.left_out['transfer_archives']} bank archives expired or "
            "never finished (no server serves them)"
        )
    if summary.verification is not None:
        lines.extend(_verification_lines(summary.verification))
    return lines


def _number_option(
    flag: str, default: float, bounds: click.IntRange | click.FloatRange, help_text: str
) -> Callable[[FC], FC]:
    """``click.option(flag)``: a number within *bounds*, *default* shown in ``--help``."""
    return click.option(flag, default=default, show_default=True, type=bounds, help=help_text)


@click.command("migrate")
@click.option(
    "--from",
    "source",
    default=None,
    metavar="SQLITE",
    help="The SQLite database: a path, sqlite:///relative.db or sqlite:////absolute.db "
    "(default: heed.db in the data dir, HEED_DATA_DIR).",
)
@click.option(
    "--to",
    "target",
    default=None,
    metavar="URL",
    help="The PostgreSQL database, postgresql://... with pgvector 0.8+ "
    "(default: HEED_DATABASE_URL; required when that is unset).",
)
@_number_option("--batch-size", DEFAULT_BATCH_SIZE, click.IntRange(min=1), "Rows per transaction.")
@click.option("--verify-only", is_flag=True, help="Copy nothing; only compare the two.")
@_number_option(
    "--verify-queries",
    DEFAULT_VERIFY_QUERIES,
    click.IntRange(min=0),
    "Recall queries compared per bank (0: compare counts only).",
)
@_number_option(
    "--connect-timeout",
    10.0,
    click.FloatRange(min=0.5),
    "Seconds to wait for the PostgreSQL server.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def migrate(
    source: str | None,
    target: str | None,
    batch_size: int,
    verify_only: bool,
    verify_queries: int,
    connect_timeout: float,
    as_json: bool,
) -> None:
    """Copy a heed SQLite database into PostgreSQL, then verify the copy.

    Copies memory banks (documents, chunks, units with their vectors and keyword
    text, entities, links, the retain ledger, directives, mental models), sessions with
    their transcripts and wakeups, finished runs with their journals, the banks' webhooks
    with their events and deliveries, and exported bank archives not yet expired; unfinished runs
    (and expired archives) are left out and counted. Stop the server using the SQLite
    file first; the file is only read.

    Safe to run again: rows already in PostgreSQL are kept, so a second run copies
    nothing and an interrupted one resumes.

    The check at the end (alone with --verify-only) compares row counts per table
    (per bank for memory) and recalls up to --verify-queries units' texts per bank on
    both databases. It fails, with exit status 1, when a count differs or fewer than
    90% of the queries have the same top hit on both.
    """
    from heed.migrate import MigrationError, engine_factory_for
    from heed.migrate import migrate as run_migration
    from heed.migrate import verify as run_verification

    settings = settings_of()
    source_value = source or str(settings.database_path())
    target_value = target or settings.database_url
    if not target_value:
        raise click.UsageError(
            "give the PostgreSQL database: --to postgresql://... or set HEED_DATABASE_URL"
        )
    # Every message below may quote a URL or a driver's echo of it: never its password.
    secrets = [*secrets_of(target_value), *secrets_of(source_value)]
    factory = engine_factory_for(settings) if verify_queries else None
    bars = _Bars()
    try:
        if verify_only:
            verification = run_verification(
                source_value,
                target_value,
                queries=verify_queries,
                engine_factory=factory,
                progress=bars,
                connect_timeout=connect_timeout,
            )
            summary: MigrationSummary | None = None
        else:
            summary = run_migration(
                source_value,
                target_value,
                batch_size=batch_size,
                verify_queries=verify_queries,
                engine_factory=factory,
                progress=bars,
                connect_timeout=connect_timeout,
            )
            assert summary.verification is not None
            verification = summary.verification
    except MigrationError as exc:
        raise click.ClickException(redact(str(exc), secrets)) from None
    except ValueError as exc:  # a URL that does not parse (a bad %-escape, a bad port)
        raise click.ClickException(redact(f"invalid database URL: {exc}", secrets)) from None
    finally:
        bars.finish()
    if as_json:
        body = summary.as_dict() if summary is not None else verification.as_dict()
        click.echo(json.dumps(body, indent=2))
    elif summary is not None:
        click.echo("\n".join(_summary_lines(summary)))
    else:
        click.echo("\n".join(_verification_lines(verification)))
    if not verification.ok:
        raise click.ClickException(
            "verification failed: "
            + "; ".join(verification.problems())
            + f" (the copy must match counts and reach {verification.min_top1} top-1 agreement)"
        )
