"""A TCP proxy that counts the bytes a client exchanges with a server (framing, headers and
all): what a request really costs on the wire."""

from __future__ import annotations

import contextlib
import socket
import threading


class ByteCountingProxy:
    """Listens on 127.0.0.1 (a free port) and relays to ``address`` (``host:port``).

    Attributes:
        address: where clients connect (``127.0.0.1:port``).
        sent: bytes clients sent to the server; received: bytes the server sent back.
    """

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.sent = 0
        self.received = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                with self._lock:
                    if upstream:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def snapshot(self) -> tuple[int, int]:
        """(sent, received) so far."""
        with self._lock:
            return self.sent, self.received

    def close(self) -> None:
        self._listener.close()
