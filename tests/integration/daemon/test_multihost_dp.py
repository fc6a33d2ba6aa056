"""Coordinated (MoE) data parallelism across hosts (docs/engine-protocol.md §6.3): with
engine.data_parallel_master, the INIT vllmd sends every engine names one DP master, so ranks
started by separate launchers on separate hosts form one DP group; without it every rank picks
its own master ports, as a headless `vllm serve` does, and the group never forms.

Three network namespaces stand in for three hosts on one private subnet (a bridge in the
vllmd host's namespace, a veth to each engine host): vllmd in `vllmd-host`, ranks 0 and 1 in
`engines-a` (the DP master's host), ranks 2 and 3 in `engines-b`. Every process runs under
`ip netns exec` (which execs, so the pid the harness tracks and kills is the program's own).
The test process stays in the root namespace; its HTTP calls to vllmd (on 127.0.0.1 of
`vllmd-host`) go through one worker thread that entered that namespace with setns(2), so the
root namespace gets no interface, address or route. Needs root and iproute2; skipped otherwise.
"""

import concurrent.futures
import ctypes
import datetime
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import unittest

import requests

import harness

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"  # where `ip netns add` puts its bind mounts

HANDSHAKE_PORT = 29400
MASTER_PORT = 29550  # the DP group forms at MASTER_PORT + 4, on engines-a
DP = 4
HOSTS = ("vllmd-host", "engines-a", "engines-b")
RANKS = {"engines-a": (0, 1), "engines-b": (2, 3)}
INIT_INFO = {"master_address": None, "master_port": 29500, "rank_offset": 1, "world_size": 5}
UPDATE_INFO = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 4]]}

# The words `ip route` may print before a route's destination.
ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "anycast", "unreachable",
               "blackhole", "prohibit", "throw", "nat"}

_libc = ctypes.CDLL(None, use_errno=True)


class Unavailable(Exception):
    """The machine cannot build the topology (not a test failure: the test is skipped)."""


def ip(*args):
    result = subprocess.run(["ip", *args], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=10)
    if result.returncode != 0:
        raise subprocess.SubprocessError(
            f"`ip {' '.join(args)}` exited with {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def enter_netns(name):
    """Moves the calling thread (only) into network namespace `name`."""
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({name}): {os.strerror(error)}")
    finally:
        os.close(fd)


def pick_subnet():
    """A 10.213.X.0/24 that overlaps none of this machine's IPv4 routes."""
    used = []
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        words = line.split()
        if not words:
            continue
        word = words[0]
        if word in ROUTE_TYPES and len(words) > 1:
            word = words[1]
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            pass  # "default" and the like
    used = [net for net in used if net.prefixlen > 0]
    start = os.getpid() % 200
    for offset in range(250):
        subnet = ipaddress.ip_network(f"10.213.{(start + offset) % 250 + 1}.0/24")
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise Unavailable("no free 10.213.X.0/24 subnet (all overlap this machine's routes)")


def read_lines(path):
    """The complete JSON lines of an engine's --record file: (DP group lines, call lines)."""
    lines = harness.read_record(path)
    return ([line["dp_group"] for line in lines if "dp_group" in line],
            [line for line in lines if "method" in line])


def timestamp(text):
    """Seconds since the epoch of a log line's timestamp (2026-12-01T13:26:45.766Z)."""
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def without_probes(calls):
    return [call for call in calls if call["method"] != "is_scheduler_paused"]


class NetnsDaemon(harness.Daemon):
    """vllmd run in a network namespace; HTTP goes through a thread inside that namespace."""

    def __init__(self, workdir, netns, args, http):
        self.port_file = os.path.join(workdir, "vllmd.port")
        argv = ["ip", "netns", "exec", netns, harness.vllmd_bin(), *args,
                "--port", "0", "--port-file", self.port_file]
        harness.Process.__init__(self, "vllmd", argv, os.path.join(workdir, "vllmd.log"))
        self.port = None
        self.url = None
        self._http = http

    def get(self, path, **kwargs):
        kwargs.setdefault("timeout", 10)
        return self._http.submit(requests.get, self.url + path, **kwargs).result()

    def post(self, path, **kwargs):
        kwargs.setdefault("timeout", 10)
        return self._http.submit(requests.post, self.url + path, **kwargs).result()


class MultiHostTestCase(harness.DaemonTestCase):
    """Builds the three hosts before each test and removes them after it, whatever happened."""

    workdir_prefix = "vllmd-it-netns-"

    def setUp(self):
        # Registered first, so it runs last: after every process was killed and reaped (a
        # namespace outlives `ip netns del` while a process is still in it).
        self._namespaces = []
        self.addCleanup(self._remove_hosts)
        super().setUp()
        self.started = time.monotonic()
        if os.geteuid() != 0:
            self.skipTest(f"network namespaces need root (euid {os.geteuid()})")
        if shutil.which("ip") is None:
            self.skipTest("no `ip` (iproute2) on PATH: cannot create network namespaces")
        try:
            self._build_hosts()
        except Unavailable as missing:
            self.skipTest(str(missing))
        self.http = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="netns-http", initializer=enter_netns,
            initargs=(self.netns["vllmd-host"],))
        self.addCleanup(self.http.shutdown)

    def _build_hosts(self):
        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.netns = {host: f"{host}-{tag}" for host in HOSTS}
        for host in HOSTS:
            try:
                ip("netns", "add", self.netns[host])
            except subprocess.SubprocessError as error:
                if not self._namespaces:
                    raise Unavailable(f"cannot create a network namespace: {error}") from None
                raise
            self._namespaces.append(self.netns[host])
            ip("-n", self.netns[host], "link", "set", "lo", "up")
        subnet = pick_subnet()
        hosts = list(subnet.hosts())
        self.addr = {"vllmd-host": str(hosts[0]), "engines-a": str(hosts[1]),
                     "engines-b": str(hosts[2])}
        hub = self.netns["vllmd-host"]
        try:
            ip("-n", hub, "link", "add", "br0", "type", "bridge")
        except subprocess.SubprocessError as error:
            raise Unavailable(f"cannot create a bridge in a namespace: {error}") from None
        for host, port in (("engines-a", "to-a"), ("engines-b", "to-b")):
            try:
                # Both ends made in place: no name is ever taken in the root namespace.
                ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                   "netns", self.netns[host])
            except subprocess.SubprocessError as error:
                raise Unavailable(f"cannot create a veth pair between namespaces: {error}") \
                    from None
            ip("-n", hub, "link", "set", port, "master", "br0")
            ip("-n", hub, "link", "set", port, "up")
            ip("-n", self.netns[host], "addr", "add", f"{self.addr[host]}/{subnet.prefixlen}",
               "dev", "eth0")
            ip("-n", self.netns[host], "link", "set", "eth0", "up")
        ip("-n", hub, "addr", "add", f"{self.addr['vllmd-host']}/{subnet.prefixlen}",
           "dev", "br0")
        ip("-n", hub, "link", "set", "br0", "up")
        try:
            ip("netns", "exec", hub, "true")
        except subprocess.SubprocessError as error:
            raise Unavailable(f"cannot run a program in a namespace: {error}") from None

    def _remove_hosts(self):
        leftovers, errors = [], []
        for name in reversed(self._namespaces):
            try:
                pids = [int(pid) for pid in ip("netns", "pids", name).split()]
            except subprocess.SubprocessError:
                pids = []
            for pid in pids:
                if pid == os.getpid():
                    continue
                leftovers.append(f"{pid} in {name}")
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            try:
                ip("netns", "del", name)  # also removes its veth ends and the bridge
            except subprocess.SubprocessError as error:  # the others are still removed
                errors.append(str(error))
        self._namespaces.clear()
        if errors:
            raise RuntimeError("cannot remove the namespaces: " + "; ".join(errors))
        if leftovers:
            raise AssertionError("processes outlived the test: " + ", ".join(leftovers))

    # The processes: each under `ip netns exec`, tracked by the harness (killed and reaped).
    def start_vllmd(self, extra=()):
        handshake = f"tcp://{self.addr['vllmd-host']}:{HANDSHAKE_PORT}"
        daemon = self._track(NetnsDaemon(
            self.workdir, self.netns["vllmd-host"],
            ["--dev-mode", "--host", "127.0.0.1", "--engine", "external",
             "--handshake-address", handshake, "--data-parallel-size", str(DP), *extra],
            self.http))
        daemon.wait_listening(timeout=10)
        return daemon, handshake

    def start_engines(self, handshake, group_timeout):
        """The two launchers: ranks 0 and 1 on engines-a, 2 and 3 on engines-b."""
        engines = []
        for host, ranks in RANKS.items():
            for rank in ranks:
                name = f"engine{rank}"
                record = os.path.join(self.workdir, f"{name}.record.jsonl")
                argv = ["ip", "netns", "exec", self.netns[host], harness.engine_bin(),
                        "--handshake", handshake, "--coordinated-dp", "--dp", str(DP),
                        "--rank", str(rank), "--dp-group-timeout", str(group_timeout),
                        "--record", record]
                engine = self._track(harness.Process(
                    name, argv, os.path.join(self.workdir, f"{name}.log")))
                engine.rank, engine.host, engine.record_path = rank, host, record
                engines.append(engine)
        return engines

    def logs(self, processes):
        return "".join(f"\n--- {p.name} log:\n{p.log()}" for p in processes)

    def assert_within_budget(self):
        self.assertLess(time.monotonic() - self.started, 30, "the test took over 30 s")


class CoordinatedDpAcrossHostsTest(MultiHostTestCase):

    def test_four_ranks_on_two_hosts_form_one_dp_group_at_the_configured_master(self):
        master_ip = self.addr["engines-a"]
        daemon, handshake = self.start_vllmd(
            ["--data-parallel-master", f"{master_ip}:{MASTER_PORT}"])
        engines = self.start_engines(handshake, group_timeout=10)

        def healthy():
            for engine in engines:
                if not engine.alive():
                    raise AssertionError(f"{engine.name} exited with {engine.popen.returncode}"
                                         f"{self.logs([daemon, *engines])}")
            return daemon.health_status() == 200

        try:
            harness.wait_until(healthy, 15, interval=0.1, message="GET /health -> 200")
        except AssertionError as error:
            raise AssertionError(f"{error}{self.logs([daemon, *engines])}") from None
        # `ip netns exec` execs: each pid the harness kills is the program's own, no wrapper.
        for process, program in [(daemon, harness.vllmd_bin())] + [
                (engine, harness.engine_bin()) for engine in engines]:
            self.assertEqual(os.readlink(f"/proc/{process.pid}/exe"), os.path.realpath(program))
        self.assertIn(f"coordinated data parallelism: DP master {master_ip}:{MASTER_PORT} "
                      f"(ports {MASTER_PORT}-{MASTER_PORT + 4})", daemon.log())

        # Every rank, on either host, formed its group at the master vllmd named in INIT.
        port_list = [MASTER_PORT + i for i in range(1, 5)]
        for engine in engines:
            with self.subTest(rank=engine.rank):
                groups, _ = read_lines(engine.record_path)
                self.assertEqual(groups, [{
                    "rank": engine.rank, "size": DP, "master_ip": master_ip,
                    "master_port": MASTER_PORT, "port_list": port_list,
                    "group_port": MASTER_PORT + 4, "master_from_init": True}])
                log = engine.log()
                self.assertIn(f"forming the DP group of {DP} ranks; DP master "
                              f"{master_ip}:{MASTER_PORT} from INIT", log)
                self.assertIn(f"DP group formed at {master_ip}:{MASTER_PORT + 4} (DP master "
                              f"{master_ip}:{MASTER_PORT}, from INIT)", log)
                self.assertEqual(log.count("ready; inputs"), 1, log)

        # World size: each engine registers world_size 1 (TP x PP x PCP), times 4 engines.
        for rank in range(DP):
            self.assertIn(f"engine link: engine rank {rank} ready, vLLM 0.0.0+reference, "
                          "world_size 1, weight transfer nccl", daemon.log())
        self.assert_json(daemon.get("/get_world_size"), 200, {"world_size": DP})
        self.assert_json(daemon.get("/get_world_size?include_dp=false"), 200, {"world_size": 1})

        # One weight-sync cycle through vllmd reaches all four ranks.
        init_info = dict(INIT_INFO, master_address=self.addr["vllmd-host"])
        self.assert_json(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": init_info}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE_INFO}),
                         200, {"message": "Weights updated"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": "moe-1"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "moe-1"})
        self.assertEqual(daemon.health_status(), 200)

        expected = [
            harness.rpc("init_weight_transfer_engine", {"init_info": init_info}),
            harness.rpc("start_weight_update"),
            harness.rpc("update_weights", {"update_info": UPDATE_INFO}),
            harness.rpc("finish_weight_update"),
            ("set_weight_version", ["moe-1"]),
        ]
        for engine in engines:
            with self.subTest(rank=engine.rank):
                self.assertTrue(engine.alive())
                _, calls = read_lines(engine.record_path)
                self.assertEqual(harness.wire(without_probes(calls)), expected)
        self.assert_within_budget()


class NoDataParallelMasterTest(MultiHostTestCase):

    GROUP_TIMEOUT = 2  # --dp-group-timeout, seconds

    def test_without_a_master_in_init_the_ranks_fail_to_form_their_group(self):
        # vllmd without --data-parallel-master: INIT's parallel_config is {}, so each rank
        # does what a headless `vllm serve` does: it picks five open ports of its own and takes
        # the handshake host (--data-parallel-address) for the master's address.
        daemon, handshake = self.start_vllmd()
        vllmd_ip = self.addr["vllmd-host"]
        started = time.monotonic()
        engines = self.start_engines(handshake, group_timeout=self.GROUP_TIMEOUT)

        def all_exited():
            status = daemon.health_status()
            if status != 503:
                raise AssertionError(f"GET /health answered {status} with no DP group"
                                     f"{self.logs([daemon, *engines])}")
            return all(not engine.alive() for engine in engines)

        try:
            harness.wait_until(all_exited, 10, interval=0.1, message="all four engines to exit")
        except AssertionError as error:
            raise AssertionError(f"{error}{self.logs([daemon, *engines])}") from None
        self.assertLess(time.monotonic() - started, self.GROUP_TIMEOUT + 4)

        own_ports = []
        for engine in engines:
            with self.subTest(rank=engine.rank):
                log = engine.log()
                self.assertEqual(engine.popen.returncode, 1, log)
                self.assertIn(f"HELLO from engine rank {engine.rank}; sent INIT", daemon.log())
                forming = re.search(
                    rf"^(\S+) .* forming the DP group of {DP} ranks; DP master "
                    rf"{re.escape(vllmd_ip)}:(\d+) of its own \(INIT names none\)$", log, re.M)
                self.assertIsNotNone(forming, log)
                own_ports.append(int(forming.group(2)))
                failed = re.search(r"^(\S+) .* error: reference engine \d+: "
                                   r"EngineCore failed to start: (.*)$", log, re.M)
                self.assertIsNotNone(failed, log)
                waited = timestamp(failed.group(1)) - timestamp(forming.group(1))
                error = failed.group(2)
                if engine.rank == 0:
                    # Like torch's TCPStore server, rank 0 listens on every interface and
                    # times out waiting for the clients that went to masters of their own.
                    self.assertRegex(error,
                                     rf"^torch\.distributed\.DistStoreError: Timed out after "
                                     rf"{self.GROUP_TIMEOUT + 1} seconds waiting for clients\. "
                                     rf"1/{DP} clients joined\.$")
                    self.assertGreaterEqual(waited, self.GROUP_TIMEOUT - 0.05, log)
                else:
                    # Nobody listens at the master each of them made up: the client times out.
                    # Its port is random, though, and may happen to be one some other process
                    # on vllmd's host listens on (a ZeroMQ port of vllmd's, say): then the
                    # client connects, and times out waiting for a group that never answers.
                    self.assertRegex(
                        error, rf"^torch\.distributed\.(DistNetworkError: The client socket has "
                        rf"timed out after {self.GROUP_TIMEOUT * 1000}ms while trying to connect "
                        rf"to \({re.escape(vllmd_ip)}, \d+\)\.|DistStoreError: Timed out after "
                        rf"{self.GROUP_TIMEOUT + 1} seconds waiting for the DP group at rank 0)$")
                    self.assertGreaterEqual(waited, self.GROUP_TIMEOUT - 0.05, log)
                    self.assertLess(waited, self.GROUP_TIMEOUT + 1, log)
                self.assertNotIn("DP group formed", log)
                self.assertNotIn("ready; inputs", log)
                self.assertEqual(read_lines(engine.record_path), ([], []))
        # The cause: every launcher's rank picked its own master port (random, so they differ).
        self.assertGreater(len(set(own_ports)), 1, own_ports)

        # vllmd never got a READY: it stays unhealthy, naming every rank, and keeps running.
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            self.assertEqual(daemon.health_status(), 503)
            time.sleep(0.1)
        error = self.assert_error(daemon.get("/health"), 503, "engine_unavailable")
        for rank in range(DP):
            self.assertIn(f"engine rank {rank} is loading", error["message"])
        self.assertTrue(daemon.alive())
        self.assertNotRegex(daemon.log(), r"engine link: engine rank \d+ ready")
        self.assert_within_budget()


if __name__ == "__main__":
    unittest.main()
