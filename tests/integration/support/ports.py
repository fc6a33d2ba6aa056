"""Ports for addresses a test must name before the process that binds them starts.

A port from bind(("127.0.0.1", 0)) is an ephemeral port: the kernel hands the same range to
every outgoing connection and every other bind to port 0, so between our close and the
daemon's bind it can be taken (a daemon then exits 69, "Address already in use"). Ports are
therefore drawn below the ephemeral range, where the kernel never assigns one by itself, and
checked free by binding them. Ports already handed out by this process are not reused."""

import random
import socket

HOST = "127.0.0.1"
_LOWEST = 10000
_handed_out = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port():
    """A loopback TCP port outside the ephemeral range that was free a moment ago."""
    high = _ephemeral_low() - 1
    if high - _LOWEST >= 1000:
        for _ in range(200):
            port = random.randint(_LOWEST, high)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    # An unusual port range: fall back to the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]
