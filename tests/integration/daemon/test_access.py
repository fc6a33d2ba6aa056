"""Access control (docs/product.md §6, docs/http-api.md §1.2 and §1.3): the source-address
allowlist (server.allowlist) and API keys protect every route but /health; a peer outside the
allowlist gets 403, a missing or wrong token 401, and neither reaches the engine. The allowlist
is reloadable. Dev mode on a non-loopback address with neither keys nor an allowlist is refused
at start (78, naming server.host) unless --insecure-dev-mode is given.

Traffic only ever goes to loopback: a daemon bound to 0.0.0.0 is reached via 127.0.0.1 and
stopped right away."""

import socket
import subprocess
import unittest

import harness

WEIGHT_INFO = {"weight_version": "default"}


def ipv6_available():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::", 0))
        return True
    except OSError:
        return False


class AccessTest(harness.DaemonTestCase):

    def run_vllmd(self, *args):
        return subprocess.run([harness.vllmd_bin(), *args], capture_output=True, text=True,
                              timeout=30, env=harness.clean_env())

    def assert_reaches_engine(self, daemon, engine, headers=None):
        # /weight_info answers from known state; /resume always calls the engine.
        self.assert_json(daemon.post("/resume", headers=headers), 200, {"status": "resumed"})
        self.assertIn("resume_scheduler", harness.call_names(engine.calls()))

    # --- allowlist ---------------------------------------------------------------------

    def test_loopback_in_the_allowlist_is_served(self):
        daemon, (engine,), _ = self.start_external(
            daemon_args=["--allow", "127.0.0.0/8", "--allow", "::1/128"])
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)
        self.assert_reaches_engine(daemon, engine)
        self.assertEqual(daemon.get("/health").status_code, 200)

    def test_peer_outside_the_allowlist_gets_403_and_never_reaches_the_engine(self):
        daemon, (engine,), _ = self.start_external(daemon_args=["--allow", "10.0.0.0/8"])
        error = self.assert_error(daemon.get("/weight_info"), 403, "forbidden",
                                  type_="authentication_error")
        self.assertIn("127.0.0.1", error["message"])
        self.assert_error(daemon.post("/update_weights",
                                      json={"update_info": harness.update_info()}),
                          403, "forbidden", type_="authentication_error")
        # Every route but /health, known or not.
        for path in ("/version", "/metrics", "/no_such_route"):
            with self.subTest(path=path):
                self.assert_error(daemon.get(path), 403, "forbidden",
                                  type_="authentication_error")
        self.assertEqual(daemon.get("/health").status_code, 200)
        self.assertEqual(engine.calls(), [], "a denied peer reached the engine")

    def test_ipv4_mapped_peer_matches_an_ipv4_block(self):
        if not ipv6_available():
            self.skipTest("no IPv6 on this host")
        # A dual-stack listener on :: sees 127.0.0.1 as ::ffff:127.0.0.1.
        daemon = self.start_daemon(["--dev-mode", "--host", "::", "--allow", "127.0.0.0/8"])
        daemon.wait_healthy()
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)
        daemon.stop()
        denied = self.start_daemon(["--dev-mode", "--host", "::", "--allow", "10.0.0.0/8"],
                                   name="vllmd-denied")
        denied.wait_healthy()
        self.assert_error(denied.get("/weight_info"), 403, "forbidden",
                          type_="authentication_error")
        denied.stop()

    def test_env_variable_takes_a_comma_separated_list(self):
        daemon = self.start_daemon(["--dev-mode"], env=harness.clean_env(
            {"VLLMD_ALLOWLIST": "10.0.0.0/8, 127.0.0.1/32"}))
        daemon.wait_healthy()
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)

    def test_print_config_shows_the_allowlist_from_flags_and_variable(self):
        result = self.run_vllmd("--allow", "10.1.0.0/16,::1/128", "--allow", "127.0.0.0/8",
                                "--print-config")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("allowlist = [ '10.1.0.0/16', '::1/128', '127.0.0.0/8' ]", result.stdout)
        self.assertIn("insecure_dev_mode = false", result.stdout)

    def test_bad_cidr_is_a_configuration_error(self):
        for index, args in enumerate((["--allow", "10.0.0.0/33"],
                                      ["--allow", "127.0.0.0/8,not-an-address"])):
            with self.subTest(args=args):
                result = self.run_vllmd(*args, "--check-config")
                self.assertEqual(result.returncode, 78, result.stderr)
                self.assertIn("server.allowlist", result.stderr)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        config = self.write_config('[server]\nallowlist = ["::/129"]\n')
        result = self.run_vllmd("--config", config)
        self.assertEqual(result.returncode, 78, result.stderr)
        self.assertIn("server.allowlist", result.stderr)

    def test_allowlist_is_reloadable(self):
        config = self.write_config('[server]\ndev_mode = true\n')
        daemon = self.start_daemon(["--config", config])
        daemon.wait_healthy()
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)

        self.write_config('[server]\ndev_mode = true\nallowlist = ["10.0.0.0/8"]\n')
        self.hup_and_wait_for(daemon, "configuration reloaded")
        self.assert_error(daemon.get("/weight_info"), 403, "forbidden",
                          type_="authentication_error")
        self.assertEqual(daemon.get("/health").status_code, 200)

        # A broken list is refused as a whole: the running one stays.
        self.write_config('[server]\ndev_mode = true\nallowlist = ["127.0.0.0/8", "10.0.0/8"]\n')
        self.hup_and_wait_for(daemon, "reload failed")
        self.assertIn("server.allowlist", daemon.log())
        self.assertEqual(daemon.get("/weight_info").status_code, 403)

        # POST /reload is itself protected: a denied peer cannot reload.
        self.write_config('[server]\ndev_mode = true\nallowlist = ["127.0.0.0/8"]\n')
        self.assert_error(daemon.post("/reload"), 403, "forbidden",
                          type_="authentication_error")
        self.hup_and_wait_for(daemon, "configuration reloaded")
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)

        # Emptied: everyone again.
        self.write_config('[server]\ndev_mode = true\nallowlist = []\n')
        self.assertEqual(daemon.post("/reload").status_code, 200)
        self.assert_json(daemon.get("/weight_info"), 200, WEIGHT_INFO)

    # --- keys ------------------------------------------------------------------------

    def test_missing_or_wrong_token_gets_401_and_never_reaches_the_engine(self):
        daemon, (engine,), _ = self.start_external(daemon_args=["--api-key", "s3cret"])
        self.assert_error(daemon.get("/weight_info"), 401, "unauthorized",
                          type_="authentication_error")
        for header in ("Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret",
                       "s3cret", "Bearer "):
            with self.subTest(header=header):
                self.assert_error(daemon.get("/weight_info", headers={"Authorization": header}),
                                  401, "unauthorized", type_="authentication_error")
        self.assert_error(daemon.post("/update_weights",
                                      json={"update_info": harness.update_info()}),
                          401, "unauthorized", type_="authentication_error")
        self.assertEqual(daemon.get("/health").status_code, 200)
        self.assertEqual(engine.calls(), [], "an unauthenticated request reached the engine")
        ok = daemon.get("/weight_info", headers={"Authorization": "Bearer s3cret"})
        self.assert_json(ok, 200, WEIGHT_INFO)
        self.assert_reaches_engine(daemon, engine, {"Authorization": "Bearer s3cret"})

    def test_keys_and_allowlist_must_both_pass(self):
        good = {"Authorization": "Bearer s3cret"}
        daemon, (engine,), _ = self.start_external(
            daemon_args=["--api-key", "s3cret", "--allow", "127.0.0.0/8"])
        self.assert_json(daemon.get("/weight_info", headers=good), 200, WEIGHT_INFO)
        self.assert_error(daemon.get("/weight_info"), 401, "unauthorized",
                          type_="authentication_error")

    def test_the_right_key_from_outside_the_allowlist_is_still_403(self):
        good = {"Authorization": "Bearer s3cret"}
        denied, (denied_engine,), _ = self.start_external(
            daemon_args=["--api-key", "s3cret", "--allow", "10.0.0.0/8"])
        # The right key from the wrong address: still 403.
        self.assert_error(denied.get("/weight_info", headers=good), 403, "forbidden",
                          type_="authentication_error")
        self.assert_error(denied.get("/weight_info"), 403, "forbidden",
                          type_="authentication_error")
        self.assertEqual(denied.get("/health").status_code, 200)
        self.assertEqual(denied_engine.calls(), [])

    # --- dev mode on a non-loopback address --------------------------------------------

    def test_dev_mode_on_a_public_address_without_protection_is_refused(self):
        result = self.run_vllmd("--dev-mode", "--host", "0.0.0.0", "--port", "0")
        self.assertEqual(result.returncode, 78, result.stdout + result.stderr)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn("server.host", lines[0])
        self.assertIn("--insecure-dev-mode", lines[0])
        self.assertIn("server.allowlist", lines[0])
        # The same from the environment and a file; and --check-config says so too.
        env = harness.clean_env({"VLLMD_HOST": "0.0.0.0", "VLLM_SERVER_DEV_MODE": "1"})
        result = subprocess.run([harness.vllmd_bin(), "--check-config"], capture_output=True,
                                text=True, timeout=30, env=env)
        self.assertEqual(result.returncode, 78, result.stderr)
        self.assertIn("server.host", result.stderr)
        # Without dev mode, or on loopback, nothing to refuse.
        for args in (["--host", "0.0.0.0"], ["--dev-mode", "--host", "127.0.0.2"],
                     ["--dev-mode", "--host", "localhost"], ["--dev-mode", "--host", "::1"]):
            with self.subTest(args=args):
                result = self.run_vllmd(*args, "--check-config")
                self.assertEqual(result.returncode, 0, result.stderr)

    def test_insecure_dev_mode_starts_and_warns(self):
        daemon = self.start_daemon(["--dev-mode", "--host", "0.0.0.0", "--insecure-dev-mode"])
        daemon.wait_healthy()
        daemon.stop()
        self.assertTrue(any("warning" in line.lower() and "insecure dev mode" in line.lower()
                            for line in daemon.log().splitlines()), daemon.log())
        env = harness.clean_env({"VLLMD_INSECURE_DEV_MODE": "true"})
        daemon = self.start_daemon(["--dev-mode", "--host", "0.0.0.0"], env=env, name="vllmd2")
        daemon.wait_healthy()
        daemon.stop()
        self.assertIn("insecure dev mode", daemon.log())

    def test_dev_mode_on_a_public_address_with_a_key_or_allowlist_starts(self):
        for index, extra in enumerate((["--api-key", "s3cret"], ["--allow", "127.0.0.0/8"])):
            with self.subTest(extra=extra):
                daemon = self.start_daemon(["--dev-mode", "--host", "0.0.0.0", *extra],
                                           name=f"vllmd{index}")
                daemon.wait_healthy()
                daemon.stop()
                self.assertNotIn("insecure dev mode", daemon.log())


if __name__ == "__main__":
    unittest.main()
