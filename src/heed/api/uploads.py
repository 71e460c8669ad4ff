"""Uploads: a bank archive's bytes counted while they stream, spooled once, freed at the end.

A bank archive's import (``POST .../transfer/import``, ``.../document-transfer``: the
middleware's ``upload_paths``) takes a multipart body of up to ``HEED_MAX_UPLOAD_BYTES``,
far more than any other body, so its bytes go to disk, and the disk is what one tenant
could fill for every tenant. What bounds it:

- **Budgets, counted as the bytes stream** (:class:`SpoolBudget`). The request middleware
  claims an upload's bytes before its body is read (:meth:`SpoolBudget.claim`): a declared
  ``Content-Length`` counts whole from the start, a body without one as it is written. The
  bytes one tenant's uploads hold at once are bounded (``HEED_UPLOAD_SPOOL_TENANT_BYTES``),
  and so are all tenants' (``HEED_UPLOAD_SPOOL_MAX_BYTES``): past either, the upload is
  refused with 429 and ``Retry-After`` naming the setting, before its body is read when its
  length is declared. An upload that would leave the spool directory less free space than
  ``HEED_UPLOAD_MIN_FREE_BYTES`` (counting what the uploads in progress will still write)
  is refused with 507, and so is one whose disk fills up under it meanwhile.
- **The route first, then the body.** The routes check the bank and their parameters
  before they read a byte of the body (:func:`receive_archive`), so an upload to a bank
  that does not exist, or with a bad mode, is answered at once.
- **One copy.** :func:`receive_archive` parses the multipart stream itself with
  python-multipart's streaming parser (the one Starlette's form parser uses) and writes the
  ``file`` part's bytes straight into the claim's one spool file (a temporary file in the
  spool directory, deleted when closed), a MiB at a time in the offload. There is no
  in-memory body and no second copy by a form parser.
- **Freed however the request ends.** The middleware closes the claim when the request is
  over (answered, refused, the client gone mid-upload, cancelled): the file is deleted and
  its bytes are given back to the budgets.

Written by hand: counters on the one event loop and a thin layer of callbacks over
python-multipart; no library bounds spooled bytes per tenant.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from heed.errors import HeedError
from heed.runtime import OperationCancelled, raise_if_cancelled, run_in_thread

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

__all__ = [
    "STATE_KEY",
    "SpoolBudget",
    "SpoolClaim",
    "SpooledArchive",
    "UploadRefused",
    "receive_archive",
    "spool_collector",
]

#: Bytes of the file part gathered before they are written (in the offload).
WRITE_BYTES: Final = 1024 * 1024
#: The spool directory's free space is looked at again after this many bytes are written.
CHECK_FREE_EVERY: Final = 8 * 1024 * 1024
#: Parts one upload may have, and bytes of headers one part may have.
MAX_PARTS: Final = 16
MAX_PART_HEADER_BYTES: Final = 16 * 1024
#: Retry-After of a refusal for the budgets (uploads in progress end) and for disk space.
BUDGET_RETRY_AFTER: Final = 5
DISK_RETRY_AFTER: Final = 30

#: The request state's key of an upload's claim (set by the middleware).
STATE_KEY: Final = "upload_claim"


class UploadRefused(HeedError):
    """An upload refused for the spool's budgets (429), its free disk space (507), its size
    (413), the in-flight bound (503) or its form (400, 415); the message names the setting
    or the problem."""

    def __init__(
        self, message: str, status_code: int, retry_after: int | None = None, reason: str = ""
    ) -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        super().__init__(message, status_code=status_code, headers=headers)
        #: Which bound refused it (``tenant``, ``total``, ``disk``), for the metrics.
        self.reason = reason


def _free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


class SpoolBudget:
    """Upload bytes spooled, per tenant and in all, and the spool directory's free-space
    floor (see the module docstring). Used from one event loop."""

    def __init__(
        self,
        directory: Path | None,
        *,
        tenant_bytes: int,
        total_bytes: int,
        min_free_bytes: int,
        free_bytes: Callable[[Path], int] = _free_bytes,
    ) -> None:
        self.directory = directory if directory is not None else Path(tempfile.gettempdir())
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tenant_bytes = tenant_bytes
        self.total_bytes = total_bytes
        self.min_free_bytes = min_free_bytes
        self._free_bytes = free_bytes
        #: Bytes counted against the budgets (declared or written), in all and per tenant.
        self.claimed = 0
        self._by_tenant: dict[str, int] = {}
        self._claims: set[SpoolClaim] = set()
        #: The most bytes spool files held at once, since start.
        self.peak_written = 0
        self.refused: dict[str, int] = {"tenant": 0, "total": 0, "disk": 0}

    @property
    def written(self) -> int:
        """Bytes the spool files of the uploads in progress hold now."""
        return sum(claim.written for claim in self._claims)

    def claimed_by(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def claim(self, tenant: str, declared: int | None) -> SpoolClaim:
        """A claim for one upload of *tenant*, its *declared* length (if any) counted now.

        Raises :class:`UploadRefused` (429 past a budget, 507 under the free-space floor);
        nothing is counted then."""
        claim = SpoolClaim(self, tenant)
        if declared:
            self._grow(claim, declared)
        self._claims.add(claim)
        return claim

    def _grow(self, claim: SpoolClaim, more: int) -> None:
        mine = self._by_tenant.get(claim.tenant, 0)
        if mine + more > self.tenant_bytes:
            self._refuse(
                "tenant",
                f"this tenant's uploads in progress hold {mine} bytes; {more} more would pass "
                f"the {self.tenant_bytes} one tenant may have spooled at once "
                "(HEED_UPLOAD_SPOOL_TENANT_BYTES); retry when one of them has ended",
                429,
                BUDGET_RETRY_AFTER,
            )
        if self.claimed + more > self.total_bytes:
            self._refuse(
                "total",
                f"the server's uploads in progress hold {self.claimed} bytes; {more} more "
                f"would pass the {self.total_bytes} all tenants may have spooled at once "
                "(HEED_UPLOAD_SPOOL_MAX_BYTES); retry later",
                429,
                BUDGET_RETRY_AFTER,
            )
        self._check_free(more)
        self._by_tenant[claim.tenant] = mine + more
        self.claimed += more
        claim.counted += more

    def _check_free(self, more: int) -> None:
        """Refuse (507) when the spool directory's free space, less what the uploads in
        progress will still write and *more*, is under the floor."""
        unwritten = sum(max(0, c.counted - c.written) for c in self._claims)
        left = self._free_bytes(self.directory) - unwritten - more
        if left < self.min_free_bytes:
            self._refuse(
                "disk",
                f"not enough disk space for this upload: the upload directory would keep "
                f"less than the {self.min_free_bytes} bytes free the server keeps "
                "(HEED_UPLOAD_MIN_FREE_BYTES)",
                507,
                DISK_RETRY_AFTER,
            )

    def _refuse(self, reason: str, message: str, status: int, retry_after: int) -> None:
        self.refused[reason] += 1
        raise UploadRefused(message, status, retry_after, reason)

    def _written(self, claim: SpoolClaim, n: int) -> None:
        claim.written += n
        self.peak_written = max(self.peak_written, self.written)

    def _release(self, claim: SpoolClaim) -> None:
        if claim not in self._claims:
            return
        self._claims.discard(claim)
        self.claimed -= claim.counted
        left = self._by_tenant.get(claim.tenant, 0) - claim.counted
        if left > 0:
            self._by_tenant[claim.tenant] = left
        else:
            self._by_tenant.pop(claim.tenant, None)
        claim.counted = 0


class SpoolClaim:
    """One upload's share of a :class:`SpoolBudget` and its one spool file; :meth:`close`
    it (once or more) when the request ends."""

    def __init__(self, budget: SpoolBudget, tenant: str) -> None:
        self._budget = budget
        self.tenant = tenant
        #: Bytes counted against the budgets.
        self.counted = 0
        #: Bytes written to the spool file.
        self.written = 0
        self._checked_at = 0
        self._file: IO[bytes] | None = None
        self.closed = False

    def reserve(self, n: int) -> None:
        """Count *n* bytes about to be written (beyond what was declared) and look at the
        free space now and then; :class:`UploadRefused` when a bound refuses them."""
        if self.closed:
            raise OperationCancelled("the upload's request has ended")
        more = self.written + n - self.counted
        if more > 0:
            self._budget._grow(self, more)
        elif self.written + n - self._checked_at >= CHECK_FREE_EVERY:
            self._checked_at = self.written + n
            self._budget._check_free(0)

    def write(self, data: bytes) -> None:
        """Append *data* (reserved first) to the spool file. Blocking: call it in the
        offload; count it with :meth:`wrote` on the loop."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._budget.directory)  # noqa: SIM115
        self._file.write(data)

    def wrote(self, n: int) -> None:
        self._budget._written(self, n)

    def file(self) -> IO[bytes]:
        """The spool file, at its start (an empty one if nothing was written)."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._budget.directory)  # noqa: SIM115
        self._file.flush()
        self._file.seek(0)
        return self._file

    def close(self) -> None:
        """Delete the spool file and give its bytes back; idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._file is not None:
                self._file.close()
        finally:
            self._budget._release(self)


@dataclass(frozen=True, slots=True)
class SpooledArchive:
    """The uploaded archive: its spool file (at its start) and the name the client gave."""

    file: IO[bytes]
    filename: str | None
    size: int


class _Parts:
    """The multipart parser's callbacks: finds the *field* part, gathers its bytes."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.parts = 0
        self.found = False
        self.filename: str | None = None
        self.pending = bytearray()
        self._in_field = False
        self._header_bytes = 0
        self._name = bytearray()
        self._value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self.problem: str | None = None

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _refuse(self, problem: str) -> None:
        raise UploadRefused(problem, 400)

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            self._refuse(f"the upload has more than {MAX_PARTS} parts; send the archive alone")
        self._headers, self._header_bytes, self._in_field = {}, 0, False

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            self._refuse(f"a part's headers pass {MAX_PART_HEADER_BYTES} bytes")

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._name).lower()] = bytes(self._value)
        self._name.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        if options.get(b"name", b"").decode("latin-1") != self.field:
            return  # another part: its bytes are read past, not kept
        if self.found:
            self._refuse(f"the upload has more than one {self.field!r} part")
        self.found = self._in_field = True
        filename = options.get(b"filename")
        self.filename = filename.decode("utf-8", "replace")[:255] if filename else None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_field:
            self.pending += data[start:end]

    def _part_end(self) -> None:
        self._in_field = False


def _boundary(request: Request, field: str) -> bytes:
    media_type, options = parse_options_header(request.headers.get("content-type"))
    if media_type != b"multipart/form-data":
        raise UploadRefused(
            f"send the archive as multipart/form-data, its bytes in a part named {field!r}",
            415,
        )
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > 200:
        raise UploadRefused("the multipart Content-Type has no usable boundary", 400)
    return boundary


async def receive_archive(request: Request, field: str = "file") -> SpooledArchive:
    """Read the request's multipart body, writing its *field* part into the upload's one
    spool file (see the module docstring); the spooled archive, at its start.

    Call it after every cheap check of the request (the bank, the parameters). Raises
    :class:`UploadRefused` (a budget: 429; disk space: 507; a body without the part, or not
    multipart: 400/415), :class:`OperationCancelled` when the client leaves mid-upload. The
    spool file belongs to the request: the middleware deletes it when the request ends."""
    boundary = _boundary(request, field)
    claim: SpoolClaim | None = getattr(request.state, STATE_KEY, None)
    if claim is None:  # the middleware claims every multipart body to an upload path
        raise RuntimeError(f"{request.url.path} is not an upload path of the middleware")
    parts = _Parts(field)
    parser = MultipartParser(boundary, parts.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            if len(parts.pending) >= WRITE_BYTES:
                await _spool(claim, parts)
        parser.finalize()
    except MultipartParseError as exc:
        raise UploadRefused(f"the multipart body does not parse: {exc}", 400) from None
    except ClientDisconnect:
        raise_if_cancelled()  # the middleware cancelled the token with its reason
        raise OperationCancelled("client disconnected") from None
    await _spool(claim, parts)
    if not parts.found:
        raise UploadRefused(f"the upload has no {field!r} part: send the archive as it", 400)
    return SpooledArchive(claim.file(), parts.filename, claim.written)


async def _spool(claim: SpoolClaim, parts: _Parts) -> None:
    if not parts.pending:
        return
    data = bytes(parts.pending)
    parts.pending.clear()
    claim.reserve(len(data))
    await run_in_thread(claim.write, data)  # a page-cache write, off the loop all the same
    claim.wrote(len(data))


def spool_collector(budget: SpoolBudget) -> Collector:
    """The spool's figures for /metrics, read at scrape time."""

    class _Spool(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
            yield GaugeMetricFamily(
                "heed_upload_spool_claimed_bytes",
                "Upload bytes counted against HEED_UPLOAD_SPOOL_* now (declared or written)",
                value=budget.claimed,
            )
            yield GaugeMetricFamily(
                "heed_upload_spool_written_bytes",
                "Bytes the spool files of the uploads in progress hold now",
                value=budget.written,
            )
            yield GaugeMetricFamily(
                "heed_upload_spool_peak_bytes",
                "The most bytes the spool files held at once since the server started",
                value=budget.peak_written,
            )
            refused = CounterMetricFamily(
                "heed_upload_spool_refusals",
                "Uploads refused by a spool bound: tenant (429), total (429), disk (507)",
                labels=["bound"],
            )
            for reason, count in budget.refused.items():
                refused.add_metric([reason], count)
            yield refused

    return _Spool()
