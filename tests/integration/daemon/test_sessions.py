"""Owned weight-update sessions: a start with `Vllmd-Session: <id>` opens a session only that
id may continue or finish (409 for anyone else), so two trainers racing each other can no
longer mix their calls into one engine session; clients without the header keep vLLM's
anonymous behaviour; an owned session left idle becomes anonymous; GET
/weight_update_session shows the session."""

import threading
import time
import unittest

import harness
from harness import NCCL_INIT_INFO, rpc


def owned(session_id):
    return {"Vllmd-Session": session_id}


def update(*names):
    return {"update_info": harness.update_info(*names)}


class OwnedSessionTest(harness.DaemonTestCase):
    def start(self, dp=1, config=None):
        args = ("--config", self.write_config(config)) if config else ()
        daemon, engines, _ = self.start_external(dp=dp, daemon_args=args)
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": NCCL_INIT_INFO}).status_code, 200)
        return daemon, engines

    def assert_conflict(self, response):
        error = self.assert_error(response, 409, "conflict", type_="conflict")
        self.assertIn("owned by another client", error["message"])

    def test_another_client_gets_409_and_reaches_no_engine(self):
        daemon, engines = self.start(dp=2)
        self.assertEqual(daemon.post("/start_weight_update", headers=owned("trainer-a")).status_code, 200)
        self.assert_conflict(daemon.post("/update_weights", json=update("b.w"), headers=owned("trainer-b")))
        self.assert_conflict(daemon.post("/update_weights", json=update("anon.w")))
        self.assert_conflict(daemon.post("/finish_weight_update", json={"weight_version": "b-1"}))
        self.assert_conflict(daemon.post("/start_weight_update", headers=owned("trainer-b")))
        self.assertEqual(daemon.post("/update_weights", json=update("a.w"),
                                     headers=owned("trainer-a")).status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update", json={"weight_version": "a-1"},
                                     headers=owned("trainer-a")).status_code, 200)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "a-1"})
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.wire(engine.calls()), [
                    rpc("init_weight_transfer_engine", {"init_info": NCCL_INIT_INFO}),
                    rpc("start_weight_update"), rpc("update_weights", update("a.w")),
                    rpc("finish_weight_update"), ("set_weight_version", ["a-1"])])
        # Closed: anyone may open the next one.
        self.assertEqual(daemon.post("/start_weight_update", headers=owned("trainer-b")).status_code, 200)

    def test_clients_without_the_header_keep_vllms_anonymous_session(self):
        daemon, engines = self.start()
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/update_weights", json=update("x.w")).status_code, 200)
        # Any other client may continue it, with an id or without: nobody owns it.
        self.assertEqual(daemon.post("/update_weights", json=update("y.w"),
                                     headers=owned("someone")).status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update").status_code, 200)

    def test_two_racing_trainers_never_mix_their_calls_into_one_session(self):
        daemon, engines = self.start(dp=2)
        deadline = time.monotonic() + 6
        outcomes = {"a": [], "b": []}

        def trainer(name):
            headers = owned(f"trainer-{name}")
            cycle = 0
            while time.monotonic() < deadline:
                cycle += 1
                start = daemon.post("/start_weight_update", headers=headers)
                if start.status_code != 200:
                    outcomes[name].append(("start", start.status_code))
                    continue
                steps = [daemon.post("/update_weights", json=update(f"{name}.w"), headers=headers)
                         for _ in range(2)]
                finish = daemon.post("/finish_weight_update", headers=headers,
                                     json={"weight_version": f"{name}-{cycle}"})
                outcomes[name].append(("cycle", [s.status_code for s in steps], finish.status_code))

        threads = [threading.Thread(target=trainer, args=(n,)) for n in outcomes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cycles = {name: [o for o in got if o[0] == "cycle"] for name, got in outcomes.items()}
        # A client that opened a session always completes it: nothing of the other's got in.
        for name, done in cycles.items():
            self.assertTrue(done, f"trainer {name} never got a session: {outcomes[name][:5]}")
            for _, updates, finish in done:
                self.assertEqual((updates, finish), ([200, 200], 200), name)
        for name, got in outcomes.items():
            refused = [o for o in got if o[0] == "start"]
            self.assertTrue(all(o[1] == 409 for o in refused), refused[:10])
        # And the engines saw only whole sessions, each from one trainer.
        for engine in engines:
            sessions, current = [], None
            for call in engine.calls():
                name = call["worker_method"]
                if name == "start_weight_update":
                    self.assertIsNone(current, "a start inside a session")
                    current = []
                elif name == "update_weights":
                    current.append(call["args"][3]["update_info"]["names"][0][0])
                elif name == "finish_weight_update":
                    sessions.append(current)
                    current = None
            self.assertEqual(sum(len(c) for c in cycles.values()), len(sessions))
            for updates in sessions:
                self.assertEqual(len(set(updates)), 1, f"one session, two trainers: {updates}")
        print(f"\nracing trainers: {len(cycles['a'])} + {len(cycles['b'])} sessions, "
              f"{sum(1 for got in outcomes.values() for o in got if o[0] == 'start')} starts "
              f"refused with 409, 0 mixed")

    def test_an_idle_owned_session_becomes_anonymous(self):
        daemon, _ = self.start(config="[server]\nsession_idle_timeout = 1\n")
        self.assertEqual(daemon.post("/start_weight_update", headers=owned("crashed")).status_code, 200)
        self.assert_conflict(daemon.post("/finish_weight_update"))
        time.sleep(1.3)
        self.assertEqual(daemon.post("/finish_weight_update").status_code, 200)
        self.assertIn("is now anonymous (server.session_idle_timeout)", daemon.log())

    def test_the_session_route_shows_the_session(self):
        daemon, _ = self.start()
        self.assert_json(daemon.get("/weight_update_session"), 200,
                         {"open": False, "version_current": True})
        daemon.post("/start_weight_update", headers=owned("t"))
        daemon.post("/update_weights", json=update("w"), headers=owned("t"))
        session = daemon.get("/weight_update_session").json()
        self.assertEqual({k: session[k] for k in ("open", "owned", "draft", "updates",
                                                   "engine_incarnations", "version_current")},
                         {"open": True, "owned": True, "draft": False, "updates": 1,
                          "engine_incarnations": [1], "version_current": False})
        self.assertGreaterEqual(session["age_seconds"], session["idle_seconds"])
        # Finished without a version: the weights changed and no version names them yet.
        daemon.post("/finish_weight_update", headers=owned("t"))
        self.assert_json(daemon.get("/weight_update_session"), 200,
                         {"open": False, "version_current": False})
        daemon.post("/update_weight_version", json={"new_version": "v"})
        self.assert_json(daemon.get("/weight_update_session"), 200,
                         {"open": False, "version_current": True})

    def test_a_malformed_session_id_is_400(self):
        daemon, engines = self.start()
        for bad in ("x" * 129, "two words"):
            with self.subTest(id=bad):
                self.assert_error(daemon.post("/start_weight_update", headers=owned(bad)), 400,
                                  "invalid_request_error")
        self.assertEqual(harness.call_names(engines[0].calls()), ["init_weight_transfer_engine"])


if __name__ == "__main__":
    unittest.main()
