"""A trainer's whole weight-sync lifecycle through vllmd in external mode, against a real
reference-engine process: exact HTTP bodies (docs/http-api.md §2.1) and exact wire args as the
engine received them (docs/engine-protocol.md §5.1), with payloads passed through unchanged."""

import subprocess
import time
import unittest

import msgpack
import requests

import harness
from harness import rpc

UNICODE = "héllo ✓ 😀"
UINT64_MAX = 18446744073709551615
INT64_MIN = -9223372036854775808

# Nasty but valid: the NCCL dataclass only checks that its four fields are present, so their
# values can be anything; vllmd must not look inside.
INIT_INFO = {
    "master_address": UNICODE,
    "master_port": UINT64_MAX,
    "rank_offset": INT64_MIN,
    "world_size": {
        "floats": [0.1, 1e-300, 2.0, -0.5, 1.7976931348623157e308, 5e-324, 1e+100],
        "ints": [0, -1, 127, 128, 255, 256, 65535, 65536, 4294967295, 4294967296,
                 9223372036854775807, UINT64_MAX, INT64_MIN, -33, -129, -32769, -2147483649],
        "nested": {"a": [[], {}, [1, [2, [3, {"deep": [None, True, False]}]]]], "b": None},
        "strings": [UNICODE, "", "quote\" backslash\\ slash/ nl\n tab\t nul\u0000 \u00e9\u2713"],
    },
}

# update_info tolerates unknown keys, so the extras ride along next to the real fields.
UPDATE_INFO = {
    "names": ["model.embed_tokens.weight", "lm_head.weight"],
    "dtype_names": ["bfloat16", "float32"],
    "shapes": [[32000, 4096], [4096, 32000]],
    "extras": {"uint64": UINT64_MAX, "int64": INT64_MIN, "floats": [0.1, 1e-300],
               "unicode": UNICODE, "list": [{"k": [1, 2.5, None]}, []]},
}
UPDATE_LIST = [
    {"names": ["w"], "dtype_names": ["float16"], "shapes": [[1, 2, 3]], "packed": True,
     "big": UINT64_MAX, "label": UNICODE},
    {"names": [], "dtype_names": [], "shapes": [], "note": "for a worker that does not exist"},
]


def strict_equal(test, got, expected, where="args"):
    """Equal values AND equal types all the way down (2 != 2.0, True != 1)."""
    test.assertIs(type(got), type(expected), f"{where}: {got!r} vs {expected!r}")
    if isinstance(expected, dict):
        test.assertEqual(set(got), set(expected), where)
        for key in expected:
            strict_equal(test, got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        test.assertEqual(len(got), len(expected), where)
        for index, (g, e) in enumerate(zip(got, expected)):
            strict_equal(test, g, e, f"{where}[{index}]")
    else:
        test.assertEqual(got, expected, where)


def vllmd_version():
    out = subprocess.run([harness.vllmd_bin(), "--version"], capture_output=True, text=True,
                         env=harness.clean_env(), timeout=30, check=True).stdout
    name, version = out.split()
    assert name == "vllmd", out
    return version


class LifecycleTest(harness.DaemonTestCase):

    def test_full_trainer_lifecycle_exact_bodies_and_wire_args(self):
        daemon, (engine,), _ = self.start_external(dp=1)
        self.assertEqual(daemon.get("/health").status_code, 200)

        self.assert_json(daemon.get("/get_world_size"), 200, {"world_size": 1})
        self.assert_json(daemon.get("/get_world_size?include_dp=false"), 200, {"world_size": 1})
        self.assert_json(daemon.post("/init_weight_transfer_engine", json={"init_info": INIT_INFO}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE_INFO}),
                         200, {"message": "Weights updated"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE_LIST}),
                         200, {"message": "Weights updated"})
        self.assert_json(daemon.post("/finish_weight_update"), 200,
                         {"message": "Weight update finished"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": "step-1"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-1"})
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "step-2"}),
                         200, {"success": True, "new_version": "step-2"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-2"})
        self.assert_json(daemon.post("/pause?mode=wait&clear_cache=false"), 200,
                         {"status": "paused"})
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": True})
        self.assert_json(daemon.post("/resume"), 200, {"status": "resumed"})
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})
        self.assert_json(daemon.post("/start_draft_weight_update"), 200,
                         {"message": "Draft weight update started"})
        self.assert_json(daemon.get("/version"), 200,
                         {"version": vllmd_version(), "vllm_version": "0.0.0+reference"})
        self.assertEqual(daemon.get("/health").status_code, 200)

        expected = [
            rpc("init_weight_transfer_engine", {"init_info": INIT_INFO}),
            rpc("start_weight_update"),
            rpc("update_weights", {"update_info": UPDATE_INFO}),
            rpc("update_weights", {"update_info": UPDATE_LIST}),
            rpc("finish_weight_update"),
            rpc("start_weight_update"),
            rpc("finish_weight_update"),
            # /weight_info and /is_paused answer from what vllmd's own successful calls set:
            # no get_weight_version or is_scheduler_paused round trips.
            ("set_weight_version", ["step-1"]),
            ("set_weight_version", ["step-2"]),
            ("pause_scheduler", ["wait", False]),
            ("resume_scheduler", []),
            rpc("start_draft_weight_update"),
        ]
        calls = engine.calls()
        self.assertEqual(harness.wire(calls), [tuple(e) for e in expected])
        for call, (method, args) in zip(calls, expected):
            # The JSON view of what arrived (the recorder's) and the raw msgpack bytes both
            # hold exactly the values sent, with their types: ints stay ints, floats floats.
            strict_equal(self, call["args"], args, f"{method} json")
            raw = msgpack.unpackb(bytes.fromhex(call["args_hex"]), raw=False,
                                  strict_map_key=False)
            strict_equal(self, raw, args, f"{method} msgpack")
            if method == "collective_rpc":
                self.assertEqual(call["worker_method"], args[0])
            else:
                self.assertIsNone(call["worker_method"])

        init_args = calls[0]["args"][3]["init_info"]
        self.assertIsInstance(init_args["master_port"], int)
        self.assertEqual(init_args["master_port"], UINT64_MAX)
        self.assertEqual(init_args["rank_offset"], INT64_MIN)
        self.assertEqual(init_args["master_address"], UNICODE)
        self.assertIsInstance(calls[2]["args"][3]["update_info"]["extras"]["uint64"], int)
        # Minimal-width msgpack: uint64 max as 0xcf, int64 min as 0xd3, 0.1 as float64 0xcb.
        self.assertIn("cf" + "ff" * 8, calls[0]["args_hex"])
        self.assertIn("d38000000000000000", calls[0]["args_hex"])
        self.assertIn("cb3fb999999999999a", calls[0]["args_hex"])
        # The test vectors of docs/engine-protocol.md §7.1, byte for byte.
        self.assertEqual(calls[1]["args_hex"],
                         "94b373746172745f7765696768745f757064617465c09080")
        self.assertEqual(calls[7]["args_hex"], "91a6737465702d31")
        self.assertEqual(calls[10]["args_hex"], "90")  # resume_scheduler: no arguments

    def test_versions_and_large_payloads_pass_through_unchanged(self):
        daemon, (engine,), _ = self.start_external(dp=1, backend="ipc")
        version = "step-✓ 😀 \"quoted\" back\\slash /slash \u0001 \u00e9"
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": version}),
                         200, {"success": True, "new_version": version})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": version})

        # An IPC-style update of ~12 MB (MoE payloads reach ~90 MB; the default limit is 128 MiB).
        count = 50000
        info = {"names": [f"model.layers.{i}.mlp.experts.w13_weight" for i in range(count)],
                "dtype_names": ["bfloat16"] * count,
                "shapes": [[64, 2816, 2048]] * count,
                "tensor_sizes": [738197504 + i for i in range(count)],
                "ipc_handles_pickled": "gASV" + "QUJD" * 1_500_000}
        self.assert_json(daemon.post("/init_weight_transfer_engine", json={"init_info": {}}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": info}, timeout=120),
                         200, {"message": "Weights updated"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": version + "!"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": version + "!"})

        calls = engine.calls()
        self.assertEqual([m for m, _ in harness.wire(calls)], [
            "set_weight_version", "collective_rpc", "collective_rpc", "collective_rpc",
            "collective_rpc", "set_weight_version"])
        self.assertEqual(calls[0]["args"], [version])
        self.assertEqual(calls[1]["args"], ["init_weight_transfer_engine", None, [],
                                            {"init_info": {}}])
        self.assertEqual(calls[3]["args"], ["update_weights", None, [], {"update_info": info}])
        self.assertEqual(calls[5]["args"], [version + "!"])

    def test_an_engine_answer_goes_out_at_once_not_on_the_loops_next_tick(self):
        # The answer to a lifecycle call comes from the engine IO thread; the HTTP loop must be
        # woken for it. A lost wake-up is only noticed by the loop's timer tick, every 250 ms.
        daemon, _, _ = self.start_external(dp=1, record=False)
        seconds = []
        with requests.Session() as client:
            for step in range(20):
                for path, body in (("/start_weight_update", None),
                                   ("/finish_weight_update", {"weight_version": f"s{step}"})):
                    began = time.monotonic()
                    response = client.post(daemon.url + path, json=body, timeout=30)
                    seconds.append(time.monotonic() - began)
                    self.assertEqual(response.status_code, 200, response.text)
        # A lost wake-up costs a call ~250 ms; a loaded CI machine may stall a call or two.
        slow = [round(x, 3) for x in seconds if x >= 0.2]
        self.assertLessEqual(len(slow), 4, f"{len(slow)} of {len(seconds)} calls took >= 0.2 s: "
                             f"{slow}")


if __name__ == "__main__":
    unittest.main()
