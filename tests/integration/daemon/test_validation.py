"""Request validation (docs/http-api.md §3): every invalid request gets 400 in the OpenAI
error shape with the right param and code, and never reaches the engine (its --record file
stays empty). Plus: a body on /start_weight_update is ignored, a wrong method is 405 and an
unknown path 404, both with JSON error bodies."""

import unittest

import harness
from harness import rpc

JSON = {"Content-Type": "application/json"}

NOT_OBJECT = "Request body must be a JSON object"
INIT_MESSAGE = "'init_info' must be a JSON object"
UPDATE_MESSAGE = "'update_info' must be a JSON object or a list of per-worker JSON objects"

# (method, path, raw body or None, expected code, expected param, expected message or None)
INVALID = [
    # Not JSON at all.
    ("POST", "/init_weight_transfer_engine", "{not json", "json_parse_error", None, None),
    ("POST", "/init_weight_transfer_engine", '{"init_info": {}', "json_parse_error", None, None),
    ("POST", "/update_weights", "{'update_info': {}}", "json_parse_error", None, None),
    ("POST", "/update_weights", '{"update_info": {}} trailing', "json_parse_error", None, None),
    ("POST", "/finish_weight_update", "{", "json_parse_error", None, None),
    ("POST", "/update_weight_version", "new_version=step-1", "json_parse_error", None, None),
    ("POST", "/update_weights", '{"update_info": {"x": NaN}}', "json_parse_error", None, None),
    ("POST", "/update_weight_version", b'{"new_version": "\xff\xfe"}', "json_parse_error", None,
     None),
    ("POST", "/update_weight_version", '{"new_version": "a\\ud800b"}', "json_parse_error",
     None, None),
    # Integers that no msgpack integer holds: refused rather than turned into floats.
    ("POST", "/update_weights", '{"update_info": {"x": 18446744073709551616}}',
     "json_parse_error", None, None),
    ("POST", "/update_weights", '{"update_info": {"x": -9223372036854775809}}',
     "json_parse_error", None, None),
    # JSON, but not an object.
    ("POST", "/init_weight_transfer_engine", '[{"init_info": {}}]', "invalid_request_error",
     None, NOT_OBJECT),
    ("POST", "/update_weights", '[{"update_info": {}}]', "invalid_request_error", None,
     NOT_OBJECT),
    ("POST", "/update_weights", '"update_info"', "invalid_request_error", None, NOT_OBJECT),
    ("POST", "/update_weights", "42", "invalid_request_error", None, NOT_OBJECT),
    ("POST", "/finish_weight_update", '["step-1"]', "invalid_request_error", None, NOT_OBJECT),
    ("POST", "/update_weight_version", '"step-1"', "invalid_request_error", None, NOT_OBJECT),
    # init_info missing, null, not an object.
    ("POST", "/init_weight_transfer_engine", "{}", "invalid_request_error", "init_info",
     INIT_MESSAGE),
    ("POST", "/init_weight_transfer_engine", '{"init_info": null}', "invalid_request_error",
     "init_info", INIT_MESSAGE),
    ("POST", "/init_weight_transfer_engine", '{"init_info": []}', "invalid_request_error",
     "init_info", INIT_MESSAGE),
    ("POST", "/init_weight_transfer_engine", '{"init_info": [{}]}', "invalid_request_error",
     "init_info", INIT_MESSAGE),
    ("POST", "/init_weight_transfer_engine", '{"init_info": "x"}', "invalid_request_error",
     "init_info", INIT_MESSAGE),
    ("POST", "/init_weight_transfer_engine", '{"info": {}}', "invalid_request_error",
     "init_info", INIT_MESSAGE),
    # update_info missing, null, a string, a list with a non-object.
    ("POST", "/update_weights", "{}", "invalid_request_error", "update_info", UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": null}', "invalid_request_error", "update_info",
     UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": "names"}', "invalid_request_error",
     "update_info", UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": [1]}', "invalid_request_error", "update_info",
     UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": [{}, 1]}', "invalid_request_error",
     "update_info", UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": [{}, null]}', "invalid_request_error",
     "update_info", UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": [{}, [{}]]}', "invalid_request_error",
     "update_info", UPDATE_MESSAGE),
    ("POST", "/update_weights", '{"update_info": 3.5}', "invalid_request_error", "update_info",
     UPDATE_MESSAGE),
    # finish with a body whose weight_version is not a string.
    ("POST", "/finish_weight_update", '{"weight_version": 5}', "invalid_request_error",
     "weight_version", None),
    ("POST", "/finish_weight_update", '{"weight_version": ["step-1"]}', "invalid_request_error",
     "weight_version", None),
    ("POST", "/finish_weight_update", '{"weight_version": true}', "invalid_request_error",
     "weight_version", None),
    # update_weight_version without a string new_version.
    ("POST", "/update_weight_version", "{}", "invalid_request_error", "new_version", None),
    ("POST", "/update_weight_version", '{"new_version": 7}', "invalid_request_error",
     "new_version", None),
    ("POST", "/update_weight_version", '{"new_version": null}', "invalid_request_error",
     "new_version", None),
    ("POST", "/update_weight_version", '{"version": "step-1"}', "invalid_request_error",
     "new_version", None),
    # Bad query values.
    ("POST", "/pause?mode=bogus", None, "invalid_request_error", "mode", None),
    ("POST", "/pause?mode=", None, "invalid_request_error", "mode", None),
    ("POST", "/pause?mode=ABORT", None, "invalid_request_error", "mode", None),
    ("POST", "/pause?clear_cache=maybe", None, "invalid_request_error", "clear_cache", None),
    ("POST", "/pause?mode=wait&clear_cache=2", None, "invalid_request_error", "clear_cache",
     None),
    ("GET", "/get_world_size?include_dp=perhaps", None, "invalid_request_error", "include_dp",
     None),
]


class ValidationTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        self.daemon, (self.engine,), _ = self.start_external(dp=1)

    def send(self, method, path, body, headers=None):
        data = body.encode("utf-8") if isinstance(body, str) else body
        return self.daemon.post(path, data=data, headers=headers) if method == "POST" else \
            self.daemon.get(path, data=data, headers=headers)

    def test_invalid_requests_get_400_and_never_reach_the_engine(self):
        for method, path, body, code, param, message in INVALID:
            with self.subTest(method=method, path=path, body=body):
                response = self.send(method, path, body, JSON if body is not None else None)
                self.assert_error(response, 400, code, param=param, message=message,
                                  type_="invalid_request_error")
                self.assertEqual(self.engine.calls(), [], "an invalid request reached the engine")
        # A valid call afterwards is recorded: the record file works, so its silence above
        # means the engine really saw nothing.
        self.assert_json(self.daemon.post("/resume"), 200, {"status": "resumed"})
        self.assertEqual(harness.wire(self.engine.calls()), [("resume_scheduler", [])])

    def test_a_required_body_that_is_missing_is_rejected(self):
        for path in ("/init_weight_transfer_engine", "/update_weights", "/update_weight_version"):
            with self.subTest(path=path):
                response = self.daemon.post(path)  # no body, no Content-Type
                self.assertEqual(response.status_code, 400, response.text)
                error = response.json()["error"]
                # An empty body is not valid JSON; "not an object" would be acceptable too.
                self.assertIn(error["code"], ("json_parse_error", "invalid_request_error"))
                self.assert_error(response, 400, error["code"], param=error["param"],
                                  type_="invalid_request_error")
        self.assertEqual(self.engine.calls(), [])

    def test_start_weight_update_ignores_any_body(self):
        response = self.daemon.post("/start_weight_update", data=b"\x00garbage{[not json",
                                    headers=JSON)
        self.assert_json(response, 200, {"message": "Weight update started"})
        self.assertEqual(harness.wire(self.engine.calls()), [rpc("start_weight_update")])

    def test_wrong_method_is_405_with_a_json_error(self):
        cases = [("GET", "/update_weights"), ("GET", "/init_weight_transfer_engine"),
                 ("GET", "/start_weight_update"), ("GET", "/finish_weight_update"),
                 ("GET", "/pause"), ("POST", "/weight_info"), ("POST", "/is_paused"),
                 ("POST", "/get_world_size"), ("POST", "/health"), ("POST", "/version")]
        for method, path in cases:
            with self.subTest(method=method, path=path):
                response = self.send(method, path, None)
                self.assert_error(response, 405, "method_not_allowed")
        self.assertEqual(self.engine.calls(), [])

    def test_unknown_path_is_404_with_a_json_error(self):
        for method, path in [("GET", "/nope"), ("POST", "/nope"), ("GET", "/v1/weight_info"),
                             ("POST", "/v1/update_weights"), ("GET", "/weight_info/extra"),
                             ("GET", "/")]:
            with self.subTest(method=method, path=path):
                self.assert_error(self.send(method, path, None), 404, "not_found")
        self.assertEqual(self.engine.calls(), [])


if __name__ == "__main__":
    unittest.main()
