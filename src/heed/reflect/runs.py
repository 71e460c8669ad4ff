"""Streamed reflects, built as runs of kind ``"reflect"`` on :mod:`heed.runs`.

``POST .../reflect`` with ``stream: true`` submits a run whose payload is the validated
request; the run manager starts it at once (reflect runs are not exclusive: a bank's
reflects run side by side, bounded by the reflect lane, whose slot the worker holds). The
executor runs the agent loop with a listener that writes every step to the run's journal
(:mod:`heed.runs.events`: ``tool_call``, ``tool_result``, ``text_delta``, ``message``),
and returns the response object (:func:`heed.reflect.result.reflect_result`), which the
``completed`` event carries. So a streamed reflect has what every run has: a registry row
(``GET /v1/runs/{id}``), a resumable journal (``GET /v1/runs/{id}/stream`` with
``Last-Event-ID``), cancel by id, a lease the reaper watches, and restart recovery (a
reflect running when its process died ends ``interrupted``).

Runs are grouped per bank (``session_id = "bank:<ref>"``, like async retains); deleting
the bank cancels its unfinished reflect runs and waits until they stopped. A run whose
bank was deleted (or deleted and re-created) before it started ends ``cancelled`` with
reason ``bank deleted``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Final

from heed.memory.bank_runs import bank_payload, bank_session, cancel_on_delete, run_bank
from heed.memory.models import Bank
from heed.reflect.agent import ReflectRequest
from heed.reflect.result import ResultShape, reflect_result
from heed.reflect.service import ReflectService
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunManager
from heed.runs.model import Run

__all__ = ["REFLECT_KIND", "ReflectRuns"]

REFLECT_KIND: Final = "reflect"


class ReflectRuns:
    """Submit streamed reflects as runs and execute them (see the module docstring)."""

    def __init__(self, manager: RunManager, service: ReflectService) -> None:
        self.manager = manager
        self.service = service
        cancel_on_delete(service.engine, manager, REFLECT_KIND)

    def kind_spec(self) -> KindSpec:
        """How ``reflect`` runs execute: register it as :data:`REFLECT_KIND`."""
        return KindSpec(execute=self._execute, lane="reflect")

    async def submit(self, bank: Bank, request: ReflectRequest, shape: ResultShape) -> Run:
        """Queue (and, lanes permitting, start) a reflect of *bank*; returns its run.

        Raises the provider's error (400) when the reflect provider cannot be built, before
        anything is written (:meth:`ReflectService.check_provider`), and
        :class:`~heed.errors.HeedError` 503 while the server shuts down.
        """
        self.service.check_provider()
        run = await self.manager.submit(
            REFLECT_KIND,
            tenant=bank.tenant,
            session_id=bank_session(bank),
            payload={
                **bank_payload(bank),
                "request": asdict(request),
                "shape": asdict(shape),
            },
            summary={"bank_id": bank.bank_id},
        )
        assert run is not None  # only strategy "idle" or an aborted admission return None
        return run

    async def _execute(self, rc: RunContext) -> dict[str, Any]:
        payload = rc.payload
        bank = await run_bank(self.service.engine, rc)

        async def to_journal(event: EventType, data: dict[str, Any]) -> None:
            await rc.emit(event, data)

        agent = self.service.agent()
        outcome = await agent.run_in_held_slot(
            bank, ReflectRequest(**payload["request"]), to_journal
        )
        return reflect_result(outcome, ResultShape(**payload["shape"]))
