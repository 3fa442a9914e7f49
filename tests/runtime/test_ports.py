"""course.runtime.ports: a port nothing listens on, found without importing torch."""

import socket
import subprocess
import sys

from course.runtime.ports import free_port


def test_the_port_is_free_to_listen_on():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_importing_it_does_not_import_torch():
    code = "import sys, course.runtime.ports, grader.inrank.launcher; print('torch' in sys.modules)"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "False"
