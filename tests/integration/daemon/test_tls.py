"""HTTPS (server.tls_cert_file / server.tls_key_file): vllmd serves the API over TLS only, a
plain HTTP request on that port gets a clear 400, the systemd watchdog's self-check still
works, and vllmctl talks https, trusting a --cacert file (or VLLMCTL_CACERT) and nothing else:
an untrusted certificate or one naming another host exits 78. Certificates are made per test
with openssl; bad or missing certificate files are configuration errors (78)."""

import os
import socket
import subprocess
import unittest

import requests

import harness

WEIGHT_INFO = {"weight_version": "default"}


def make_certificate(directory, name, common_name, alt_names):
    """A self-signed certificate and its key, as two PEM files."""
    cert = os.path.join(directory, f"{name}.pem")
    key = os.path.join(directory, f"{name}.key")
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
               "-keyout", key, "-out", cert, "-subj", f"/CN={common_name}"]
    if alt_names:
        command += ["-addext", "subjectAltName=" + ",".join(alt_names)]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    return cert, key


class TlsTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        self.cert, self.key = make_certificate(self.workdir, "server", "localhost",
                                               ["DNS:localhost", f"IP:{harness.HOST}"])

    def start_tls(self, *tls_args, env=None):
        daemon = self.launch_daemon(["--dev-mode", *tls_args], env=env)
        daemon.https = f"https://{harness.HOST}:{daemon.port}"
        harness.wait_until(lambda: self.https_status(daemon, "/health") == 200, 20,
                           message="GET https /health -> 200")
        return daemon

    def https_status(self, daemon, path):
        try:
            return requests.get(daemon.https + path, verify=self.cert, timeout=5).status_code
        except requests.RequestException:
            return None

    def vllmctl(self, *args, env=None):
        return subprocess.run([harness.binary("VLLMCTL_BIN"), *args], capture_output=True,
                              text=True, timeout=60, env=harness.clean_env(env))

    def test_the_lifecycle_runs_over_https(self):
        daemon = self.start_tls("--tls-cert-file", self.cert, "--tls-key-file", self.key)
        # verify= on each call: a session's own setting loses to REQUESTS_CA_BUNDLE.
        session = requests.Session()
        init_info = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                     "world_size": 2}
        for path, body, expected in [
            ("/init_weight_transfer_engine", {"init_info": init_info},
             {"message": "Weight transfer initialized"}),
            ("/start_weight_update", None, {"message": "Weight update started"}),
            ("/update_weights", {"update_info": harness.update_info("w")},
             {"message": "Weights updated"}),
            ("/finish_weight_update", {"weight_version": "tls-1"},
             {"message": "Weight update finished"}),
        ]:
            with self.subTest(path=path):
                self.assert_json(session.post(daemon.https + path, json=body, verify=self.cert,
                                              timeout=30), 200,
                                 expected)
        self.assert_json(session.get(daemon.https + "/weight_info", verify=self.cert,
                                             timeout=30), 200,
                         {"weight_version": "tls-1"})

    def test_plain_http_on_the_https_port_is_told_so(self):
        daemon = self.start_tls("--tls-cert-file", self.cert, "--tls-key-file", self.key)
        response = requests.get(f"http://{harness.HOST}:{daemon.port}/health", timeout=10)
        self.assertEqual(response.status_code, 400)
        self.assertIn("https", response.json()["error"]["message"])
        self.assertEqual(self.https_status(daemon, "/health"), 200)  # still serving

    def test_a_certificate_file_holding_the_key_too_is_enough(self):
        bundle = os.path.join(self.workdir, "bundle.pem")
        with open(bundle, "w", encoding="ascii") as out:
            for path in (self.cert, self.key):
                with open(path, encoding="ascii") as part:
                    out.write(part.read())
        daemon = self.start_tls(env=harness.clean_env({"VLLMD_TLS_CERT_FILE": bundle}))
        self.assertEqual(self.https_status(daemon, "/weight_info"), 200)

    def test_the_watchdog_self_check_uses_https(self):
        notify = harness.NotifySocket(os.path.join(self.workdir, "notify.sock"))
        self.addCleanup(notify.close)
        self.start_tls("--tls-cert-file", self.cert, "--tls-key-file", self.key,
                       env=harness.clean_env({"NOTIFY_SOCKET": notify.path,
                                              "WATCHDOG_USEC": "400000"}))
        harness.wait_until(lambda: len(notify.values("WATCHDOG")) >= 3, 10,
                           message="three WATCHDOG=1 messages over https")

    def test_vllmctl_trusts_its_cacert_and_nothing_else(self):
        daemon = self.start_tls("--tls-cert-file", self.cert, "--tls-key-file", self.key)
        ok = self.vllmctl("--server", daemon.https, "--cacert", self.cert, "world-size")
        self.assertEqual((ok.returncode, ok.stdout.strip()), (0, "1"), ok.stderr)
        by_name = self.vllmctl("--server", f"https://localhost:{daemon.port}", "world-size",
                               env={"VLLMCTL_CACERT": self.cert})
        self.assertEqual(by_name.returncode, 0, by_name.stderr)

        other, _ = make_certificate(self.workdir, "other", "other", [])
        for name, args in [("system CAs only", []), ("another CA", ["--cacert", other])]:
            with self.subTest(name):
                result = self.vllmctl("--server", daemon.https, *args, "world-size")
                self.assertEqual(result.returncode, 78, result.stderr)
                self.assertIn("certificate verify failed", result.stderr)

    def test_vllmctl_refuses_a_certificate_for_another_host(self):
        cert, key = make_certificate(self.workdir, "elsewhere", "elsewhere.example",
                                     ["DNS:elsewhere.example"])
        daemon = self.launch_daemon(["--dev-mode", "--tls-cert-file", cert,
                                     "--tls-key-file", key])
        https = f"https://{harness.HOST}:{daemon.port}"
        harness.wait_until(
            lambda: requests.get(https + "/health", verify=False, timeout=5).status_code == 200,
            20, message="GET https /health -> 200")
        result = self.vllmctl("--server", https, "--cacert", cert, "world-size")
        self.assertEqual(result.returncode, 78, result.stderr)
        self.assertIn("TLS", result.stderr)

    def test_vllmctl_cacert_errors_are_configuration_errors(self):
        for name, args in [
            ("unreadable", ["--server", "https://127.0.0.1:1", "--cacert",
                            os.path.join(self.workdir, "missing.pem")]),
            ("with http", ["--server", "http://127.0.0.1:1", "--cacert", self.cert]),
        ]:
            with self.subTest(name):
                result = self.vllmctl(*args, "world-size")
                self.assertEqual(result.returncode, 78, result.stderr)
                self.assertIn("--cacert", result.stderr)

    def test_bad_certificate_files_are_configuration_errors(self):
        garbage = os.path.join(self.workdir, "garbage.pem")
        with open(garbage, "w", encoding="ascii") as out:
            out.write("not a certificate\n")
        missing = os.path.join(self.workdir, "missing.pem")
        for name, args, key in [
            ("missing certificate", ["--tls-cert-file", missing], "server.tls_cert_file"),
            ("key without certificate", ["--tls-key-file", self.key], "server.tls_cert_file"),
            ("missing key", ["--tls-cert-file", self.cert, "--tls-key-file", missing],
             "server.tls_key_file"),
        ]:
            with self.subTest(name):
                result = subprocess.run([harness.vllmd_bin(), "--dev-mode", *args,
                                         "--check-config"], capture_output=True, text=True,
                                        timeout=30, env=harness.clean_env())
                self.assertEqual(result.returncode, 78, result.stderr)
                self.assertIn(key, result.stderr)
        # Readable but not PEM: found when the listener starts, still a configuration error.
        port = harness.free_port()
        result = subprocess.run([harness.vllmd_bin(), "--dev-mode", "--port", str(port),
                                 "--tls-cert-file", garbage, "--tls-key-file", self.key],
                                capture_output=True, text=True, timeout=30,
                                env=harness.clean_env())
        self.assertEqual(result.returncode, 78, result.stderr)
        self.assertIn("server.tls_cert_file", result.stderr)
        with socket.socket() as probe:  # nothing left listening
            self.assertNotEqual(probe.connect_ex((harness.HOST, port)), 0)


if __name__ == "__main__":
    unittest.main()
