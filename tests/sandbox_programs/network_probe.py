"""Connects to TEST-NET-1 (192.0.2.1, reserved: nothing answers) with a 1 s timeout, then over loopback.

Prints ``outside: <outcome>`` and ``loopback: <outcome>``; never sends anything beyond one SYN attempt.
"""
import socket


def connect(address: tuple[str, int]) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(address)
        except OSError as e:  # TimeoutError is an OSError too
            return type(e).__name__
        return "connected"


with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    print("loopback:", connect(server.getsockname()))
print("outside:", connect(("192.0.2.1", 9)))
