"""How bank transfers run: an export, an import (or a merge) and a clone are each a run,
cancellable while it processes, with progress (what is asked and checked before a run is
submitted is :mod:`heed.transfer.service`'s).

**Runs.** Three kinds, each in the bank's run group (``bank:<ref>``, so they are the bank's
operations: listed, read and cancelled with its retains and consolidations):

- ``bank_export`` (:data:`EXPORT_KIND`): reads the bank from one snapshot
  (:meth:`heed.transfer.store.TransferStore.read_bank`) into an archive
  (:mod:`heed.transfer.archive`) in a temporary file, then stores it
  (:mod:`heed.transfer.store`) until it expires; the run's result carries
  ``download_url`` (``/v1/default/files/download/<key>``), ``storage_key``, ``byte_size``
  and ``filename``, as hindsight-client expects. See **Stored exports** for the quota and
  the reuse of an unchanged bank's last export.
- ``bank_import`` (:data:`IMPORT_KIND`): the uploaded archive was checked whole before the
  run was submitted (:func:`heed.transfer.check.check_archive`: a bad archive is a 400 and
  nothing is stored or written) and stored; the run writes it into a **staging bank**, then
  publishes it under its id.
- ``bank_clone`` (:data:`CLONE_KIND`): an export into a temporary file (entries stored,
  not deflated) and an import from it, in one run; no archive is kept.
- a **merge** (``bank_import`` with ``mode=merge``) folds an archive's documents into the
  bank of the request instead: each document is written as a retain writes one
  (:meth:`MemoryEngine.write_prepared`: one transaction, its entities resolved against the
  bank's by name, its links made by the retain rule, consolidation marked as a retain
  marks it), under new memory ids; a document whose id the bank holds is skipped,
  replaced, or kept beside it under a new id (``document_conflict``). A cancel stops
  between documents or rolls the current one back: every document is in the bank whole or
  not at all, and the result counts what was merged. Observations, the bank's settings,
  directives, webhooks and mental models are not merged.

**No half bank.** An import or a clone writes into a staging bank: a bank of the hidden
tenant :data:`STAGING_TENANT` (a comma: no tenant of ``HEED_API_KEYS`` has one), named by
the run id, with no configuration (so nothing, consolidation included, touches it). Its
writes are transactions of one document, or of a batch of observations, entities, entity
rows or links. When everything is written, one statement gives it its real tenant, id,
profile and configuration (:meth:`~heed.transfer.store.TransferStore.publish_bank`): the bank
appears whole or not at all. A failure or a cancel leaves the staging bank, which is deleted
right after the run ended (in the background: the cancel does not wait for a large delete),
and at start-up and before each import any staging bank whose run is over is deleted too (a
process that died mid-import). Ids are never reused: the import maps every memory, chunk
and entity id of the archive to a new one derived from the new bank (UUID 5), provenance
(``source_ids``) included, so the same archive imports twice, or into the server it came
from, beside its source. Document ids are the bank's and are kept.

**Nothing re-embedded.** Vectors travel in the archive; an import writes them as they are.
So an archive imports only where the embedder is the one that made them: the same model
name and vector size, else the import is refused (400, naming both).

**Cancel and bank delete.** Every run's token is checked between pages (a page is at most
:attr:`TransferLimits.batch` rows) and a running statement stops when it is cancelled
(:meth:`~heed.storage.database.SqlDatabase.cancellable`); the work runs in the offload
holding a retain slot as background work (:mod:`heed.runtime.slots`). Deleting the bank an
operation belongs to cancels it (``before_delete``) and waits until it stopped; an export
or clone also registers as its source bank's work (:meth:`MemoryEngine.track`), and an
import or clone as the work of the bank it is writing (the staging bank, which keeps its
ref when published: deleting the new bank while the run ends cancels it too).

**Stored exports.** A tenant's stored export archives are bounded by
:class:`~heed.transfer.store.ExportQuota` (``HEED_EXPORT_TENANT_MAX_COUNT`` archives,
``HEED_EXPORT_TENANT_MAX_BYTES`` bytes; expired ones do not count and are deleted before each
export is stored). An export of a bank whose records are those of an export of the same bank
with the same parameters the tenant still has stored is not stored again: the run returns
that archive (``reused: true``), kept for another ``archive_ttl``. "The same records" is
decided by what is truthful rather than by a marker some write could forget to move: the
export digests every record it writes (:class:`~heed.transfer.archive.ArchiveWriter`'s
*content*, the manifest's time left out) with its parameters, and the archive is reused when
the digests are equal. A reused export costs the bank's read, never its storage. Past the
quota, the submit is refused with :class:`ExportQuotaExceeded` (429, ``Retry-After`` until the
oldest stored export expires), unless the bank has a stored export with the same parameters
(it may be reusable); the run checks again when it stores the archive (under a per-tenant
lock, so concurrent exports cannot pass it together), and fails with the same 429 then.

**Memory.** A page of rows, one archive record, the current document's chunks and the ids
of the archive's memories and entities (the check), whatever the bank's size; an archive
lives in a temporary file, not in memory (an upload is the request body, which the server's
body limit bounds).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import IO, Any, ClassVar, Final, Literal

from heed.memory.bank_runs import TRANSFER_KINDS, BankRunService, run_bank
from heed.memory.engine import BANK_DELETED
from heed.memory.models import Bank, Conflict, NotFound, PreparedDocument
from heed.memory.store import BankGone, BankTaken
from heed.runs.events import EventType
from heed.runs.kinds import KindSpec, RunContext
from heed.runs.manager import RunNotFound
from heed.runs.model import Run
from heed.runs.state import is_terminal
from heed.runtime import (
    OperationCancelled,
    detached,
    reraise_cancellation,
    run_in_thread,
    use_context,
)
from heed.transfer.ids import NewIds
from heed.transfer.limits import ExportQuotaExceeded, TransferLimits, export_key
from heed.transfer.rows import BankSelection
from heed.transfer.sections.base import Flags, TransferStores
from heed.transfer.store import (
    ArchiveStore,
    ExportQuotaFull,
    StoredArchive,
    TransferStore,
    file_parts,
)
from heed.transfer.work import import_archive, merge_archive, write_archive
from heed.webhooks.service import Webhooks

__all__ = [
    "CLONE_KIND",
    "DOWNLOAD_PREFIX",
    "EXPORT_KIND",
    "IMPORT_KIND",
    "STAGING_TENANT",
    "TRANSFER_KINDS",
    "TransferRuns",
]

#: The kinds of run a bank transfer is (a bank's operations: :data:`OPERATION_KINDS`).
EXPORT_KIND, IMPORT_KIND, CLONE_KIND = TRANSFER_KINDS
#: The tenant of staging banks (see the module docstring).
STAGING_TENANT: Final = ",transfer-staging"
#: Where an export's archive is downloaded: this plus its key.
DOWNLOAD_PREFIX: Final = "/v1/default/files/download/"
#: Memories deleted per transaction when a staging bank is discarded.
DISCARD_BATCH: Final = 256

log = logging.getLogger("heed.transfer.service")


class _Progress:
    """Progress events of a run, sent from its worker thread (at most every 0.2 s)."""

    def __init__(self, rc: RunContext, loop: asyncio.AbstractEventLoop, stage: str) -> None:
        self.rc = rc
        self.loop = loop
        self.stage = stage
        self.total = 0
        self.done = 0
        self._last = 0.0
        self._sent: list[Future[Any]] = []

    def start(self, stage: str, total: int) -> None:
        self.stage, self.total, self.done = stage, total, 0
        self._send()

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self._last >= 0.2:
            self._send()

    def _send(self) -> None:
        self._last = time.monotonic()
        data = {"processed": self.done, "total": max(self.total, self.done), "stage": self.stage}
        self._sent.append(
            asyncio.run_coroutine_threadsafe(self.rc.emit(EventType.PROGRESS, data), self.loop)
        )

    async def drain(self) -> None:
        """Wait for the events sent (errors are logged). Not once the run is cancelled: its
        journal is closed and drops them, and the run ends without waiting for the
        database (where a staging bank's delete may hold SQLite's writer)."""
        if self.rc.token.cancelled:
            return
        results = await asyncio.gather(
            *(asyncio.wrap_future(f) for f in self._sent), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, OperationCancelled):
                log.warning("a transfer's progress event was lost: %s", result)


@dataclass(eq=False)
class TransferRuns(BankRunService):
    """Runs bank transfers (see the module docstring): the kinds' ``execute``, the
    staging banks' cleanup, and the cancel of a bank's transfers before it is deleted."""

    KINDS: ClassVar[tuple[str, ...]] = TRANSFER_KINDS

    archives: ArchiveStore
    stores: TransferStores
    model: str
    limits: TransferLimits
    _discarding: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    @property
    def rows(self) -> TransferStore:
        """The bank rows' store (:attr:`TransferStores.rows`)."""
        return self.stores.rows

    @property
    def webhooks(self) -> Webhooks | None:
        """The webhooks' service (:attr:`TransferStores.webhooks`; ``None``: not carried)."""
        return self.stores.webhooks

    def kind_specs(self) -> dict[str, KindSpec]:
        """How transfer runs execute: register each under its kind."""
        return {
            EXPORT_KIND: KindSpec(execute=self._execute_export),
            IMPORT_KIND: KindSpec(execute=self._execute_import, on_terminal=self._drop_upload),
            CLONE_KIND: KindSpec(execute=self._execute_clone),
        }

    def archive_row(
        self, bank: Bank, kind: Literal["export", "upload"], name: str
    ) -> StoredArchive:
        """A new archive's row: the bank's, kept for :attr:`TransferLimits.archive_ttl`."""
        now = time.time()
        return StoredArchive(
            id=uuid.uuid4().hex,
            tenant=bank.tenant,
            kind=kind,
            bank_id=bank.bank_id,
            filename=name,
            byte_size=0,
            sha256="",
            created_at=now,
            expires_at=now + self.limits.archive_ttl,
        )

    # -- running ---------------------------------------------------------------------------

    async def _execute_export(self, rc: RunContext) -> dict[str, Any]:
        bank = await run_bank(self.engine, rc)
        payload = rc.payload
        ids = payload.get("document_ids")
        selection = BankSelection(
            document_ids=ids, observations=bool(payload.get("include_observations", True))
        )
        progress = _Progress(rc, asyncio.get_running_loop(), "export")
        try:
            async with self.engine.track(bank), self.engine.retain_lane.slot(background=True):
                stored, counts, reused = await run_in_thread(
                    self._export_blocking, bank, selection, Flags.of(payload), payload, progress
                )
        except NotFound as exc:
            raise OperationCancelled(BANK_DELETED) from exc
        except ExportQuotaFull as exc:
            raise ExportQuotaExceeded(exc.usage, exc.quota, exc.adding) from None
        finally:
            await progress.drain()
        return {
            "download_url": DOWNLOAD_PREFIX + stored.id,
            "storage_key": stored.id,
            "byte_size": stored.byte_size,
            "filename": stored.filename,
            "sha256": stored.sha256,
            "expires_at": datetime.fromtimestamp(stored.expires_at, UTC).isoformat(),
            "reused": reused,
            **counts,
        }

    def _export_blocking(
        self,
        bank: Bank,
        selection: BankSelection,
        flags: Flags,
        payload: dict[str, Any],
        progress: _Progress,
    ) -> tuple[StoredArchive, dict[str, int], bool]:
        """Write the export, then reuse the bank's stored export of the same records and
        parameters (renewed), or store it within the tenant's quota (see the module
        docstring); the archive, the records per section, and whether it was reused."""
        scope = payload["scope"]
        name = f"{bank.bank_id}-{scope}-{datetime.now().strftime('%Y%m%dT%H%M%S')}.zip"
        records = hashlib.sha256()
        with tempfile.TemporaryFile() as tmp:
            counts = write_archive(
                self.stores,
                tmp,
                bank,
                selection,
                flags,
                scope,
                progress,
                model=self.model,
                dim=self.engine.embedder.dim,
                batch=self.limits.batch,
                content=records.update,
            )
            params = export_key(
                {"bank_id": bank.bank_id, **payload}, self.model, self.engine.embedder.dim
            )
            key = f"{params}:{records.hexdigest()}"
            now = time.time()
            self.archives.delete_expired(now)  # expired archives never count
            for earlier in self.archives.bank_exports(bank.tenant, bank.bank_id, now):
                if earlier.reuse_key == key:
                    renewed = self.archives.renew_archive(earlier.id, now + self.limits.archive_ttl)
                    if renewed is not None:
                        return renewed, counts, True
            size = tmp.seek(0, 2)
            tmp.seek(0)
            row = replace(self.archive_row(bank, "export", name), byte_size=size, reuse_key=key)
            try:
                stored = self.archives.put_archive(
                    row, file_parts(tmp), quota=self.limits.export_quota
                )
            except BaseException:
                self.archives.delete_archive(row.id)
                raise
        return stored, counts, False

    async def _execute_import(self, rc: RunContext) -> dict[str, Any]:
        source = await run_bank(self.engine, rc)
        payload = rc.payload
        progress = _Progress(rc, asyncio.get_running_loop(), "import")
        try:
            with tempfile.TemporaryFile() as tmp:
                await run_in_thread(self._fetch, rc.run.tenant, payload["archive_id"], tmp)
                if payload.get("mode") == "merge":
                    counts = await self._merge(rc, source, tmp, progress)
                    return {"bank_id": source.bank_id, "mode": "merge", **counts}
                bank, counts = await self._into_new_bank(rc, tmp, progress)
        finally:
            await progress.drain()
        return {"bank_id": bank.bank_id, **counts}

    async def _merge(
        self, rc: RunContext, bank: Bank, archive: IO[bytes], progress: _Progress
    ) -> dict[str, int]:
        """Fold *archive*'s documents into *bank*, each written whole as a retain writes
        one (see the module docstring), then let consolidation take what it should."""
        engine = self.engine

        def write(document: PreparedDocument) -> None:
            engine.mark_for_consolidation(bank, [document])
            engine.write_prepared(bank.ref, document)

        def held(document_id: str) -> bool:
            return engine.store.get_document(bank.ref, document_id) is not None

        try:
            async with engine.track(bank), engine.retain_lane.slot(background=True):
                counts = await run_in_thread(
                    merge_archive,
                    archive,
                    rc.payload["document_conflict"],
                    NewIds(f"{bank.ref}/{rc.run.id}"),  # a second merge gets other ids
                    progress,
                    limits=self.limits.archive,
                    held=held,
                    write=write,
                    model=self.model,
                    dim=engine.embedder.dim,
                )
        except (NotFound, BankGone) as exc:
            raise OperationCancelled(BANK_DELETED) from exc
        if counts["documents"]:
            for hook in engine.after_retain:
                hook(bank)
        return counts

    def _fetch(self, tenant: str, archive_id: str, target: IO[bytes]) -> None:
        archive = self.archives.get_archive(tenant, archive_id)
        if archive is None:
            raise NotFound("the uploaded archive is gone (expired): upload it again")
        for part in self.archives.archive_parts(archive.id):
            target.write(part)
        target.seek(0)

    async def _execute_clone(self, rc: RunContext) -> dict[str, Any]:
        source = await run_bank(self.engine, rc)
        flags = Flags.of(rc.payload)
        progress = _Progress(rc, asyncio.get_running_loop(), "export")
        try:
            with tempfile.TemporaryFile() as tmp:
                try:
                    async with (
                        self.engine.track(source),
                        self.engine.retain_lane.slot(background=True),
                    ):
                        await run_in_thread(
                            write_archive,
                            self.stores,
                            tmp,
                            source,
                            BankSelection(),
                            flags,
                            "bank",
                            progress,
                            model=self.model,
                            dim=self.engine.embedder.dim,
                            batch=self.limits.batch,
                            compress=False,  # it never leaves the process: no deflating
                        )
                except NotFound as exc:
                    raise OperationCancelled(BANK_DELETED) from exc
                tmp.seek(0)
                bank, counts = await self._into_new_bank(rc, tmp, progress)
        finally:
            await progress.drain()
        return {"bank_id": bank.bank_id, "source_bank_id": source.bank_id, **counts}

    async def _into_new_bank(
        self, rc: RunContext, archive: IO[bytes], progress: _Progress
    ) -> tuple[Bank, dict[str, int]]:
        """Import *archive* into a staging bank and publish it as the run's target bank
        (see the module docstring)."""
        await self.sweep()
        payload = rc.payload
        store = self.engine.store
        staging = Bank(tenant=STAGING_TENANT, bank_id=rc.run.id, ref=str(uuid.uuid4()))
        staging.config = {"enable_observations": False, "retain_extraction_mode": "off"}
        staging = await run_in_thread(store.save_bank, staging)
        target = Bank(tenant=rc.run.tenant, bank_id=payload["target_bank_id"], ref=staging.ref)
        try:
            async with self.engine.track(staging), self.engine.retain_lane.slot(background=True):
                counts = await run_in_thread(
                    import_archive,
                    self.stores,
                    archive,
                    staging,
                    target,
                    Flags.of(payload),
                    progress,
                    limits=self.limits.archive,
                    model=self.model,
                    dim=self.engine.embedder.dim,
                    batch=self.limits.batch,
                )
                try:
                    published = await run_in_thread(self.rows.publish_bank, target)
                except BankTaken as exc:
                    raise Conflict(
                        f"bank {target.bank_id!r} was created while this transfer ran; "
                        "nothing was imported"
                    ) from exc
        except BaseException:
            self._discard_later(staging.ref)
            raise
        for hook in self.engine.after_retain:  # e.g. consolidation of pending memories
            hook(published)
        return published, counts

    # -- cleaning up -----------------------------------------------------------------------

    def _drop_upload(self, run: Run) -> None:
        """``on_terminal`` of an import: its uploaded archive is no longer needed."""
        archive_id = run.summary.get("archive_id")
        if archive_id:
            self.archives.delete_archive(str(archive_id))

    def _discard_later(self, staging_ref: str) -> None:
        """Delete a staging bank in the background (the run ends without waiting)."""
        task = asyncio.get_running_loop().create_task(self._discard(staging_ref))
        self._discarding.add(task)
        task.add_done_callback(self._discarding.discard)

    async def _discard(self, staging_ref: str) -> None:
        with use_context(detached()):
            try:
                await run_in_thread(self._delete_staging, staging_ref)
            except Exception as exc:
                reraise_cancellation(exc)
                log.warning("could not delete staging bank %s: %s", staging_ref, exc, exc_info=exc)

    async def sweep(self) -> int:
        """Delete the staging banks whose run is over (or unknown) and the expired
        archives: at start-up and before each import. How many banks were deleted."""
        with use_context(detached()):
            await run_in_thread(self.archives.delete_expired, time.time())
            banks, _ = await run_in_thread(self.engine.store.list_banks, STAGING_TENANT, 1000, 0)
            deleted = 0
            for bank, _units in banks:
                try:
                    run = await self.manager.get(bank.bank_id)
                except RunNotFound:
                    run = None
                if run is None or is_terminal(run):
                    await run_in_thread(self._delete_staging, bank.ref)
                    deleted += 1
        return deleted

    def _delete_staging(self, staging_ref: str) -> None:
        """Delete a staging bank and the webhooks staged for it. Blocking."""
        if self.webhooks is not None:
            self.webhooks.discard_carried(staging_ref)
        self.rows.delete_bank_in_batches(staging_ref, DISCARD_BATCH)

    async def aclose(self) -> None:
        """Wait for the staging banks being deleted."""
        if self._discarding:
            await asyncio.gather(*self._discarding, return_exceptions=True)
