"""Session affinity end to end: SkyRL, prime-rl and vime send X-Session-ID with every turn of
a multi-turn rollout, so that its prefix stays in one engine's cache. Real vllmd and two
vllm-ref-engine processes (DP=2); which engine got each request is read from the engines' own
records of the ADDs they received."""

import os
import threading
import unittest

from harness import wait_until
from test_generate import GenerateTestCase, body, records


def engine_of(engines, request_id):
    """The rank whose engine received the request whose X-Request-Id was `request_id`."""
    ranks = [rank for rank, engine in enumerate(engines)
             if any(f"-{request_id}-" in add["request_id"] for add in records(engine, "ADD"))]
    return ranks[0] if len(ranks) == 1 else ranks


class SessionAffinity(GenerateTestCase):
    def post(self, daemon, session, request_id, header="X-Session-ID", **kwargs):
        return self.generate(daemon, body([3, 1, 4], max_tokens=4),
                             headers={header: session, "X-Request-Id": request_id}, **kwargs)

    def test_a_session_keeps_one_engine_and_moves_when_its_engine_dies(self):
        daemon, engines = self.start(dp=2)
        statuses = []
        lock = threading.Lock()

        def turns(session):
            # One rollout's turns, one after another, header spelled as each client spells it.
            for turn in range(10):
                header = ("X-Session-ID", "x-session-id", "X-Session-Id")[turn % 3]
                status = self.post(daemon, f"sess{session}", f"sess{session}-turn{turn}",
                                   header).status_code
                with lock:
                    statuses.append(status)
        threads = [threading.Thread(target=turns, args=(session,)) for session in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual(statuses, [200] * 100)
        placement = {}
        for session in range(10):
            ranks = {engine_of(engines, f"sess{session}-turn{turn}") for turn in range(10)}
            self.assertEqual(len(ranks), 1, f"session {session} went to engines {ranks}")
            placement[session] = ranks.pop()
        self.assertEqual(set(placement.values()), {0, 1}, placement)

        # The engine of session 0 dies: its next turn goes to the other one, and stays there.
        lost = placement[0]
        engines[lost].kill()
        wait_until(lambda: daemon.get("/health").status_code in (200, 503), 5)
        for turn in (10, 11):
            response = self.post(daemon, "sess0", f"sess0-turn{turn}")
            self.assertEqual(response.status_code, 200, response.text)
            self.assertEqual(engine_of(engines, f"sess0-turn{turn}"), 1 - lost)
        wait_until(lambda: "session sess0 moves to engine rank" in daemon.log(), 5,
                   message="the move in vllmd's log")
        self.assertIn(f"engine rank {lost} is not ready", daemon.log())

    def test_completions_keep_a_session_on_one_engine_too(self):
        # SkyRL's Tinker forwarding sends X-Session-ID on /v1/completions.
        daemon, engines = self.start(dp=2)
        for turn in range(6):
            for session in range(4):
                response = daemon.post("/v1/completions",
                                       json={"prompt": [3, 1, 4], "max_tokens": 2},
                                       headers={"X-Session-ID": f"c{session}",
                                                "X-Request-Id": f"c{session}-turn{turn}"})
                self.assertEqual(response.status_code, 200, response.text)
        placement = {}
        for session in range(4):
            ranks = {engine_of(engines, f"c{session}-turn{turn}") for turn in range(6)}
            self.assertEqual(len(ranks), 1, f"session c{session} went to engines {ranks}")
            placement[session] = ranks.pop()
        self.assertEqual(set(placement.values()), {0, 1}, placement)

    def test_a_far_more_loaded_engine_loses_the_session(self):
        # engine.session_imbalance 2: a session moves once its engine holds 3 more requests.
        config = os.path.join(self.workdir, "vllmd.toml")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write("[engine]\nsession_imbalance = 2\n")
        daemon, engines = self.start(dp=2, engine_flags=["--step-ms", "20"],
                                     daemon_args=["--config", config])
        self.assertEqual(self.post(daemon, "s", "first").status_code, 200)
        home = engine_of(engines, "first")
        # Long requests pinned to the session's engine load it.
        threads = [threading.Thread(target=lambda i=i: self.generate(
            daemon, body([i], max_tokens=200), headers={"X-data-parallel-rank": str(home)}))
            for i in range(4)]
        for thread in threads:
            thread.start()
        self.wait_for(engines[home], "ADD", count=5)
        self.assertEqual(self.post(daemon, "s", "second").status_code, 200)
        self.assertEqual(engine_of(engines, "second"), 1 - home)
        self.assertIn("session s moves to engine rank", daemon.log())
        self.assertIn("(engine.session_imbalance 2)", daemon.log())
        for thread in threads:
            thread.join(30)

    def test_a_session_id_longer_than_256_bytes_is_refused_before_any_engine(self):
        daemon, engines = self.start(dp=2)
        response = self.post(daemon, "s" * 257, "long")
        self.assertEqual(response.status_code, 400)
        self.assertEqual(response.json()["error"]["param"], "X-Session-ID")
        self.assertEqual([records(engine, "ADD") for engine in engines], [[], []])


if __name__ == "__main__":
    unittest.main()
