"""The README's shell examples, run as written against the vllmd this test starts: the quick
start's curl and vllmctl blocks, the real-bytes demo with its trainer, and the external-mode
start of "RL weight synchronization" with a reference engine standing in for `vllm serve`.

Two things are not run literally, and the test checks what stands in for them:
- `./scripts/run.sh [ARGS]` builds and then execs `build/daemon/vllmd --dev-mode ARGS`; the
  test starts the vllmd under test with `--dev-mode ARGS` (and the line's environment), since
  building again from inside the test suite is not this test's business;
- the port: the README says 8000 (vllmd's and vllmctl's default; and 5570 for the
  handshake), tests never bind fixed ports, so each becomes a free port of this test's
  (VLLMCTL_SERVER points vllmctl at it).
A comment `# → TEXT` after a command is what the command prints: the test checks it.

Environment (set by ctest): VLLMD_BIN, VLLMCTL_BIN, VLLM_REF_ENGINE_BIN; README (the file to
read) defaults to the repository's.
"""

import os
import re
import subprocess
import unittest

from harness import HOST, DaemonTestCase, binary, clean_env, free_port, wait_until

README = os.environ.get("README") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "README.md")
ROOT = os.path.dirname(os.path.abspath(README))
OUTPUT = re.compile(r"\s+# → (.*)$")


def sh_blocks(heading):
    """The ```sh blocks under a README heading, up to the next heading of any level (a `#`
    line inside a block is a shell comment, not a heading)."""
    with open(README, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    blocks, block, inside, fenced = [], None, False, False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            if inside and line == "```sh":
                block = []
            elif inside and block is not None:
                blocks.append("\n".join(block) + "\n")
                block = None
            continue
        if not fenced and re.match(r"#+ ", line):
            if inside:
                break
            inside = line.split(" ", 1)[1] == heading
        elif block is not None:
            block.append(line)
    if not blocks:
        raise AssertionError(f"README has no sh block under a heading {heading!r}")
    return blocks


def commands(block):
    """(command, expected output or None) per command; continuation lines joined."""
    result, pending = [], ""
    for line in block.splitlines():
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        expected = OUTPUT.search(pending)
        command = pending[:expected.start()] if expected else re.sub(r"\s+#\s.*$", "", pending)
        if command.strip():
            result.append((command.strip(), expected.group(1).strip() if expected else None))
        pending = ""
    return result


class ReadmeTest(DaemonTestCase):
    workdir_prefix = "vllmd-readme-"

    def setUp(self):
        super().setUp()
        self.port = None  # the daemon's, once started
        # vllmctl as an installed one is found, and examples/ as in a clone.
        bindir = os.path.join(self.workdir, "bin")
        os.mkdir(bindir)
        os.symlink(binary("VLLMCTL_BIN"), os.path.join(bindir, "vllmctl"))
        os.symlink(os.path.join(ROOT, "examples"), os.path.join(self.workdir, "examples"))
        self.path = f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def ported(self, command):
        return re.sub(r"\b8000\b", str(self.port), command) if self.port else command

    def run_sh(self, command, expected=None):
        env = {"PATH": self.path}
        if self.port:
            # vllmctl's default server is the README's 127.0.0.1:8000: the same port swap.
            env["VLLMCTL_SERVER"] = f"http://{HOST}:{self.port}"
        env = clean_env(env)
        result = subprocess.run(["bash", "-o", "pipefail", "-c", self.ported(command)],
                                env=env, cwd=self.workdir, capture_output=True, text=True,
                                timeout=120)
        self.assertEqual(result.returncode, 0,
                         f"{command}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        if expected is not None:
            self.assertIn(self.ported(expected), result.stdout, command)
        return result

    def run_block(self, block):
        for command, expected in commands(block):
            self.run_sh(command, expected)

    def start_as_run_sh(self, line):
        """A `[VAR=value ...] ./scripts/run.sh [ARGS]` line: vllmd --dev-mode ARGS, healthy."""
        with open(os.path.join(ROOT, "scripts", "run.sh"), encoding="utf-8") as handle:
            self.assertIn('exec "${BUILD_DIR:-build}/daemon/vllmd" --dev-mode "$@"',
                          handle.read())
        words = line.split()
        at = words.index("./scripts/run.sh")
        env = dict(word.split("=", 1) for word in words[:at])
        daemon = self.launch_daemon(["--dev-mode", *words[at + 1:]], env=env)
        daemon.wait_healthy()
        return daemon

    def test_quick_start(self):
        start, curl, ctl = sh_blocks("Quick start")
        (run, _), (test, _) = commands(start)
        self.assertEqual(test, "./scripts/test.sh")  # what runs this test
        daemon = self.start_as_run_sh(run)
        self.port = daemon.port  # the README's 8000 is vllmd's default port
        self.run_block(curl)
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "step-1"})
        self.run_block(ctl)
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "step-2"})

    def test_real_bytes(self):
        (block,) = sh_blocks("Real bytes, no GPU")
        (run, _), *rest = commands(block)
        daemon = self.start_as_run_sh(run)
        self.port = daemon.port
        for command, expected in rest:
            result = self.run_sh(command, expected)
            if "tcp_trainer.py" in command:
                self.assertIn("step 3:", result.stdout)
                self.assertIn("checksums match; serving step-3", result.stdout)
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "step-3"})

    def test_several_servers(self):
        """Each of the README's hosts becomes a daemon of this test's, at its own port."""
        (block,) = sh_blocks("Several inference servers")
        daemons = {}
        for host in sorted(set(re.findall(r"http://(10\.0\.0\.\d+):8000", block))):
            daemons[host] = self.launch_daemon(["--dev-mode"], name=f"vllmd-{host}")
            daemons[host].wait_healthy()
        self.assertEqual(len(daemons), 3)
        # The quick start's files.
        _, _, ctl = sh_blocks("Quick start")
        for command, _ in commands(ctl):
            if command.startswith("echo"):
                self.run_sh(command)
        for host, daemon in daemons.items():
            block = block.replace(f"http://{host}:8000", daemon.url)
        self.run_block(block)
        for daemon in daemons.values():
            self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "step-3"})

    def test_external_mode_with_an_engine_in_place_of_vllm_serve(self):
        vllmd_block, serve_block = sh_blocks("vllmd in front of real vLLM engines")[:2]
        ((vllmd_line, _),) = commands(vllmd_block)
        ((serve_line, _),) = commands(serve_block)
        handshake_port = free_port()
        words = vllmd_line.replace("5570", str(handshake_port)).split()
        self.assertEqual(words[0], "vllmd")
        # Loopback only in tests: the README's 0.0.0.0 becomes 127.0.0.1.
        args = [word.replace("0.0.0.0", HOST) for word in words[1:]]
        port = args.index("--port")
        del args[port:port + 2]  # the harness gives it --port 0 and reads the port it took
        daemon = self.launch_daemon(args)
        # `vllm serve MODEL --headless --data-parallel-address A --data-parallel-rpc-port P
        # --weight-transfer-config '{"backend":"nccl"}'` is the reference engine's
        # --handshake tcp://A:P --backend nccl.
        serve = serve_line.split()
        address = serve[serve.index("--data-parallel-address") + 1].replace("10.0.0.5", HOST)
        self.assertIn('{"backend":"nccl"}', serve_line)
        self.start_engine(f"tcp://{address}:{handshake_port}", backend="nccl")
        wait_until(lambda: daemon.health_status() == 200, 20, message="GET /health -> 200")
        self.assertEqual(daemon.get("/get_world_size").json(), {"world_size": 1})


if __name__ == "__main__":
    unittest.main()
