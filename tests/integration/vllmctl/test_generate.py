"""vllmctl generate: token ids in, token ids out through vllmd's /inference/v1/generate, each
option checked where it lands (the reference engine's record of the ADD it got), the output
formats, and every exit code of the documented table it can give."""

import json
import subprocess
import time

from ctl_harness import CtlTestCase
from harness import binary, clean_env, die_with_parent
import ref_tokens


def adds(engine):
    """The sampling maps of the ADDs the engine received ("2025" layout: args[3])."""
    return [call["args"][3] for call in engine.calls() if call["method"] == "ADD"]


class GenerateTest(CtlTestCase):
    def test_prints_the_engines_ids_and_each_option_reaches_the_engine(self):
        _, engine = self.start_external()
        result = self.assert_ok(self.ctl("generate", "--tokens", "1,2,3", "--max-tokens", "5",
                                         "--seed", "7", "--temperature", "0.5", "--top-p",
                                         "0.9", "--top-k", "40", "--n", "1"))
        self.assertEqual(result.stdout.split(), [str(t) for t in ref_tokens.tokens([1, 2, 3], 5, 7)])
        self.assertIn("5 token(s), finish_reason length", result.stderr)
        sampling, = adds(engine)
        self.assertEqual((sampling["max_tokens"], sampling["seed"], sampling["temperature"],
                          sampling["top_p"], sampling["top_k"]), (5, 7, 0.5, 0.9, 40))

    def test_logprobs_one_line_per_token_and_json_prints_the_answer(self):
        _, engine = self.start_external()
        result = self.assert_ok(self.ctl("generate", "--tokens", "4 5", "--max-tokens", "3",
                                         "--seed", "2", "--logprobs", "2"))
        lines = [line.split() for line in result.stdout.splitlines()]
        self.assertEqual([int(line[0]) for line in lines], ref_tokens.tokens([4, 5], 3, 2))
        self.assertTrue(all(float(line[1]) <= 0 for line in lines))
        self.assertEqual(adds(engine)[0]["logprobs"], 2)
        answer = json.loads(self.assert_ok(self.ctl("-o", "json", "generate", "--tokens", "4,5",
                                                    "--max-tokens", "2", "--seed", "2")).stdout)
        self.assertEqual(answer["choices"][0]["token_ids"], ref_tokens.tokens([4, 5], 2, 2))
        self.assertEqual(answer["prompt_token_ids"], [4, 5])

    def test_stream_prints_ids_per_event_from_a_file_or_stdin(self):
        self.start_external("--step-ms", "5")
        self.write("prompt.json", [6, 7, 8])
        expected = ref_tokens.tokens([6, 7, 8], 6, 3)
        for source in (("--input", "prompt.json"), ("--input", "-")):
            with self.subTest(source=source):
                result = self.assert_ok(self.ctl("generate", *source, "--max-tokens", "6",
                                                 "--seed", "3", "--stream",
                                                 input="6, 7, 8\n" if source[1] == "-" else None))
                lines = result.stdout.splitlines()
                self.assertGreater(len(lines), 1)  # an event per engine step
                self.assertEqual([int(t) for line in lines for t in line.split()], expected)
        events = [json.loads(line) for line in self.assert_ok(self.ctl(
            "-o", "json", "generate", "--tokens", "6,7,8", "--max-tokens", "6", "--seed", "3",
            "--stream")).stdout.splitlines()]
        self.assertEqual([t for e in events for t in e["choices"][0]["token_ids"]], expected)
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "length")

    def test_n_prints_each_choice_with_its_index_plain_and_streamed(self):
        _, engine = self.start_external()
        result = self.assert_ok(self.ctl("generate", "--tokens", "1 2", "--max-tokens", "4",
                                         "--seed", "7", "--n", "3"))
        lines = result.stdout.splitlines()
        self.assertEqual(lines, [f"{i}: " + " ".join(map(str, ref_tokens.tokens([1, 2], 4, 7 + i)))
                                 for i in range(3)])
        self.assertIn("12 token(s), finish_reason length", result.stderr)
        self.assertEqual(sorted(sampling["seed"] for sampling in adds(engine)), [7, 8, 9])
        result = self.assert_ok(self.ctl("generate", "--tokens", "1 2", "--max-tokens", "4",
                                         "--seed", "7", "--n", "2", "--stream"))
        streamed = {0: [], 1: []}
        for line in result.stdout.splitlines():
            index, ids = line.split(":")
            streamed[int(index)] += [int(t) for t in ids.split()]
        self.assertEqual(streamed, {i: ref_tokens.tokens([1, 2], 4, 7 + i) for i in range(2)})

    def test_exit_codes(self):
        _, engine = self.start_external("--inject-fail", "generate")
        self.assert_exit(self.ctl("generate"), 64, "--tokens IDS or --input FILE")
        self.assert_exit(self.ctl("generate", "--tokens", "1,-2"), 64, "non-negative integers")
        self.assert_exit(self.ctl("generate", "--tokens", ","), 64, "no token ids")
        self.assert_exit(self.ctl("generate", "--tokens", "1", "--input", "f"), 64, "excludes")
        self.assert_exit(self.ctl("generate", "--input", "missing.json"), 66, "cannot read")
        self.assert_exit(self.ctl("generate", "--tokens", "1", "--temperature", "3"), 65,
                         "param: sampling_params.temperature")
        self.assertEqual(adds(engine), [])  # none of those reached the engine
        # The engine fails the request: 70, plain and streamed.
        self.assert_exit(self.ctl("generate", "--tokens", "1"), 70)
        self.assert_exit(self.ctl("generate", "--tokens", "1", "--stream"), 70)
        # Nobody listening: 69.
        self.server = "http://127.0.0.1:9"
        self.assert_exit(self.ctl("generate", "--tokens", "1"), 69)


class GenerateAnswerCodesTest(CtlTestCase):
    """The rest of the table: what the server's answer (or its silence) makes of a generate."""

    def test_no_answer_within_the_timeout_exits_75_and_the_request_ends(self):
        daemon, engine = self.start_external()
        self.assertEqual(daemon.post("/pause", params={"mode": "keep"}).status_code, 200)
        for stream in ((), ("--stream",)):
            with self.subTest(stream=stream):
                started = time.monotonic()
                self.assert_exit(self.ctl("--timeout", "1", "generate", "--tokens", "1,2",
                                          *stream), 75, "no reply within 1 s")
                self.assertLess(time.monotonic() - started, 4.5)
        # vllmctl hung up: vllmd aborted both queued requests rather than keep them.
        self.assertEqual(daemon.post("/resume").status_code, 200)
        deadline = time.monotonic() + 10
        while daemon.metric("vllmd_generations_in_flight") != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(daemon.metric("vllmd_generations_in_flight"), 0)
        self.assertEqual(daemon.metric('vllmd_generation_aborts_total{cause="client_gone"}'), 2)

    def test_a_stream_cut_short_is_a_failure_not_an_answer(self):
        daemon, _ = self.start_external("--step-ms", "50")
        ctl = subprocess.Popen(
            [binary("VLLMCTL_BIN"), "--server", self.server, "generate", "--tokens", "1,2",
             "--max-tokens", "10000", "--stream"], env=clean_env(None),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=self.workdir, preexec_fn=die_with_parent)
        first = ctl.stdout.readline()  # the first event's ids: the stream is on
        self.assertTrue(first.split())
        daemon.kill()
        _, stderr = ctl.communicate(timeout=20)
        # Not a short answer with exit 0: the call failed, and says how far it got.
        self.assertEqual(ctl.returncode, 70, stderr)
        self.assertIn("the stream ended without [DONE] after", stderr)

    def test_a_missing_or_wrong_token_exits_77_and_the_right_one_generates(self):
        self.start_daemon("--api-key", "secret")
        self.assert_exit(self.ctl("generate", "--tokens", "1"), 77, "missing or invalid API key")
        self.assert_exit(self.ctl("generate", "--tokens", "1", "--stream",
                                  env={"VLLMCTL_TOKEN": "wrong"}), 77)
        result = self.assert_ok(self.ctl("generate", "--tokens", "1", "--max-tokens", "2",
                                         env={"VLLMCTL_TOKEN": "secret"}))
        self.assertEqual(len(result.stdout.split()), 2)

    def test_a_bad_server_exits_78_before_reading_the_prompt(self):
        result = self.ctl("--server", "ftp://127.0.0.1:1", "generate", "--input", "-",
                          server=False, input="1 2 3")
        self.assert_exit(result, 78, "--server")
        self.assertEqual(result.stdout, "")
