"""What vllmctl puts on the wire, seen by a small fake server on loopback: bodies sent
byte-for-byte (or not at all), headers, queries, retries, and status -> exit code mapping for
statuses a healthy vllmd seldom answers."""

import http.server
import json
import threading

from ctl_harness import CtlTestCase


class FakeServer:
    """Records every request; answers with `respond(method, path) -> (status, body)`."""

    def __init__(self, respond):
        self.requests = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                length = self.headers.get("Content-Length")
                body = self.rfile.read(int(length)) if length else b""
                fake.requests.append({"method": self.command, "path": self.path,
                                      "headers": dict(self.headers), "body": body})
                status, reply = respond(self.command, self.path)
                data = reply.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            do_GET = do_POST = handle_one

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def error(message, param=None):
    return json.dumps({"error": {"message": message, "type": "server_error", "param": param,
                                 "code": "server_error"}})


class WireTest(CtlTestCase):
    def serve(self, respond=lambda method, path: (200, '{"message":"ok"}')):
        fake = FakeServer(respond)
        self.addCleanup(fake.close)
        self.server = fake.url
        return fake

    def test_bodies_are_sent_as_given_or_not_at_all(self):
        fake = self.serve()
        # Odd spacing and number forms: any re-serialization would change these bytes.
        init = b'{ "master_address" : "h",\n  "n": 1.50e0, "u": "\\u00e9" }\n'
        self.write("init.json", init)
        update = b'[ {"names": []} ]'
        self.write("update.json", update)
        for args in (["weights", "init", "--info", "init.json"], ["weights", "start"],
                     ["weights", "start", "--draft"],
                     ["weights", "update", "--info", "update.json"], ["weights", "finish"],
                     ["weights", "finish", "--version", 'v"1'],
                     ["weights", "set-version", "v2"]):
            self.assert_ok(self.ctl(*args))
        paths = [request["path"] for request in fake.requests]
        self.assertEqual(paths, ["/init_weight_transfer_engine", "/start_weight_update",
                                 "/start_draft_weight_update", "/update_weights",
                                 "/finish_weight_update", "/finish_weight_update",
                                 "/update_weight_version"])
        self.assertTrue(all(request["method"] == "POST" for request in fake.requests))
        init_call, start, draft, update_call, finish, finish_v, set_version = fake.requests
        self.assertEqual(init_call["body"], b'{"init_info":' + init + b"}")
        self.assertEqual(init_call["headers"]["Content-Type"], "application/json")
        self.assertEqual(update_call["body"], b'{"update_info":' + update + b"}")
        for request in (start, draft, finish):
            self.assertEqual(request["body"], b"")
            self.assertNotIn("Content-Type", request["headers"])
            self.assertIn(request["headers"].get("Content-Length", "0"), ("0",))
        self.assertEqual(json.loads(finish_v["body"]), {"weight_version": 'v"1'})
        self.assertEqual(json.loads(set_version["body"]), {"new_version": "v2"})

    def test_queries_and_token(self):
        fake = self.serve()
        token = self.write("token", "  tok-1\n")
        self.assert_ok(self.ctl("--token-file", token, "pause", "--mode", "keep", "--keep-cache"))
        self.assert_ok(self.ctl("pause", env={"VLLMCTL_TOKEN": "tok-2"}))
        self.assert_ok(self.ctl("world-size", "--no-dp"))
        self.assert_ok(self.ctl("world-size"))
        self.assert_ok(self.ctl("pause", "--mode", "abort"))
        self.assert_ok(self.ctl("pause", "--mode", "wait"))
        self.assertEqual([request["path"] for request in fake.requests],
                         ["/pause?mode=keep&clear_cache=false", "/pause",
                          "/get_world_size?include_dp=false", "/get_world_size",
                          "/pause?mode=abort", "/pause?mode=wait"])
        self.assertEqual(fake.requests[0]["headers"]["Authorization"], "Bearer tok-1")
        self.assertEqual(fake.requests[1]["headers"]["Authorization"], "Bearer tok-2")
        self.assertNotIn("Authorization", fake.requests[2]["headers"])

    def test_server_url_with_a_path_prefix(self):
        fake = self.serve(lambda method, path: (200, '{"weight_version":"p"}'))
        result = self.ctl("--server", fake.url + "/vllm/", "weights", "info", server=False)
        self.assertEqual(self.assert_ok(result).stdout, "p\n")
        self.assertEqual(fake.requests[0]["path"], "/vllm/weight_info")

    def test_gets_are_retried_on_503_posts_never(self):
        answers = iter([(503, error("busy")), (503, error("busy")),
                        (200, '{"weight_version":"v"}')])
        fake = self.serve(lambda method, path: next(answers) if method == "GET"
                          else (503, error("engine rank 0 is dead")))
        self.assertEqual(self.assert_ok(self.ctl("weights", "info")).stdout, "v\n")
        self.assertEqual(len(fake.requests), 3)
        self.assert_exit(self.ctl("weights", "start"), 69,
                         "vllmctl: weights start: engine rank 0 is dead")
        self.assertEqual(len(fake.requests), 4)

    def test_status_codes_map_to_exit_codes(self):
        cases = [
            (400, error("'update_info' must be a JSON object", "update_info"), 65,
             "'update_info' must be a JSON object (param: update_info)"),
            (401, error("missing or invalid API key"), 77, "missing or invalid API key"),
            (403, error("forbidden"), 77, "forbidden"),
            (404, error("Not Found"), 69, "Not Found (is vllmd running with --dev-mode?)"),
            (413, error("request body exceeds the limit"), 65, "request body exceeds the limit"),
            (500, "<html>oops</html>", 70, "HTTP 500: <html>oops</html>"),
            (502, "", 70, "HTTP 502"),
            (504, error("failed to call update_weights: timed out"), 75,
             "failed to call update_weights: timed out"),
        ]
        for status, body, code, text in cases:
            with self.subTest(status=status):
                self.serve(lambda method, path, s=status, b=body: (s, b))
                result = self.assert_exit(self.ctl("weights", "start"), code,
                                          f"vllmctl: weights start: {text}")
                self.assertEqual(result.stdout, "")
