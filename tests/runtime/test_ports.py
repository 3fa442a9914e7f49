"""course.runtime.ports: a port held for a server about to start, found without importing torch."""

import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from course.runtime.ports import reserved_port


def test_a_reserved_port_is_given_to_no_other_socket():
    with reserved_port() as port:
        assert 1024 <= port <= 65535
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # as a client's socket binds (no SO_REUSEADDR)


def test_the_server_it_is_held_for_can_listen_on_it_and_it_is_freed_after():
    with reserved_port() as port:
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False)
        client = dist.TCPStore("127.0.0.1", port, 1, is_master=False)
        store.set("who", "server")
        assert client.get("who") == b"server"
        del client, store
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_importing_it_does_not_import_torch():
    code = "import sys, course.runtime.ports, grader.inrank.launcher; print('torch' in sys.modules)"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "False"
