"""What ``heed migrate`` reports: the summary of a copy, the checks, and progress.

Plain dataclasses the command prints (as a table or as JSON) and the tests read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final, Protocol

__all__ = [
    "MIN_TOP1_AGREEMENT",
    "BankRecall",
    "CountCheck",
    "MigrationError",
    "MigrationSummary",
    "NoProgress",
    "Progress",
    "Verification",
]

#: The least share of recall queries whose top hit must be the same unit on both sides.
MIN_TOP1_AGREEMENT: Final = 0.9


class MigrationError(RuntimeError):
    """The migration cannot proceed; the message names the problem for the user."""


class Progress(Protocol):
    """Where :func:`migrate` and :func:`verify` report progress (a CLI progress bar)."""

    def start(self, phase: str, total: int) -> None:
        """A phase (``"copy"``, ``"verify"``) of *total* steps (rows, queries) begins."""
        ...

    def advance(self, label: str, steps: int) -> None:
        """*steps* more are done; *label* names what is being worked on (a table)."""
        ...

    def finish(self) -> None:
        """The current phase is over."""
        ...


class NoProgress:
    """Progress reported nowhere."""

    def start(self, phase: str, total: int) -> None:
        pass

    def advance(self, label: str, steps: int) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass(slots=True)
class CountCheck:
    """One table's row count in one scope (a bank, or ``"all"``), source against target."""

    scope: str
    table: str
    source: int
    target: int

    @property
    def ok(self) -> bool:
        return self.source == self.target


@dataclass(slots=True)
class BankRecall:
    """The recall comparison of one bank."""

    tenant: str
    bank_id: str
    queries: int
    top1_same: int
    top10_overlap_sum: float
    #: Ids of the query units whose top hit differed (at most 10 listed).
    differing: list[str] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float:
        return self.top1_same / self.queries if self.queries else 1.0

    @property
    def mean_top10_overlap(self) -> float:
        return self.top10_overlap_sum / self.queries if self.queries else 1.0


@dataclass(slots=True)
class Verification:
    """Counts and the recall comparison (see the module docstring)."""

    counts: list[CountCheck]
    recall: list[BankRecall]
    min_top1: float = MIN_TOP1_AGREEMENT

    @property
    def mismatches(self) -> list[CountCheck]:
        return [c for c in self.counts if not c.ok]

    @property
    def queries(self) -> int:
        return sum(b.queries for b in self.recall)

    @property
    def top1_agreement(self) -> float:
        n = self.queries
        return sum(b.top1_same for b in self.recall) / n if n else 1.0

    @property
    def mean_top10_overlap(self) -> float:
        n = self.queries
        return sum(b.top10_overlap_sum for b in self.recall) / n if n else 1.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.top1_agreement >= self.min_top1

    def problems(self) -> list[str]:
        """What failed, one line each (empty when :attr:`ok`)."""
        out = [
            f"{c.table} ({c.scope}): {c.source} in the source, {c.target} in the target"
            for c in self.mismatches
        ]
        if self.top1_agreement < self.min_top1:
            out.append(
                f"recall top-1 agreement {self.top1_agreement:.3f} is below {self.min_top1}"
                f" ({self.queries} queries)"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems(),
            "counts_checked": len(self.counts),
            "count_mismatches": [asdict(c) for c in self.mismatches],
            "recall": {
                "queries": self.queries,
                "top1_agreement": round(self.top1_agreement, 4),
                "mean_top10_overlap": round(self.mean_top10_overlap, 4),
                "min_top1_agreement": self.min_top1,
                "banks": [
                    {
                        "tenant": b.tenant,
                        "bank_id": b.bank_id,
                        "queries": b.queries,
                        "top1_agreement": round(b.top1_agreement, 4),
                        "mean_top10_overlap": round(b.mean_top10_overlap, 4),
                        "differing": b.differing,
                    }
                    for b in self.recall
                ],
            },
        }


@dataclass(slots=True)
class MigrationSummary:
    """What a migration did. ``copied``: rows inserted now, per table; ``existing``: source
    rows already in the target (a second run has them all there); ``left_out``: source rows
    not copied on purpose (non-terminal runs and their journal events)."""

    source: str
    target: str
    dim: int
    copied: dict[str, int]
    existing: dict[str, int]
    left_out: dict[str, int]
    seconds: float = 0.0
    verification: Verification | None = None

    @property
    def total_copied(self) -> int:
        return sum(self.copied.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "dim": self.dim,
            "copied": dict(self.copied),
            "total_copied": self.total_copied,
            "existing": dict(self.existing),
            "left_out": dict(self.left_out),
            "seconds": round(self.seconds, 3),
            "verification": self.verification.as_dict() if self.verification else None,
        }
