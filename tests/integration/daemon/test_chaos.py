"""A bounded chaos run: DP=2 reference engines killed and restarted, and their input
connections cut, for 30 s while an owned trainer, an anonymous client and a reader use vllmd.

What must hold whatever the faults (the contract of owned sessions, engine incarnations and
commits):
- every version /weight_info ever answered (200) was committed by a finish that succeeded on
  every rank: it answered 200, or it finished everywhere and only set_weight_version's answer
  was lost to a cut (vllmd then says the version may have been applied); the anonymous client sends finishes without a version, so an "anon-*" version can never be
  seen, and it gets 409 for every call made while the trainer's session is open;
- no version older than one already seen comes back (an older answer never overwrites a
  newer one);
- in the engines' --record files, set_weight_version only ever follows a finish_weight_update,
  and a version the trainer was told is committed reached both ranks;
- the next start works on every rank: no rank refuses a start as "already active" while the
  others start (it would hold a session vllmd closed everywhere else, or never knew of);
- afterwards no session is left stuck: a fresh owned cycle commits "final" within 10 s.

The seed is printed (CHAOS_SEED=N reruns the same fault schedule; thread timing still varies).
On failure the test's directory (vllmd and engine logs, records, events.log) is kept and
named in the failure message.
"""

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

import harness

DP = 2
CHAOS_SECONDS = 30.0
FAULT_GAP = (0.75, 2.0)  # seconds between two faults: about 20 faults in all
SETTLE_SECONDS = 15.0   # after the chaos: engines healthy again within this
FINAL_SECONDS = 10.0    # then a fresh owned cycle must commit within this
MIN_COMMITTED = 10
MIN_FAULTS = 10
HTTP_TIMEOUT = 20       # > engine.call_timeout below: vllmd answers first
INIT_INFO = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
             "world_size": 3}
CONFIG = """\
[engine]
probe_interval = 0.5
query_timeout = 2
call_timeout = 10
"""
PROBES = ("is_scheduler_paused", "get_weight_version")


def input_port(daemon):
    """The port of vllmd's input ROUTER, from its start-up log line."""
    found = re.search(r"engine link: handshake \S+, input tcp://[0-9.]+:(\d+),", daemon.log())
    if not found:
        raise AssertionError(f"no input endpoint in the log:\n{daemon.log()}")
    return int(found.group(1))


def engine_source_ports(port, pid):
    """Source ports of the TCP connections process `pid` has to 127.0.0.1:port."""
    listing = subprocess.run(["ss", "-tnpH", "dst", harness.HOST, "dport", "=", f":{port}"],
                             check=True, capture_output=True, text=True).stdout
    ports = []
    for line in listing.splitlines():
        found = re.search(r"127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:(\d+)\s+users:\(\((.*)\)\)", line)
        if found and int(found.group(2)) == port and f"pid={pid}," in found.group(3):
            ports.append(int(found.group(1)))
    return ports


def cut(port, source_port):
    """Kills the engine's side of one connection to 127.0.0.1:port; True if one was killed."""
    killed = subprocess.run(["ss", "-K", "-tnH", "dst", harness.HOST, "dport", "=", f":{port}",
                             "sport", "=", f":{source_port}"],
                            check=True, capture_output=True, text=True).stdout
    return bool(killed.strip())


def full(response):
    if isinstance(response, Exception):
        return f"exception {type(response).__name__}: {response}"
    return f"{response.status_code} {response.text.strip()}"


def commit_outcome_unknown(response):
    """A finish whose engines all finished, and whose set_weight_version may have applied
    although its answer was lost: vllmd says so."""
    if isinstance(response, Exception) or response.status_code == 200:
        return False
    message = response.text
    return ("failed to call set_weight_version" in message and
            "the version may have been applied on" in message)


def short(response):
    if isinstance(response, Exception):
        return f"exception {type(response).__name__}: {response}"[:600]
    return f"{response.status_code} {response.text.strip()}"[:600]


class Events:
    """A time-stamped log of everything the threads did, for the evidence."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []  # (monotonic, wall clock, who, text)

    def add(self, who, text):
        with self.lock:
            self.items.append((time.monotonic(), time.time(), who, text))

    def lines(self, around=None, width=3.0):
        with self.lock:
            items = list(self.items)
        out = []
        for mono, wall, who, text in items:
            if around is not None and abs(mono - around) > width:
                continue
            stamp = time.strftime("%H:%M:%S", time.gmtime(wall)) + f".{int(wall * 1000) % 1000:03d}Z"
            out.append(f"{stamp} {who:8} {text}")
        return out


class ChaosTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        seed = os.environ.get("CHAOS_SEED")
        self.seed = int(seed) if seed else int.from_bytes(os.urandom(4), "little")
        print(f"\n  chaos seed {self.seed} (CHAOS_SEED={self.seed} to rerun its schedule)",
              file=sys.stderr, flush=True)
        self.events = Events()
        self.stop_clients = threading.Event()
        self.stop_reader = threading.Event()
        self.threads = []
        # Registered last, so it runs first: no thread is left touching a killed process.
        self.addCleanup(self._stop_threads)

    def _stop_threads(self):
        self.stop_clients.set()
        self.stop_reader.set()
        for thread in self.threads:
            thread.join(timeout=HTTP_TIMEOUT + 15)

    def _thread(self, target, name):
        def run():
            try:
                target()
            except BaseException as error:  # pragma: no cover - reported by the main thread
                self.thread_errors.append(f"{name}: {error!r}")
                self.events.add(name, f"thread died: {error!r}")
                raise
        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    # --- the engines ----------------------------------------------------------------------

    def launch_rank(self, rank):
        self.incarnation[rank] += 1
        engine = self.start_engine(self.handshake, rank=rank, dp=DP,
                                   name=f"engine{rank}-inc{self.incarnation[rank]}")
        self.engines[rank] = engine
        self.all_engines.append((rank, engine))
        return engine

    # --- the clients ----------------------------------------------------------------------

    def post(self, http, path, **kwargs):
        sent = time.monotonic()
        try:
            response = http.post(self.daemon.url + path, timeout=HTTP_TIMEOUT, **kwargs)
        except requests.RequestException as error:
            response = error
        return sent, time.monotonic(), response

    def trainer(self):
        with requests.Session() as http:
            self._trainer(http)

    def _trainer(self, http):
        rng = random.Random(self.seed * 3 + 1)
        need_init = True
        n = 0
        while not self.stop_clients.is_set():
            n += 1
            version = f"chaos-{n}"
            headers = {"Vllmd-Session": f"trainer-{n}"}
            cycle = {"n": n, "version": version, "steps": [], "finish": None}
            self.cycles.append(cycle)

            def step(path, **kwargs):
                sent, got, response = self.post(http, path, headers=headers, **kwargs)
                status = response.status_code if isinstance(response, requests.Response) else None
                cycle["steps"].append((path, status, short(response)))
                if path == "/start_weight_update":
                    self.starts.append((sent, "trainer", status, full(response)))
                self.events.add("trainer", f"{version} {path} -> {short(response)}")
                return sent, got, status, response

            ok = True
            if need_init:
                _, _, status, _ = step("/init_weight_transfer_engine",
                                       json={"init_info": INIT_INFO})
                ok = status == 200
                need_init = not ok
            if ok:
                _, got, status, _ = step("/start_weight_update")
                ok = status == 200
            if ok:
                # While the trainer waits between its calls its session is open and owned:
                # every anonymous call made entirely inside such a window must get 409.
                for _ in range(rng.randint(1, 3)):
                    time.sleep(rng.uniform(0.01, 0.06))
                    sent, next_got, status, _ = step(
                        "/update_weights", json={"update_info": harness.update_info(
                            f"layer{n}.weight")})
                    self.windows.append((got, sent))
                    got = next_got
                    if status != 200:
                        ok = False
                        break
            if ok:
                time.sleep(rng.uniform(0.01, 0.06))
                sent, _, status, response = step("/finish_weight_update",
                                                 json={"weight_version": version})
                self.windows.append((got, sent))
                cycle["finish"] = (status, short(response))
                ok = status == 200
                if ok:
                    self.committed.add(version)
                elif commit_outcome_unknown(response):
                    # Finished on every rank; only set_weight_version's answer was lost (a cut
                    # after it was sent), and vllmd said so: the version may be committed.
                    self.maybe_committed.add(version)
            if not ok:
                # A restarted engine needs init again; init is harmless on the others.
                need_init = True
                time.sleep(0.1)

    def anonymous(self):
        with requests.Session() as http:
            self._anonymous(http)

    def _anonymous(self, http):
        rng = random.Random(self.seed * 3 + 2)
        holds = False  # its last successful call opened or continued a session
        while not self.stop_clients.is_set():
            time.sleep(rng.uniform(0.005, 0.08))
            path, kwargs = rng.choice([
                ("/start_weight_update", {}),
                ("/update_weights", {"json": {"update_info": harness.update_info("anon.weight")}}),
                ("/finish_weight_update", {}),  # never a version: an anon-* must never appear
            ])
            sent, got, response = self.post(http, path, **kwargs)
            status = response.status_code if isinstance(response, requests.Response) else None
            self.anon.append((path, sent, got, status, short(response)))
            if path == "/start_weight_update":
                self.starts.append((sent, "anon", status, full(response)))
            if status != 409:
                self.events.add("anon", f"{path} -> {short(response)}")
            if status == 200:
                holds = path != "/finish_weight_update"
        if holds:
            # A well-behaved client closes what it opened; a session the engines hold without
            # anyone having opened it (a stuck one) is left for the final check to find.
            _, _, response = self.post(http, "/finish_weight_update")
            self.events.add("anon", f"closing its own session: {short(response)}")

    def reader(self):
        with requests.Session() as http:
            self._reader(http)

    def _reader(self, http):
        while not self.stop_reader.is_set():
            try:
                response = http.get(self.daemon.url + "/weight_info", timeout=HTTP_TIMEOUT)
            except requests.RequestException as error:
                self.reads.append((time.monotonic(), None, repr(error)[:200]))
                time.sleep(0.02)
                continue
            if response.status_code == 200:
                version = response.json()["weight_version"]
                if version not in self.seen:
                    self.events.add("reader", f"first saw {version!r}")
                    self.seen[version] = time.monotonic()
                self.reads.append((time.monotonic(), 200, version))
            else:
                self.reads.append((time.monotonic(), response.status_code, response.text[:200]))
            time.sleep(0.02)

    def chaos(self):
        rng = random.Random(self.seed)
        port = input_port(self.daemon)
        deadline = time.monotonic() + CHAOS_SECONDS
        while True:
            gap = rng.uniform(*FAULT_GAP)
            if time.monotonic() + gap > deadline:
                return
            time.sleep(gap)
            if self.thread_errors:
                return  # reported by the caller
            rank = rng.randrange(DP)
            if rng.random() < 0.5:
                old = self.engines[rank]
                old.kill()  # SIGKILL by pid, reaped
                pause = rng.uniform(0, 0.5)
                time.sleep(pause)
                new = self.launch_rank(rank)
                self.kills += 1
                self.events.add("chaos", f"kill -9 rank {rank} (pid {old.pid}); restarted after "
                                         f"{pause:.2f} s as incarnation {self.incarnation[rank]} "
                                         f"(pid {new.pid})")
            else:
                engine = self.engines[rank]
                sources = engine_source_ports(port, engine.pid)
                done = [source for source in sources if cut(port, source)]
                if done:
                    self.cuts += 1
                    self.events.add("chaos", f"ss -K rank {rank} (pid {engine.pid}) input "
                                             f"connection {done} -> :{port}")
                else:
                    self.events.add("chaos", f"ss -K rank {rank}: no connection to cut "
                                             f"(pid {engine.pid}, found {sources})")

    # --- the test -------------------------------------------------------------------------

    def test_sessions_and_commits_survive_engine_kills_and_cuts(self):
        self.thread_errors = []
        self.cycles, self.windows, self.committed = [], [], set()
        self.maybe_committed = set()
        self.anon, self.reads, self.seen, self.starts = [], [], {}, []
        self.kills = self.cuts = 0
        self.handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        config = self.write_config(CONFIG)
        self.daemon = self.launch_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", self.handshake,
             "--data-parallel-size", str(DP), "--config", config])
        self.incarnation = [0] * DP
        self.engines = [None] * DP
        self.all_engines = []
        for rank in range(DP):
            self.launch_rank(rank)
        self.daemon.wait_healthy(timeout=20)

        try:
            self._run()
        except BaseException:
            self._keep_evidence()
            raise

    def _run(self):
        daemon = self.daemon
        self._thread(self.reader, "reader")
        self._thread(self.trainer, "trainer")
        self._thread(self.anonymous, "anon")
        time.sleep(2)  # some clean cycles first
        # The faults run on this thread: the engines it restarts get SIGKILL when the thread
        # that forked them ends (PR_SET_PDEATHSIG follows the thread, not the process).
        self.chaos()
        self.events.add("main", "chaos over")
        self.stop_clients.set()
        for thread in self.threads[1:]:
            thread.join(timeout=HTTP_TIMEOUT + 10)
            self.assertFalse(thread.is_alive(), f"{thread.name} did not stop")

        # Settle: every rank attached and answering again.
        for rank, engine in enumerate(self.engines):
            self.assertTrue(engine.alive(), f"rank {rank} exited:\n{engine.log()}")
        try:
            daemon.wait_healthy(timeout=SETTLE_SECONDS)
        except AssertionError as error:
            raise AssertionError(f"not healthy {SETTLE_SECONDS} s after the chaos: {error}")
        session_before = daemon.get("/weight_update_session", timeout=5).text
        self.events.add("main", f"settled; /weight_update_session {session_before}")

        # No session left stuck: a fresh owned cycle commits within a bounded time.
        http = requests.Session()
        self.addCleanup(http.close)
        headers = {"Vllmd-Session": "final"}
        final_ok = False
        attempts = []
        deadline = time.monotonic() + FINAL_SECONDS
        while time.monotonic() < deadline and not final_ok:
            outcome = []
            for path, kwargs in (
                    ("/init_weight_transfer_engine", {"json": {"init_info": INIT_INFO}}),
                    ("/start_weight_update", {}),
                    ("/update_weights", {"json": {"update_info": harness.update_info("f.weight")}}),
                    ("/finish_weight_update", {"json": {"weight_version": "final"}})):
                sent, _, response = self.post(http, path, headers=headers, **kwargs)
                outcome.append(f"{path} -> {short(response)}")
                if path == "/start_weight_update":
                    status = getattr(response, "status_code", None)
                    self.starts.append((sent, "final", status, full(response)))
                self.events.add("final", outcome[-1])
                if not (isinstance(response, requests.Response) and response.status_code == 200):
                    break
            else:
                final_ok = True
                self.committed.add("final")
            attempts.append(outcome)
            if not final_ok:
                time.sleep(0.5)
        final_info = daemon.get("/weight_info", timeout=5) if final_ok else None
        time.sleep(0.2)  # the reader sees the final state too
        self.stop_reader.set()
        self.threads[0].join(timeout=HTTP_TIMEOUT + 5)

        violations = self._check()
        cycles = len(self.cycles)
        anon_409 = sum(1 for item in self.anon if item[3] == 409)
        reads_200 = sum(1 for item in self.reads if item[1] == 200)
        summary = (f"chaos summary: seed={self.seed} cycles attempted={cycles} "
                   f"committed={len(self.committed - {'final'})} "
                   f"faults={self.kills + self.cuts} (kills={self.kills} cuts={self.cuts}) "
                   f"anon requests={len(self.anon)} anon 409={anon_409} "
                   f"reads={len(self.reads)} (200: {reads_200}) "
                   f"distinct versions seen={len(self.seen)} violations={len(violations)} "
                   f"final={'ok' if final_ok else 'FAILED'} "
                   f"(attempts {len(attempts)})")
        print("\n  " + summary, file=sys.stderr, flush=True)
        print("  " + self._outcomes(), file=sys.stderr, flush=True)
        for index, violation in enumerate(violations):
            print(f"  VIOLATION: {violation['what']}", file=sys.stderr)
            if index < 3:  # the events around the first few; all of them are in events.log
                for line in self.events.lines(around=violation.get("at")):
                    print(f"    {line}", file=sys.stderr)
        sys.stderr.flush()

        self.assertEqual(self.thread_errors, [])
        self.assertEqual([v["what"] for v in violations], [], summary)
        self.assertTrue(final_ok, f"no fresh owned cycle committed in {FINAL_SECONDS} s after "
                                  f"the chaos (session before: {session_before}); attempts:\n"
                        + "\n".join("; ".join(outcome) for outcome in attempts[-3:])
                        + "\n" + self._record_tails())
        self.assertIsNotNone(final_info)
        self.assert_json(final_info, 200, {"weight_version": "final"})
        self.assertGreaterEqual(self.kills + self.cuts, MIN_FAULTS, summary)
        self.assertGreaterEqual(len(self.committed - {"final"}), MIN_COMMITTED, summary)
        self.assertTrue(daemon.alive(), daemon.log()[-4000:])

    def _outcomes(self):
        """How each kind of call was answered, for the report."""
        tally = {}
        for cycle in self.cycles:
            for path, status, _ in cycle["steps"]:
                key = f"trainer{path}"
                tally.setdefault(key, {}).setdefault(status, 0)
                tally[key][status] += 1
        for path, _, _, status, _ in self.anon:
            key = f"anon{path}"
            tally.setdefault(key, {}).setdefault(status, 0)
            tally[key][status] += 1
        for _, status, _ in self.reads:
            tally.setdefault("reader/weight_info", {}).setdefault(status, 0)
            tally["reader/weight_info"][status] += 1
        return "outcomes: " + "; ".join(
            f"{key} " + ",".join(f"{status}x{count}" for status, count in sorted(
                counts.items(), key=lambda item: str(item[0])))
            for key, counts in sorted(tally.items()))

    def _check(self):
        violations = []
        finishes = {cycle["version"]: cycle["finish"] for cycle in self.cycles}
        finishes["final"] = (200, "") if "final" in self.committed else None
        on_rank = self._set_on_rank()

        # 1. Every version /weight_info answered was committed by a finish answering 200.
        for version, at in self.seen.items():
            if version in ("default", *self.committed, *self.maybe_committed):
                continue
            if version.startswith("anon-"):
                what = f"/weight_info answered {version!r}, which no one committed"
            elif version in finishes:
                reached = [rank for rank in range(DP) if version in on_rank[rank]]
                what = (f"/weight_info answered {version!r}, whose finish answered "
                        f"{finishes[version]}; set_weight_version({version!r}) is in the "
                        f"records of rank(s) {reached}")
            else:
                what = f"/weight_info answered {version!r}, which was never sent"
            violations.append({"what": what, "at": at})

        # 2. No older version after a newer one (an old answer overwriting a newer state).
        order = {cycle["version"]: cycle["n"] for cycle in self.cycles}
        order["final"] = len(self.cycles) + 1
        newest = 0
        for at, status, version in self.reads:
            if status != 200 or version == "default" or version not in order:
                continue
            if order[version] < newest:
                violations.append({"what": f"/weight_info went back to {version!r} after "
                                           f"chaos-{newest}", "at": at})
                break
            newest = max(newest, order[version])

        # 3. Anonymous calls made while the trainer's session was open and owned: 409.
        for path, sent, got, status, text in self.anon:
            inside = any(start <= sent and got <= end for start, end in self.windows)
            if inside and status != 409:
                violations.append({"what": f"anonymous {path} while the trainer's session was "
                                           f"open answered {text}", "at": sent})
            elif status == 409 and '"code":"conflict"' not in text.replace(" ", ""):
                violations.append({"what": f"anonymous {path}: a 409 without code conflict: "
                                           f"{text}", "at": sent})

        # 4. The engines' records: set_weight_version only right after a finish, never an
        # anon-* version, and every version the trainer was told is committed on both ranks.
        for rank, engine in self.all_engines:
            previous = None
            for call in engine.calls():
                name = call["worker_method"] or call["method"]
                if name in PROBES:
                    continue
                if name == "set_weight_version":
                    version = call["args"][0]
                    if previous != "finish_weight_update":
                        violations.append({"what": f"{engine.name} got set_weight_version "
                                                   f"{version!r} after {previous!r}"})
                    if version.startswith("anon-") or version not in finishes:
                        violations.append({"what": f"{engine.name} got set_weight_version "
                                                   f"{version!r}, which no trainer sent"})
                previous = name
        for version in sorted(self.committed):
            missing = [rank for rank in range(DP) if version not in on_rank[rank]]
            if missing:
                violations.append({"what": f"{version!r} committed (finish 200) but no "
                                           f"set_weight_version reached rank(s) {missing}"})
        # 5. "The next start works on every rank": a start refused by one rank alone as
        # "already active", the other ranks having started (and been closed again by vllmd),
        # means that rank held a session vllmd had closed everywhere else, or never opened.
        # (A session anyone opened is open on every rank: a start refused there is refused
        # by all of them.)
        for sent, who, status, text in self.starts:
            refusals = re.findall(r"engine rank (\d+): [^;]*already active", text)
            if status != 200 and len(refusals) == 1 and \
                    "no session was opened: the session was closed on engine rank" in text:
                violations.append({"what": f"{who} start refused by engine rank {refusals[0]} "
                                           f"alone: it still held a session that vllmd had "
                                           f"closed on the others ({text[:160]}...)", "at": sent})
        return violations

    def _set_on_rank(self):
        """The versions set_weight_version brought to each rank, from the records."""
        on_rank = [set() for _ in range(DP)]
        for rank, engine in self.all_engines:
            for call in engine.calls():
                if call["method"] == "set_weight_version":
                    on_rank[rank].add(call["args"][0])
        return on_rank

    def _record_tails(self):
        """The last lifecycle calls each running engine received (probes left out)."""
        lines = []
        for rank, engine in enumerate(self.engines):
            names = [call["worker_method"] or call["method"] for call in engine.calls()]
            names = [name for name in names if name not in PROBES]
            lines.append(f"rank {rank} ({engine.name}) last calls: {names[-8:]}")
        return "\n".join(lines)

    def _keep_evidence(self):
        keep = tempfile.mkdtemp(prefix=f"vllmd-chaos-evidence-{self.seed}-")
        try:
            with open(os.path.join(keep, "events.log"), "w", encoding="utf-8") as handle:
                handle.write("\n".join(self.events.lines()) + "\n")
            for name in os.listdir(self.workdir):
                source = os.path.join(self.workdir, name)
                if os.path.isfile(source):
                    shutil.copy(source, keep)
        finally:
            print(f"\n  chaos evidence kept in {keep}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    unittest.main()
