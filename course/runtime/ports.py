"""A TCP port held for a server about to start (standard library only: the grader's launcher, which must start
fast, imports it without torch)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A TCP port on localhost, held for a server this process starts inside the ``with`` block.

    A port merely found free can be taken by another job on the machine before the server binds it; the server
    then fails with EADDRINUSE. So the port stays bound here, without listening, until the block ends. The system
    gives it to no other socket meanwhile. A server that binds it with ``SO_REUSEADDR`` still can: torch's
    TCPStore (torchrun's rendezvous) and Jupyter's server both do.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
