"""A loopback TCP proxy a test can cut: a real service (PostgreSQL, Redis) made unreachable
and reachable again without stopping it (other tests share it).

:meth:`TcpProxy.cut` stops listening and closes every proxied connection, so the client
sees its connections drop and new ones refused; :meth:`TcpProxy.restore` listens again on
the same port. The target is ``(host, port)`` or a unix socket path.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TcpProxy", "tcp_proxy"]


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to *target* (see the module docstring)."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listen (on a free port the first time, on the same port after a cut)."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        if self._listener is None:
            self.start()

    def _upstream(self) -> socket.socket:
        if isinstance(self.target, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            sock = socket.socket()
        sock.connect(self.target)
        return sock

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = self._upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(sock)
            sock.close()


@contextmanager
def tcp_proxy(target: tuple[str, int] | str) -> Iterator[TcpProxy]:
    """A started :class:`TcpProxy`, cut when the block exits."""
    proxy = TcpProxy(target)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.cut()
