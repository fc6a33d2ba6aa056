"""The front door: what the HTTP core does with requests that are incomplete, ambiguous,
malformed, oversized or hostile, before any of it reaches an engine.

The contract (the HTTP core must show exactly this):

* A request whose body did not fully arrive is never executed: the body cut short by the
  client is 400 bad_request, a body that stalls past server.timeout is 408 request_timeout;
  the engine hears nothing of it.
* Ambiguous framing (Content-Length with Transfer-Encoding, duplicate or invalid lengths,
  invalid chunk sizes, chunk data longer than declared) is 400 bad_request and ends the
  connection, so nothing hidden in a body is ever read as a second request. A transfer coding
  other than chunked is 501 not_implemented; chunked not last is 400.
* Routing, methods and authentication are decided from the header, before the body: a 404,
  405, 401 or 413 does not wait for (or buffer) the body, slow unauthenticated uploads hold
  no worker, and `Expect: 100-continue` gets the final status instead of 100 when the request
  is refused anyway (an unknown expectation: 417).
* A second daemon on a port already in use exits with 69 instead of sharing it.
* The systemd watchdog proves the HTTP event loop answers, whatever the access policy, and
  stops when that loop (the `vllmd-http` thread) hangs.
* Access-log lines start with the client address and escape every byte a terminal or a log
  parser could misread (outside 0x21..0x7e, and backslash and double quote, as \\xNN).
* Every error, including those from the connection layer, is the OpenAI JSON shape; errors
  that end the connection say `Connection: close` and the server closes after them.

Raw sockets on 127.0.0.1 for everything malformed; `requests` for normal calls. Every process
a test starts is killed by pid when it ends, and every socket it opens is closed.
"""

import ctypes
import errno
import json
import os
import re
import select
import socket
import subprocess
import threading
import time
import unittest

import requests
from requests.structures import CaseInsensitiveDict

import harness

DEFAULT = {"weight_version": "default"}
AUTH = {"Authorization": "Bearer secret"}

# ---------------------------------------------------------------------------------------------
# Raw HTTP helpers


class RawResponse:
    """One response read off a raw socket, shaped like requests' Response (status_code,
    headers, text, json()) so that DaemonTestCase.assert_error can check it."""

    def __init__(self, status_line, status_code, headers, content, elapsed):
        self.status_line = status_line
        self.status_code = status_code
        self.headers = headers
        self.content = content
        self.elapsed = elapsed  # seconds from the read's start to the complete response

    @property
    def text(self):
        return self.content.decode("utf-8", "replace")

    def json(self):
        try:
            return json.loads(self.content)
        except ValueError:
            raise AssertionError(f"not a JSON body: {self.status_line!r} {self.content[:300]!r}")

    def __repr__(self):
        return f"<{self.status_line!r} {dict(self.headers)} {self.content[:200]!r}>"


class RawConnection:
    """A client connection that sends exact bytes and reads responses as they arrive.

    Reads raise AssertionError (a test failure, not an error) when the server stays silent
    or closes without answering: silence is one of the defects these tests look for."""

    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection((harness.HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, data):
        self.sock.sendall(data)

    def half_close(self):
        """No more bytes from the client (FIN), while it still reads."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self):
        self.sock.close()

    def _fill(self, deadline, what, eof_ok=False):
        """Receives more bytes; False at the server's close if `eof_ok`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {what} in time; received so far: {self.buffer[:300]!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"timed out waiting for {what}; received so far: "
                                 f"{self.buffer[:300]!r}") from None
        except ConnectionResetError:
            raise AssertionError(f"connection reset while waiting for {what}; received so "
                                 f"far: {self.buffer[:300]!r}") from None
        if not chunk:
            if eof_ok:
                return False
            raise AssertionError(f"the server closed the connection without {what}; "
                                 f"received: {self.buffer[:300]!r}")
        self.buffer += chunk
        return True

    def read_response(self, timeout=5.0):
        """The next response (a 1xx interim response counts as one), whole."""
        started = time.monotonic()
        deadline = started + timeout
        while b"\r\n\r\n" not in self.buffer:
            self._fill(deadline, "a response")
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise AssertionError(f"not an HTTP status line: {status_line!r}")
        status = int(parts[1])
        headers = CaseInsensitiveDict()
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
        if 100 <= status < 200 or status in (204, 304):
            body = b""
        elif "Content-Length" in headers:
            length = int(headers["Content-Length"])
            while len(self.buffer) < length:
                self._fill(deadline, f"the rest of a {status} response's body")
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        else:  # delimited by the close
            while self._fill(deadline, "the end of a close-delimited body", eof_ok=True):
                pass
            body, self.buffer = self.buffer, b""
        return RawResponse(status_line, status, headers, body, time.monotonic() - started)

    def read_until_closed(self, timeout=2.0):
        """(closed, extra): whether the server closed the connection within `timeout`, and
        any bytes that arrived first (a second response would show up here)."""
        deadline = time.monotonic() + timeout
        extra, self.buffer = self.buffer, b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, extra
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False, extra
            except ConnectionResetError:
                return True, extra
            if not chunk:
                return True, extra
            extra += chunk


def request(method, target, headers=(), body=b"", version="HTTP/1.1", host=True):
    """Request bytes exactly as given: header lines in order, nothing added but Host."""
    lines = [f"{method} {target} {version}".encode("latin-1")]
    if host:
        lines.append(b"Host: x")
    lines += [line.encode("latin-1") if isinstance(line, str) else line for line in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def vm_hwm_kib(pid):
    """Peak resident set size of a process so far (VmHWM, KiB)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def threads(pid):
    """{tid: name} of a process's threads (pthread names, /proc/PID/task/TID/comm)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                found[int(tid)] = f.read().rstrip("\n")
        except FileNotFoundError:
            pass  # the thread just ended
    return found


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000


def ptrace(operation, tid):
    if _libc.ptrace(operation, tid, None, None) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"ptrace({operation:#x}, {tid}): {os.strerror(number)}")


class FrozenThread:
    """One thread of another process stopped with ptrace (the rest of it runs on)."""

    def __init__(self, tid):
        self.tid = tid
        ptrace(PTRACE_SEIZE, tid)  # attached, still running
        self.attached = True
        try:
            ptrace(PTRACE_INTERRUPT, tid)
            _, status = os.waitpid(tid, WALL)
            if not os.WIFSTOPPED(status):
                raise AssertionError(f"thread {tid} did not stop: status {status:#x}")
        except BaseException:
            self.thaw()
            raise

    def thaw(self):
        """Detaches (the thread runs on); a thread that is gone already is fine."""
        if not self.attached:
            return
        self.attached = False
        try:
            ptrace(PTRACE_DETACH, self.tid)
        except OSError as error:
            if error.errno != errno.ESRCH:
                raise


# ---------------------------------------------------------------------------------------------
# The requests the attacks send (also the seeds in tests/fuzz/fuzz_http_parser_corpus/)

# A finish body of exactly 40 bytes (trailing blanks are JSON whitespace).
FINISH_BODY = b'{"weight_version":"step-42"}'.ljust(40)
SMUGGLED_BODY = b'{"new_version":"smuggled"}'
SMUGGLED = request("POST", "/update_weight_version",
                   ["Content-Type: application/json",
                    f"Content-Length: {len(SMUGGLED_BODY)}"], SMUGGLED_BODY)
CHUNKED = "Transfer-Encoding: chunked"


def finish_with_length(sent):
    """POST /finish_weight_update declaring 40 body bytes, with only `sent` of them."""
    return request("POST", "/finish_weight_update",
                   ["Content-Type: application/json", f"Content-Length: {len(FINISH_BODY)}"],
                   FINISH_BODY[:sent])


def finish_chunked(chunks):
    return request("POST", "/finish_weight_update", ["Content-Type: application/json", CHUNKED],
                   chunks)


# Chunked finish bodies that never reach their last chunk.
INCOMPLETE_CHUNKED = {
    "no_last_chunk": b'5\r\n{"wei\r\n',        # a whole chunk, then nothing
    "chunk_data_cut": b'1c\r\n{"weight_ver',   # 0x1c bytes declared, 12 sent
    "no_chunk_at_all": b"",                     # the header only
}

# Chunk-size lines that are not a chunk size (RFC 9112 7.1: 1*HEXDIG, no sign, no prefix),
# or one that overflows any integer.
BAD_CHUNK_SIZES = {
    "zz": b"zz",
    "negative": b"-5",
    "0x5": b"0x5",
    "overflow": b"f" * 18,
}


def bad_chunk_size(size):
    return finish_chunked(size + b'\r\n{"weight_version":"step-42"}\r\n0\r\n\r\n')


def smuggle(framing, body):
    """POST /start_weight_update with `framing` headers and `body`, which hides (or is
    followed by) SMUGGLED."""
    return request("POST", "/start_weight_update", framing, body)


LAST_CHUNK_THEN_SMUGGLED = b"0\r\n\r\n" + SMUGGLED
# SMUGGLED as the data of one chunk: chunked framing says one request; a Content-Length of
# just the chunk-size line says the chunk data is the next request.
SMUGGLED_SIZE_LINE = b"%x\r\n" % len(SMUGGLED)
SMUGGLED_AS_CHUNK = SMUGGLED_SIZE_LINE + SMUGGLED + b"\r\n0\r\n\r\n"

SMUGGLING = {
    "cl_te": smuggle([f"Content-Length: {len(SMUGGLED_SIZE_LINE)}", CHUNKED],
                     SMUGGLED_AS_CHUNK),
    "te_cl": smuggle([CHUNKED, f"Content-Length: {len(SMUGGLED_SIZE_LINE)}"],
                     SMUGGLED_AS_CHUNK),
    # The first length says no body, the second that SMUGGLED is the body.
    "two_cl": smuggle(["Content-Length: 0", f"Content-Length: {len(SMUGGLED)}"], SMUGGLED),
    "cl_negative": smuggle(["Content-Length: -1"], SMUGGLED),
    "cl_empty": smuggle(["Content-Length:"], SMUGGLED),
    # 3 bytes declared, "abc0" sent: a lenient parser reads "abc", then "0" as the last
    # chunk, and SMUGGLED as the next request.
    "chunk_overlong": smuggle([CHUNKED], b"3\r\nabc0\r\n\r\n" + SMUGGLED),
}

TE_GZIP_CHUNKED = smuggle(["Transfer-Encoding: gzip, chunked"], LAST_CHUNK_THEN_SMUGGLED)
TE_CHUNKED_GZIP = smuggle(["Transfer-Encoding: chunked, gzip"], LAST_CHUNK_THEN_SMUGGLED)

BIG_NO_ROUTE = request("POST", "/no_such_route", ["Content-Type: application/json",
                                                  "Content-Length: 104857600"])
BIG_UNAUTHENTICATED = request("POST", "/update_weights", ["Content-Type: application/json",
                                                          "Content-Length: 104857600"])
SLOW_UNAUTHENTICATED = request("POST", "/update_weights", ["Content-Type: application/json",
                                                           "Content-Length: 1000000"])
PUT_WEIGHT_INFO_1GB = request("PUT", "/weight_info", ["Content-Length: 1073741824"])

UPDATE_BODY = json.dumps({"update_info": harness.update_info()}).encode()
EXPECT_TOO_LARGE = request("POST", "/update_weights",
                           ["Authorization: Bearer secret", "Content-Type: application/json",
                            "Content-Length: 10000", "Expect: 100-continue"])


def expect_unauthorized(authorization):
    extra = [f"Authorization: {authorization}"] if authorization else []
    return request("POST", "/update_weights", [*extra, "Content-Type: application/json",
                                               f"Content-Length: {len(UPDATE_BODY)}",
                                               "Expect: 100-continue"])


def set_version(version, expect=None, authorization="Bearer secret"):
    """Head and body of POST /update_weight_version, sent apart."""
    body = json.dumps({"new_version": version}).encode()
    head = request("POST", "/update_weight_version",
                   [f"Authorization: {authorization}", "Content-Type: application/json",
                    f"Content-Length: {len(body)}",
                    *([f"Expect: {expect}"] if expect else [])])
    return head, body


LOG_CRLF = request("GET", "/%0d%0aFORGED%20line")
LOG_NON_ASCII = request("GET", "/caf%C3%A9")
LOG_QUOTE_BACKSLASH = request("GET", "/q%22b%5Cc")

# Malformed requests the parser must answer with 400 bad_request.
MALFORMED = {
    "http11_no_host": request("GET", "/health", host=False),
    "cl_abc": request("POST", "/start_weight_update", ["Content-Length: abc"], b"{}"),
    "header_name_nul": request("GET", "/health", [b"X-A\x00b: c"]),
    "header_value_cr": request("GET", "/health", [b"X-A: b\rc"]),
    "bare_lf": b"GET /health HTTP/1.1\nHost: x\n\n",
    "obs_fold": request("GET", "/health", ["X-A: b", " c"]),
    "space_before_colon": b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n",
}
HTTP2_VERSION = request("GET", "/health", version="HTTP/2.0")
HTTP12_VERSION = request("GET", "/health", version="HTTP/1.2")
HTTP10_NO_HOST = request("GET", "/health", version="HTTP/1.0", host=False)

# Well-formed: chunk extensions and a trailer section end one request, not start another.
CHUNKED_WITH_TRAILERS = request(
    "POST", "/update_weight_version", ["Content-Type: application/json", CHUNKED],
    b'5;name=value\r\n{"new\r\n11;last\r\n_version":"step-7\r\n2\r\n"}\r\n'
    b"0;done\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n")

HEADER_TOO_LARGE = request("GET", "/health", ["X-Pad: " + "p" * 2000])
HEADER_STALLED = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # no blank line, ever


# ---------------------------------------------------------------------------------------------


class FrontDoorCase(harness.DaemonTestCase):
    """Helpers shared by the front-door suites."""

    def embedded(self, args=(), **settings):
        """An embedded-mode dev daemon; settings become VLLMD_<NAME> variables."""
        env = harness.clean_env({f"VLLMD_{key.upper()}": str(value)
                                 for key, value in settings.items()})
        daemon = self.launch_daemon(["--dev-mode", *args], env=env)
        daemon.wait_healthy()
        return daemon

    def external(self, **server):
        """External mode, one recording reference engine; settings go to [server]."""
        args = []
        if server:
            config = self.write_config(
                "[server]\n" + "".join(f"{key} = {value}\n" for key, value in server.items()))
            args = ["--config", config]
        daemon, (engine,), _ = self.start_external(dp=1, daemon_args=args)
        return daemon, engine

    def raw(self, daemon, timeout=5.0):
        conn = RawConnection(daemon.port, timeout)
        self.addCleanup(conn.close)
        return conn

    def engine_calls(self, daemon, engine):
        """The names of the calls the engine received, once none is pending."""
        time.sleep(0.2)  # a call the daemon is about to make
        daemon.wait_no_pending_calls()
        return harness.call_names(engine.calls())

    def assert_closing_error(self, response, status, code, type_=None):
        """An error that ends the connection: the JSON shape and Connection: close."""
        error = self.assert_error(response, status, code, type_=type_)
        self.assertEqual(response.headers.get("Connection", "").lower(), "close",
                         f"{status} {code} without Connection: close: {response!r}")
        return error

    def assert_closed(self, conn, timeout=2.0):
        """The server closes the connection now, and sends nothing more first."""
        closed, extra = conn.read_until_closed(timeout)
        self.assertEqual(extra, b"", "bytes after the error response (a second response?)")
        self.assertTrue(closed, f"the connection is still open {timeout} s after an error "
                                "that ends it")

    def assert_weight_info(self, daemon, version="default"):
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": version})


# ---------------------------------------------------------------------------------------------
# 1. Incomplete bodies are never executed


class IncompleteBodyTest(FrontDoorCase):

    def open_session(self, daemon):
        # The trainer opened an update; its finish is what breaks off.
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})

    def assert_not_executed(self, daemon, engine, before, response):
        # The record first: an executed finish is the defect, the status only its symptom.
        names = self.engine_calls(daemon, engine)[before:]
        self.assertNotIn("finish_weight_update", names,
                         f"an incomplete request was executed (answered {response!r})")
        self.assertNotIn("set_weight_version", names)
        self.assertEqual(names, [], "an incomplete request reached the engine")

    def test_a_body_cut_short_by_the_client_is_400_and_never_executed(self):
        daemon, engine = self.external()
        self.open_session(daemon)
        for sent in (10, 0):  # of 40 declared bytes
            with self.subTest(sent=sent):
                before = len(engine.calls())
                conn = self.raw(daemon)
                conn.send(finish_with_length(sent))
                conn.half_close()
                response = conn.read_response()
                self.assert_not_executed(daemon, engine, before, response)
                self.assert_closing_error(response, 400, "bad_request")
                self.assert_closed(conn)
        self.assert_weight_info(daemon)

    def test_a_body_that_stalls_is_408_and_never_executed(self):
        daemon, engine = self.external(timeout=1)
        self.open_session(daemon)
        for sent in (10, 0):
            with self.subTest(sent=sent):
                before = len(engine.calls())
                conn = self.raw(daemon)
                conn.send(finish_with_length(sent))  # and then nothing, socket open
                response = conn.read_response(timeout=4)
                self.assert_not_executed(daemon, engine, before, response)
                self.assert_closing_error(response, 408, "request_timeout")
                self.assertLess(response.elapsed, 3)
                self.assert_closed(conn)
        self.assert_weight_info(daemon)

    def test_a_chunked_body_without_its_last_chunk_is_400_and_never_executed(self):
        daemon, engine = self.external()
        self.open_session(daemon)
        for name, chunks in INCOMPLETE_CHUNKED.items():
            with self.subTest(body=name):
                before = len(engine.calls())
                conn = self.raw(daemon)
                conn.send(finish_chunked(chunks))
                conn.half_close()
                response = conn.read_response()
                self.assert_not_executed(daemon, engine, before, response)
                self.assert_closing_error(response, 400, "bad_request")
                self.assert_closed(conn)
        self.assert_weight_info(daemon)

    def test_a_chunked_body_that_stalls_is_408_and_never_executed(self):
        daemon, engine = self.external(timeout=1)
        self.open_session(daemon)
        for name, chunks in INCOMPLETE_CHUNKED.items():
            with self.subTest(body=name):
                before = len(engine.calls())
                conn = self.raw(daemon)
                conn.send(finish_chunked(chunks))
                response = conn.read_response(timeout=4)
                self.assert_not_executed(daemon, engine, before, response)
                self.assert_closing_error(response, 408, "request_timeout")
                self.assertLess(response.elapsed, 3)
                self.assert_closed(conn)
        self.assert_weight_info(daemon)

    def test_an_invalid_chunk_size_is_400_and_never_executed(self):
        daemon, engine = self.external()
        self.open_session(daemon)
        for name, size in BAD_CHUNK_SIZES.items():
            with self.subTest(size=name):
                before = len(engine.calls())
                conn = self.raw(daemon)
                conn.send(bad_chunk_size(size))
                response = conn.read_response()
                self.assert_not_executed(daemon, engine, before, response)
                self.assert_closing_error(response, 400, "bad_request")
                self.assert_closed(conn)
        self.assert_weight_info(daemon)


# ---------------------------------------------------------------------------------------------
# 2. Request smuggling


class SmugglingTest(FrontDoorCase):

    def attempt(self, payload):
        """Sends `payload` on one connection; (daemon, engine, first response, whether the
        server closed afterwards, the bytes that followed the first response)."""
        daemon, engine = self.external()
        conn = self.raw(daemon)
        conn.send(payload)
        first = conn.read_response()
        closed, extra = conn.read_until_closed(2)
        return daemon, engine, first, closed, extra

    def assert_refused(self, payload, status=400, code="bad_request", type_=None):
        daemon, engine, first, closed, extra = self.attempt(payload)
        names = self.engine_calls(daemon, engine)
        self.assertNotIn("set_weight_version", names,
                         f"the smuggled request was executed (first response {first!r}, then "
                         f"{extra[:200]!r})")
        self.assertEqual(names, [], f"the ambiguous request reached the engine ({first!r})")
        self.assert_weight_info(daemon)
        self.assert_closing_error(first, status, code, type_=type_)
        self.assertEqual(extra, b"", "a second response on the connection")
        self.assertTrue(closed, "the connection stayed open after ambiguous framing")

    def test_content_length_with_chunked(self):
        self.assert_refused(SMUGGLING["cl_te"])

    def test_chunked_before_content_length(self):
        self.assert_refused(SMUGGLING["te_cl"])

    def test_two_different_content_lengths(self):
        self.assert_refused(SMUGGLING["two_cl"])

    def test_negative_content_length(self):
        self.assert_refused(SMUGGLING["cl_negative"])

    def test_empty_content_length(self):
        self.assert_refused(SMUGGLING["cl_empty"])

    def test_chunk_data_longer_than_its_size(self):
        self.assert_refused(SMUGGLING["chunk_overlong"])

    def test_a_coding_other_than_chunked_is_501(self):
        self.assert_refused(TE_GZIP_CHUNKED, 501, "not_implemented", type_="invalid_request_error")

    def test_chunked_not_last_is_400(self):
        self.assert_refused(TE_CHUNKED_GZIP)


# ---------------------------------------------------------------------------------------------
# 3. Decide before the body


def stream_body(port, head, total, deadline):
    """Sends `head`, then zeros as fast as the server takes them, up to `total` bytes, while
    reading whatever the server answers. Stops at the first complete response, the server's
    close or reset, or `deadline`. Returns what happened."""
    outcome = {"response": None, "sent": 0, "seconds": None, "sent_at_response": None,
               "end": "deadline"}
    sock = socket.create_connection((harness.HOST, port), timeout=5)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head)
        started = time.monotonic()
        sock.setblocking(False)
        chunk = memoryview(bytes(1 << 20))
        received = b""
        writing = True
        while time.monotonic() < deadline:
            want_write = [sock] if writing and outcome["sent"] < total else []
            readable, writable, _ = select.select([sock], want_write, [], 0.2)
            if readable:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    data = None
                except ConnectionResetError:
                    outcome["end"] = "reset"
                    break
                if data == b"":
                    outcome["end"] = "closed"
                    break
                if data:
                    if outcome["seconds"] is None:
                        outcome["seconds"] = time.monotonic() - started
                        outcome["sent_at_response"] = outcome["sent"]
                    received += data
                    head_end = received.find(b"\r\n\r\n")
                    if head_end >= 0:
                        match = re.search(rb"\r\ncontent-length:\s*(\d+)",
                                          received[:head_end], re.I)
                        if match and len(received) >= head_end + 4 + int(match.group(1)):
                            outcome["end"] = "answered"
                            break
            if writable:
                try:
                    outcome["sent"] += sock.send(chunk[:min(len(chunk),
                                                            total - outcome["sent"])])
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    writing = False  # the server stopped reading: read what it said
        if received:
            conn = RawConnection.__new__(RawConnection)
            conn.sock, conn.buffer = sock, received
            sock.setblocking(True)
            try:
                outcome["response"] = conn.read_response(timeout=1)
            except AssertionError as error:
                outcome["partial"] = f"{error}"
    finally:
        sock.close()
    return outcome


class DecideBeforeTheBodyTest(FrontDoorCase):
    CONNECTIONS = 6
    BODY = 104857600  # 100 MiB each, under the default body limit (128 MiB)

    def flood(self, head, status, code, type_):
        daemon = self.embedded(["--api-key", "secret"])
        idle = vm_hwm_kib(daemon.pid)
        deadline = time.monotonic() + 15
        outcomes = [None] * self.CONNECTIONS

        def run(index):
            outcomes[index] = stream_body(daemon.port, head, self.BODY, deadline)

        senders = [threading.Thread(target=run, args=(i,)) for i in range(self.CONNECTIONS)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=20)
        peak = vm_hwm_kib(daemon.pid)
        print(f"\n  {head.split(b' ')[1].decode()}: VmHWM idle {idle} KiB, after {peak} KiB; "
              f"bytes sent before the answer: {[o and o['sent_at_response'] for o in outcomes]}",
              flush=True)
        for index, outcome in enumerate(outcomes):
            with self.subTest(connection=index):
                self.assertIsNotNone(outcome, "the sender did not finish")
                self.assertIsNotNone(outcome["response"],
                                     f"no response before the connection ended: {outcome}")
                self.assert_error(outcome["response"], status, code, type_=type_)
                self.assertLess(outcome["sent_at_response"], self.BODY,
                                "the answer waited for the whole body")
                self.assertLess(outcome["seconds"], 2, "the answer was not prompt")
        self.assertLess(peak, 2 * idle, f"the bodies were buffered: VmHWM {idle} KiB idle, "
                                        f"{peak} KiB after")
        self.assertEqual(daemon.health_status(), 200)

    def test_an_unknown_route_is_404_before_a_100_mb_body(self):
        self.flood(BIG_NO_ROUTE, 404, "not_found", "invalid_request_error")

    def test_a_missing_api_key_is_401_before_a_100_mb_body(self):
        self.flood(BIG_UNAUTHENTICATED, 401, "unauthorized", "authentication_error")

    def test_slow_unauthenticated_uploads_hold_no_worker(self):
        daemon = self.embedded(["--api-key", "secret"])
        count = 16  # as many as the default server.threads
        stop = threading.Event()
        sent_heads = threading.Semaphore(0)
        results = [{} for _ in range(count)]

        def slow(result):
            conn = RawConnection(daemon.port)
            try:
                conn.send(SLOW_UNAUTHENTICATED)
                result["head_sent"] = time.monotonic()
                sent_heads.release()
                next_byte = time.monotonic()
                conn.sock.setblocking(False)
                while not stop.is_set():
                    now = time.monotonic()
                    if now >= next_byte:
                        try:
                            conn.sock.send(b"{")
                            result["body_bytes"] = result.get("body_bytes", 0) + 1
                        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                            pass
                        next_byte = now + 5
                    readable, _, _ = select.select([conn.sock], [], [], 0.1)
                    if readable:
                        try:
                            data = conn.sock.recv(4096)
                        except (BlockingIOError, ConnectionResetError):
                            data = b""
                        if data and "status_line" not in result:
                            result["status_line"] = data.split(b"\r\n", 1)[0].decode("latin-1")
                            result["answered"] = time.monotonic()
                        if not data:
                            break
            finally:
                conn.close()

        workers = [threading.Thread(target=slow, args=(result,)) for result in results]
        for worker in workers:
            worker.start()
        self.addCleanup(lambda: [worker.join(timeout=10) for worker in workers])
        self.addCleanup(stop.set)
        for _ in range(count):
            self.assertTrue(sent_heads.acquire(timeout=5), "a slow client could not connect")
        time.sleep(0.3)  # each header is in; each would now be blocking a worker

        timings = {}
        for path in ("/start_weight_update", "/finish_weight_update"):
            started = time.monotonic()
            try:
                response = daemon.post(path, headers=AUTH, timeout=3)
                status = response.status_code
            except requests.RequestException as error:
                status = f"no answer ({type(error).__name__})"
            timings[path] = (status, time.monotonic() - started)
        harness.wait_until(lambda: all("status_line" in r for r in results) or
                           time.monotonic() > max(r["head_sent"] for r in results) + 2,
                           5, message="the slow clients' answers")
        stop.set()
        for worker in workers:
            worker.join(timeout=5)

        for path, (status, seconds) in timings.items():
            with self.subTest(path=path):
                self.assertEqual(status, 200, f"{path} with the right key, next to 16 slow "
                                              "unauthenticated uploads")
                self.assertLess(seconds, 1)
        for index, result in enumerate(results):
            with self.subTest(slow=index):
                self.assertIn("status_line", result, "no answer to a slow unauthenticated "
                                                     "upload within 2 s of its header")
                self.assertTrue(result["status_line"].startswith("HTTP/1.1 401 "),
                                result["status_line"])
                self.assertLess(result["answered"] - result["head_sent"], 2)

    def test_expect_100_continue_gets_the_final_status_when_refused(self):
        daemon = self.embedded(["--api-key", "secret", "--max-body-bytes", "1000"])
        cases = [("too large", EXPECT_TOO_LARGE, 413, "payload_too_large",
                  "invalid_request_error"),
                 ("no key", expect_unauthorized(None), 401, "unauthorized",
                  "authentication_error"),
                 ("wrong key", expect_unauthorized("Bearer wrong"), 401, "unauthorized",
                  "authentication_error")]
        for name, head, status, code, type_ in cases:
            with self.subTest(case=name):
                conn = self.raw(daemon)
                conn.send(head)  # and wait for 100 before sending the body, as curl does
                first = conn.read_response(timeout=3)
                self.assertTrue(first.status_line.startswith(f"HTTP/1.1 {status} "),
                                f"first status line: {first.status_line!r}")
                self.assert_error(first, status, code, type_=type_)

    def test_expect_100_continue_when_accepted(self):
        daemon = self.embedded(["--api-key", "secret", "--max-body-bytes", "1000"])
        head, body = set_version("v-continue", expect="100-continue")
        conn = self.raw(daemon)
        conn.send(head)
        interim = conn.read_response(timeout=3)
        self.assertEqual(interim.status_line, "HTTP/1.1 100 Continue")
        conn.send(body)
        final = conn.read_response()
        self.assertEqual(final.status_code, 200, final)
        self.assertEqual(final.json(), {"success": True, "new_version": "v-continue"})
        self.assert_json(daemon.get("/weight_info", headers=AUTH), 200,
                         {"weight_version": "v-continue"})

    def test_an_unknown_expectation_is_417(self):
        daemon = self.embedded(["--api-key", "secret"])
        head, body = set_version("v-417", expect="something-else")
        conn = self.raw(daemon)
        conn.send(head + body)
        response = conn.read_response(timeout=3)
        self.assert_json(daemon.get("/weight_info", headers=AUTH), 200, DEFAULT)
        self.assert_error(response, 417, "expectation_failed")

    def test_a_wrong_method_is_405_before_a_1_gb_body(self):
        daemon = self.embedded()
        conn = self.raw(daemon)
        conn.send(PUT_WEIGHT_INFO_1GB)  # and no body
        response = conn.read_response(timeout=2)
        self.assert_error(response, 405, "method_not_allowed")
        self.assertEqual(response.headers.get("Allow"), "GET")


# ---------------------------------------------------------------------------------------------
# 4. Two daemons on one port


class PortInUseTest(FrontDoorCase):

    def test_a_second_daemon_on_a_port_in_use_exits_69(self):
        first = self.embedded()
        port = first.port
        self.assert_json(first.post("/update_weight_version", json={"new_version": "first"}),
                         200, {"success": True, "new_version": "first"})

        out_path = os.path.join(self.workdir, "second.out")
        err_path = os.path.join(self.workdir, "second.err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            second = subprocess.Popen(
                [harness.vllmd_bin(), "--dev-mode", "--port", str(port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=harness.clean_env(),
                preexec_fn=harness.die_with_parent)

        def reap():
            if second.poll() is None:
                os.kill(second.pid, 9)
            second.wait(timeout=10)

        self.addCleanup(reap)
        try:
            status = second.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = None
        # Who answers on the port now: a new connection each.
        answers = []
        for _ in range(8):
            try:
                response = requests.get(f"{first.url}/weight_info", timeout=5)
                answers.append(response.json().get("weight_version"))
            except (requests.RequestException, ValueError) as error:
                answers.append(f"no answer ({type(error).__name__})")
        with open(err_path, encoding="utf-8", errors="replace") as handle:
            stderr = handle.read()
        self.assertIsNotNone(status, f"a second daemon started on 127.0.0.1:{port}, which "
                                     f"another one is listening on; /weight_info answered "
                                     f"{answers}; its stderr:\n{stderr}")
        self.assertEqual(status, 69, stderr)
        naming = [line for line in stderr.splitlines()
                  if f"127.0.0.1:{port}" in line and "in use" in line.lower()]
        self.assertEqual(len(naming), 1,
                         f"one line naming 127.0.0.1:{port} as in use; stderr:\n{stderr}")
        self.assertEqual(answers, ["first"] * 8, "not every answer came from the first daemon")
        self.assertEqual(first.health_status(), 200)


# ---------------------------------------------------------------------------------------------
# 5. The watchdog


class WatchdogTest(FrontDoorCase):

    def watched(self, args):
        notify = harness.NotifySocket(os.path.join(self.workdir, "notify.sock"))
        self.addCleanup(notify.close)
        daemon = self.launch_daemon(["--dev-mode", *args], env=harness.clean_env(
            {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"}))
        notify.first("READY")
        return daemon, notify

    @staticmethod
    def watchdogs(notify, since, until=None):
        return [t for t, fields in list(notify.messages)
                if "WATCHDOG" in fields and t >= since and (until is None or t <= until)]

    def assert_fed(self, args):
        daemon, notify = self.watched(args)
        since = time.monotonic()
        time.sleep(2)
        fed = self.watchdogs(notify, since)
        self.assertGreaterEqual(len(fed), 4, f"WATCHDOG=1 in 2 s with {args}: {len(fed)}; log:\n"
                                             f"{daemon.log()[-2000:]}")

    def test_the_watchdog_is_fed_with_api_keys(self):
        self.assert_fed(["--api-key", "secret"])

    def test_the_watchdog_is_fed_with_an_allowlist_without_loopback(self):
        self.assert_fed(["--allow", "10.0.0.0/8"])

    def test_the_watchdog_stops_while_the_http_thread_hangs(self):
        daemon, notify = self.watched([])
        since = time.monotonic()
        harness.wait_until(lambda: len(self.watchdogs(notify, since)) >= 2, 3,
                           message="WATCHDOG=1 before the freeze")
        names = threads(daemon.pid)
        http = [tid for tid, name in names.items() if name == "vllmd-http"]
        self.assertTrue(http, f"no thread named vllmd-http; threads: {sorted(names.values())}")

        frozen = []

        def thaw_all():
            for thread in frozen:
                thread.thaw()

        self.addCleanup(thaw_all)  # runs before the daemon is stopped
        try:
            for tid in http:
                frozen.append(FrozenThread(tid))
        except OSError as error:
            if error.errno == errno.EPERM:
                self.skipTest(f"ptrace is not permitted here ({error}); cannot freeze the "
                              "HTTP thread")
            raise
        frozen_at = time.monotonic()
        time.sleep(1)  # grace: a probe already answered may still be reported
        quiet_from = time.monotonic()
        time.sleep(1.5)
        during = self.watchdogs(notify, quiet_from, time.monotonic())
        thaw_all()
        thawed_at = time.monotonic()
        self.assertEqual(during, [], f"WATCHDOG=1 while the HTTP thread was frozen (since "
                                     f"{quiet_from - frozen_at:.1f} s after the freeze)")
        harness.wait_until(lambda: self.watchdogs(notify, thawed_at), 2,
                           message="WATCHDOG=1 again after the HTTP thread resumed")
        self.assertEqual(daemon.health_status(), 200)


# ---------------------------------------------------------------------------------------------
# 6. The access log and the parser's strictness

PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z vllmd \w+: ")
ACCESS_SUFFIX = re.compile(r" \d{3} \d+(\.\d+)?ms engine=\d+(\.\d+)?ms$")
ACCESS_LINE = re.compile(r"^(\S+) ([A-Z]+) (\S+) (\d{3}) \d+(\.\d+)?ms engine=\d+(\.\d+)?ms$")


def log_lines(daemon):
    """The daemon's log lines after the logger's prefix, bytes as latin-1 (exact)."""
    with open(daemon.log_path, "rb") as handle:
        text = handle.read().decode("latin-1")
    return [PREFIX.sub("", line) for line in text.split("\n") if line]


def access_lines(daemon):
    return [line for line in log_lines(daemon) if ACCESS_SUFFIX.search(line)]


class AccessLogTest(FrontDoorCase):

    def send_logged(self, daemon, payloads):
        before = len(access_lines(daemon))
        for payload in payloads:
            conn = self.raw(daemon)
            conn.send(payload)
            response = conn.read_response()
            self.assertEqual(response.status_code, 404, response)
            self.assert_error(response, 404, "not_found")
        harness.wait_until(lambda: len(access_lines(daemon)) >= before + len(payloads), 3,
                           message="the access-log lines")

    def test_control_bytes_in_a_path_cannot_forge_log_lines(self):
        daemon = self.embedded()
        self.send_logged(daemon, [LOG_CRLF, LOG_NON_ASCII, LOG_QUOTE_BACKSLASH])
        lines = log_lines(daemon)
        forged = [line for line in lines
                  if "FORGED" in line and "/\\x0d\\x0aFORGED\\x20line" not in line]
        self.assertEqual(forged, [], "a request path wrote a line of its own in the log")
        access = access_lines(daemon)
        self.assertTrue(any("/\\x0d\\x0aFORGED\\x20line" in line for line in access),
                        f"no access line with the escaped path; lines:\n" + "\n".join(lines))
        for escaped in ("/caf\\xc3\\xa9", "/q\\x22b\\x5cc"):
            self.assertTrue(any(escaped in line for line in access),
                            f"no access line with {escaped}; lines:\n" + "\n".join(access))

    def test_access_lines_start_with_the_client_address(self):
        daemon = self.embedded()
        self.assertEqual(daemon.get("/health").status_code, 200)
        self.send_logged(daemon, [LOG_CRLF, LOG_NON_ASCII, LOG_QUOTE_BACKSLASH])
        harness.wait_until(lambda: any("GET /health 200 " in line
                                       for line in access_lines(daemon)), 3,
                           message="the /health access line")
        access = access_lines(daemon)
        self.assertTrue(any(line.startswith("127.0.0.1 GET /health 200 ") for line in access),
                        "\n".join(access))
        for line in access:
            with self.subTest(line=line):
                match = ACCESS_LINE.match(line)
                self.assertIsNotNone(match, "not <client address> <METHOD> <path> <status> "
                                            "<total>ms engine=<engine>ms")
                self.assertEqual(match.group(1), "127.0.0.1")
                # Escaped: nothing outside 0x21..0x7e, and no bare quote or backslash.
                path = match.group(3)
                self.assertTrue(all(0x21 <= ord(c) <= 0x7e for c in path), path)
                self.assertNotIn('"', path)
                self.assertIsNone(re.search(r"\\(?!x[0-9a-f]{2})", path), path)


class StrictParsingTest(FrontDoorCase):
    """Every malformed request gets an answer (never silence, never a guess)."""

    def answer(self, payload, **settings):
        # server.timeout 2 s: a request the parser does not recognise as complete would
        # otherwise wait 10 s for more bytes.
        settings.setdefault("timeout", 2)
        daemon = self.embedded(**settings)
        conn = self.raw(daemon)
        conn.send(payload)
        return daemon, conn, conn.read_response(timeout=4)

    def assert_bad_request(self, payload):
        daemon, conn, response = self.answer(payload)
        self.assert_closing_error(response, 400, "bad_request")
        self.assert_closed(conn)
        self.assertEqual(daemon.health_status(), 200)

    def test_http_2_0_is_505(self):
        _, conn, response = self.answer(HTTP2_VERSION)
        self.assert_closing_error(response, 505, "http_version_not_supported",
                                  type_="invalid_request_error")
        self.assert_closed(conn)

    def test_http_1_2_is_505(self):
        _, conn, response = self.answer(HTTP12_VERSION)
        self.assert_closing_error(response, 505, "http_version_not_supported",
                                  type_="invalid_request_error")
        self.assert_closed(conn)

    def test_http_1_1_without_host_is_400(self):
        _, _, response = self.answer(MALFORMED["http11_no_host"])
        self.assert_error(response, 400, "bad_request")

    def test_http_1_0_without_host_is_served(self):
        _, _, response = self.answer(HTTP10_NO_HOST)
        self.assertEqual(response.status_code, 200, response)

    def test_chunk_extensions_and_trailers_end_one_request(self):
        daemon, conn, response = self.answer(CHUNKED_WITH_TRAILERS)
        self.assertEqual(response.status_code, 200, response)
        self.assertEqual(response.json(), {"success": True, "new_version": "step-7"})
        closed, extra = conn.read_until_closed(0.5)
        self.assertEqual(extra, b"", "the trailer section was read as another request")
        self.assertFalse(closed, "a well-formed chunked request ended the connection")
        self.assert_weight_info(daemon, "step-7")

    def test_a_content_length_that_is_not_a_number_is_400(self):
        self.assert_bad_request(MALFORMED["cl_abc"])

    def test_a_nul_in_a_header_name_is_400(self):
        self.assert_bad_request(MALFORMED["header_name_nul"])

    def test_a_cr_in_a_header_value_is_400(self):
        self.assert_bad_request(MALFORMED["header_value_cr"])

    def test_bare_lf_line_endings_are_400(self):
        self.assert_bad_request(MALFORMED["bare_lf"])

    def test_an_obs_fold_header_line_is_400(self):
        self.assert_bad_request(MALFORMED["obs_fold"])

    def test_whitespace_between_a_header_name_and_its_colon_is_400(self):
        self.assert_bad_request(MALFORMED["space_before_colon"])


# ---------------------------------------------------------------------------------------------
# 7. One error shape from the connection layer


class ConnectionLayerErrorsTest(FrontDoorCase):

    def test_an_oversized_header_is_431_in_the_json_shape(self):
        daemon = self.embedded(max_header_bytes=1024)
        conn = self.raw(daemon)
        conn.send(HEADER_TOO_LARGE)
        self.assert_closing_error(conn.read_response(), 431, "header_too_large")
        self.assert_closed(conn)

    def test_a_stalled_header_is_408_in_the_json_shape(self):
        daemon = self.embedded(timeout=1)
        conn = self.raw(daemon)
        conn.send(HEADER_STALLED)
        response = conn.read_response(timeout=4)
        self.assert_closing_error(response, 408, "request_timeout")
        self.assertLess(response.elapsed, 3)
        self.assert_closed(conn)

    def test_a_connection_over_the_limit_is_503_in_the_json_shape(self):
        daemon = self.embedded(max_connections=2)
        time.sleep(0.3)  # the health checks' connections are gone
        held = [self.raw(daemon) for _ in range(2)]  # idle, accepted in order
        time.sleep(0.2)
        extra = self.raw(daemon)
        self.assert_closing_error(extra.read_response(timeout=3), 503, "server_busy",
                                  type_="server_error")
        self.assert_closed(extra)
        for conn in held:
            conn.close()
        harness.wait_until(lambda: daemon.health_status() == 200, 5,
                           message="/health once the held connections closed")


if __name__ == "__main__":
    unittest.main()
