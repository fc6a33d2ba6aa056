"""The man pages (man/) against the binaries: every command and flag that `vllmctl --help`
and its commands' --help print is in vllmctl(1), every flag of `vllmd --help` in vllmd(8),
every flag of `vllm-ref-engine --help` in vllm-ref-engine(1),
every key of `vllmd --print-config` in vllmd.toml(5) with the flag and the variable that
really set it (checked by running vllmd), its real default and whether SIGHUP reloads it;
and `mandoc -T lint -W warning` is clean for each page.

Environment (set by ctest): VLLMD_BIN, VLLMCTL_BIN, VLLM_REF_ENGINE_BIN, MAN_DIR. Needs mandoc (scripts/deps.sh).
"""

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
import unittest

from cli_help import help_blocks

SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT",
            "FILES", "EXAMPLES", "SEE ALSO"]
PAGES = ["vllmctl.1", "vllmd.8", "vllmd.toml.5", "vllm-ref-engine.1"]

# What a SIGHUP applies (daemon/daemon.cpp, reload()); every other setting needs a restart.
RELOADABLE = {"server.max_body_bytes", "server.api_keys", "server.api_key_file",
              "server.allowlist", "log.level"}

# vllmd's flags that are not settings.
VLLMD_COMMAND_FLAGS = {"-h", "--help", "--config", "--print-config", "--check-config",
                       "--print-routes", "--version"}


def required_env(variable):
    value = os.environ.get(variable)
    if not value:
        # Not a skip: a misconfigured run must not pass silently.
        raise RuntimeError(f"{variable} is not set (ctest sets it; or export it by hand)")
    return value


def mandoc():
    path = shutil.which("mandoc")
    if path is None:
        raise RuntimeError("mandoc is not installed (scripts/deps.sh installs it)")
    return path


def run(argv, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)


def page_path(name):
    return os.path.join(required_env("MAN_DIR"), name)


def render(name):
    """The page as plain text lines (mandoc -T ascii without its overstrike bold/underline)."""
    result = run([mandoc(), "-T", "ascii", page_path(name)])
    if result.returncode != 0:
        raise AssertionError(f"mandoc cannot render {name}: {result.stderr}")
    return re.sub(r".\x08", "", result.stdout).splitlines()


def sections(lines):
    """{section title: [lines]} for the page's .SH sections (flush-left capitals)."""
    found = {}
    current = None
    for line in lines[1:-1]:  # the first and last lines are the page header and footer
        if re.fullmatch(r"[A-Z][A-Z ]*[A-Z]", line):
            current = line
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def flat(lines):
    """Text with runs of white space (line ends too) made one space."""
    return re.sub(r"\s+", " ", "\n".join(lines))


def has_word(text, word):
    """Whether `word` (a flag, a name) appears in `text` as a whole token."""
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None


def tag_lines(lines):
    """The tag lines of a section's lists (.TP): text flush with the section's paragraphs,
    as a flag's own entry starts; mentions in other entries' bodies are indented further."""
    return "\n".join(line for line in lines if re.match(r" {7}\S", line))


def exit_tags(lines):
    """The tags of an EXIT STATUS list: the numbers flush with the section's text."""
    return [match.group(1) for line in lines if (match := re.match(r" {7}(\d+)(?:\s|$)", line))]


def option_names(entry):
    """'-o,--output' -> ['-o', '--output']; a negatable flag's '{false}' is dropped."""
    return re.sub(r"\{[^}]*\}$", "", entry).split(",")


class ManPageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.vllmd = required_env("VLLMD_BIN")
        cls.vllmctl = required_env("VLLMCTL_BIN")
        cls.ref_engine = required_env("VLLM_REF_ENGINE_BIN")
        cls.pages = {name: render(name) for name in PAGES}
        cls.workdir = tempfile.mkdtemp(prefix="vllmd-it-man-")
        # vllmd reads /etc/vllmd/vllmd.toml when present: give it a file of our own, and an
        # environment without any setting.
        cls.env = {key: value for key, value in os.environ.items()
                   if not key.startswith(("VLLMD_", "VLLM_", "VLLMCTL_"))}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.workdir, True)

    def write(self, name, text):
        path = os.path.join(self.workdir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def section(self, page, title):
        found = sections(self.pages[page])
        self.assertIn(title, found, f"{page} has no {title} section")
        return found[title]

    # --- every page -------------------------------------------------------------------

    def test_mandoc_lint_is_clean(self):
        for name in PAGES:
            with self.subTest(name):
                result = run([mandoc(), "-T", "lint", "-W", "warning", page_path(name)])
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                self.assertEqual(result.stdout + result.stderr, "")

    def test_every_page_has_the_standard_sections_in_order(self):
        for name in PAGES:
            with self.subTest(name):
                found = [title for title in sections(self.pages[name]) if title in SECTIONS]
                self.assertEqual(found, SECTIONS)

    def test_pages_name_themselves_and_each_other(self):
        for name in PAGES:
            with self.subTest(name):
                title, number = name.rsplit(".", 1)
                self.assertTrue(self.pages[name][0].startswith(f"{title.upper()}({number})"),
                                self.pages[name][0])
                see_also = flat(self.section(name, "SEE ALSO"))
                for other in PAGES:
                    if other != name:
                        other_title, other_number = other.rsplit(".", 1)
                        self.assertIn(f"{other_title}({other_number})", see_also)

    # --- vllmctl(1) ---------------------------------------------------------------------

    def vllmctl_help(self, command):
        result = run([self.vllmctl, *command, "--help"], env=self.env)
        self.assertEqual(result.returncode, 0, result)
        return help_blocks(result.stdout)

    def vllmctl_commands(self):
        """[(command words, help blocks)] for vllmctl and every subcommand, recursively."""
        found = []
        pending = [[]]
        while pending:
            command = pending.pop(0)
            blocks = self.vllmctl_help(command)
            found.append((command, blocks))
            pending += [command + [sub] for sub in blocks.get("Subcommands", [])]
        return found

    def test_vllmctl_page_has_every_command_and_flag(self):
        options = tag_lines(self.section("vllmctl.1", "OPTIONS"))
        synopsis = flat(self.section("vllmctl.1", "SYNOPSIS"))
        description = flat(self.section("vllmctl.1", "DESCRIPTION"))
        commands = self.vllmctl_commands()
        self.assertGreater(len(commands), 10)  # the discovery found the commands
        for command, blocks in commands:
            name = " ".join(command)
            if command and "Subcommands" not in blocks:  # a leaf: it runs something
                with self.subTest(command=name):
                    self.assertIn("vllmctl " + name, synopsis)
                    self.assertIn(name, description)
            for entry in blocks.get("Options", []) + blocks.get("Positionals", []):
                for flag in option_names(entry):
                    with self.subTest(command=name or "vllmctl", flag=flag):
                        self.assertTrue(has_word(options, flag),
                                        f"{flag} ({name or 'global'}) has no entry in OPTIONS")

    def test_vllmctl_page_has_the_exit_codes_and_environment_of_its_help(self):
        blocks = self.vllmctl_help([])
        codes = blocks.get("Exit codes", [])
        self.assertEqual(codes, ["0", "64", "65", "66", "69", "70", "75", "77", "78"])
        exit_status = self.section("vllmctl.1", "EXIT STATUS")
        tags = exit_tags(exit_status)
        self.assertEqual(tags, codes)
        variables = blocks.get("Environment", [])
        self.assertEqual(variables, ["VLLMCTL_SERVER", "VLLMCTL_TOKEN", "VLLMCTL_TOKEN_FILE",
                                     "VLLMCTL_CACERT", "VLLMCTL_SESSION"])
        environment = flat(self.section("vllmctl.1", "ENVIRONMENT"))
        for variable in variables:
            self.assertTrue(has_word(environment, variable), variable)

    def test_vllmctl_page_has_a_training_loop_example(self):
        examples = flat(self.section("vllmctl.1", "EXAMPLES"))
        self.assertIn("weights sync", examples)
        self.assertRegex(examples, r"while .* done")

    # --- vllmd(8) -------------------------------------------------------------------------

    def vllmd_flags(self):
        result = run([self.vllmd, "--help"], env=self.env)
        self.assertEqual(result.returncode, 0, result)
        flags = [flag for entry in help_blocks(result.stdout).get("Options", [])
                 for flag in option_names(entry)]
        self.assertIn("--port", flags)  # the parse found the options
        return flags

    def test_vllmd_page_has_every_flag(self):
        options = tag_lines(self.section("vllmd.8", "OPTIONS"))
        for flag in self.vllmd_flags():
            with self.subTest(flag=flag):
                self.assertTrue(has_word(options, flag), f"{flag} has no entry in OPTIONS")

    def test_vllmd_page_has_modes_signals_and_exit_codes(self):
        text = flat(self.pages["vllmd.8"])
        for word in ["embedded", "external", "managed", "SIGTERM", "SIGHUP", "READY=1",
                     "STOPPING=1", "WATCHDOG=1", "/health", "/metrics"]:
            with self.subTest(word=word):
                self.assertTrue(has_word(text, word), word)
        exit_status = self.section("vllmd.8", "EXIT STATUS")
        tags = exit_tags(exit_status)
        self.assertEqual(tags, ["0", "64", "69", "78"])

    def test_vllmd_page_names_only_real_variables(self):
        documented = {entry["Environment"].split()[0]
                      for entry in self.toml_entries().values()} | {"VLLMD_CONFIG"}
        for variable in set(re.findall(r"\bVLLMD?_[A-Z_]+", flat(self.pages["vllmd.8"]))):
            with self.subTest(variable=variable):
                self.assertIn(variable, documented)

    # --- vllm-ref-engine(1) -------------------------------------------------------------

    def test_ref_engine_page_has_every_flag(self):
        result = run([self.ref_engine, "--help"], env=self.env)
        self.assertEqual(result.returncode, 0, result)
        blocks = help_blocks(result.stdout)
        flags = [flag for group in ["Options", "Fault injection"]
                 for entry in blocks.get(group, []) for flag in option_names(entry)]
        self.assertIn("--handshake", flags)  # the parse found the options
        self.assertIn("--inject-fail", flags)  # and the fault-injection group
        options = tag_lines(self.section("vllm-ref-engine.1", "OPTIONS"))
        for flag in flags:
            with self.subTest(flag=flag):
                self.assertTrue(has_word(options, flag), f"{flag} has no entry in OPTIONS")

    def test_ref_engine_page_has_its_exit_codes(self):
        tags = exit_tags(self.section("vllm-ref-engine.1", "EXIT STATUS"))
        self.assertEqual(tags, ["0", "1", "64"])

    # --- vllmd.toml(5) --------------------------------------------------------------------

    def test_toml_page_examples_are_valid_configurations(self):
        with open(page_path("vllmd.toml.5"), encoding="utf-8") as handle:
            source = handle.read()
        examples = []
        for block in re.findall(r"^\.EX\n(.*?)^\.EE$", source, re.M | re.S):
            text = block.replace("\\-", "-").replace("\\e", "\\").replace("\\(dq", '"')
            if text.startswith("["):
                examples.append(text)
        self.assertGreaterEqual(len(examples), 2)
        key_file = self.write("api-keys", "sample-key\n")
        for index, text in enumerate(examples):
            with self.subTest(example=index):
                tomllib.loads(text)
                text = re.sub(r'(?m)^api_key_file = ".*"$', f'api_key_file = "{key_file}"', text)
                path = self.write(f"example{index}.toml", text)
                result = run([self.vllmd, "--config", path, "--check-config"], env=self.env)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def print_config(self, *args, config="", env=None):
        path = self.write("vllmd.toml", config)
        result = run([self.vllmd, "--config", path, *args, "--print-config"],
                     env={**self.env, **(env or {})})
        self.assertEqual(result.returncode, 0, result)
        table = tomllib.loads(result.stdout)
        return {f"{section}.{key}": value
                for section, keys in table.items() for key, value in keys.items()}

    def toml_entries(self):
        """{key: {field: value}} from vllmd.toml(5)'s OPTIONS: each entry's tag is the
        setting's table.key, followed by Type:, Default:, Flag:, Environment:, Reload:."""
        entries = {}
        current = None
        for line in self.section("vllmd.toml.5", "OPTIONS"):
            tag = re.match(r" {7}([a-z_]+\.[a-z_]+)(?:\s|$)", line)
            if tag:
                current = entries.setdefault(tag.group(1), {})
                continue
            field = re.fullmatch(r" +(Type|Default|Flag|Environment|Reload): +(.*)", line)
            if field and current is not None:
                current[field.group(1)] = field.group(2).strip()
        return entries

    def test_toml_page_has_every_key_with_all_its_fields(self):
        defaults = self.print_config()
        entries = self.toml_entries()
        self.assertEqual(sorted(entries), sorted(defaults))
        for key, entry in entries.items():
            with self.subTest(key=key):
                self.assertEqual(sorted(entry),
                                 ["Default", "Environment", "Flag", "Reload", "Type"])
                expected = "reloaded on SIGHUP" if key in RELOADABLE else "restart needed"
                self.assertTrue(entry["Reload"].startswith(expected), entry["Reload"])
                # The default's first word, read as TOML, is what vllmd really uses.
                default = tomllib.loads("value = " + entry["Default"].split(" ")[0])["value"]
                self.assertEqual(default, defaults[key])

    def sample(self, key, default):
        """A valid value for `key` other than its default: (text to pass, value printed)."""
        samples = {
            "server.host": "127.0.0.2",
            "server.api_keys": "sample-key",
            "server.api_key_file": self.write("keys", "sample-key\n"),
            "server.port_file": os.path.join(self.workdir, "port"),
            "server.allowlist": "10.1.0.0/16",
            # Read at load (must be readable), parsed only when the listener starts.
            "server.tls_cert_file": self.write("cert.pem", "sample certificate\n"),
            "server.tls_key_file": self.write("key.pem", "sample key\n"),
            "engine.mode": "embedded",
            "engine.handshake_address": "tcp://127.0.0.1:5571",
            "engine.advertised_host": "10.0.0.5",
            "engine.data_parallel_master": "10.0.0.7:29600",
            "engine.command": "engine --handshake {handshake_address}",
            "engine.backend": "ipc",
            "engine.load_format": "dummy",
            "engine.served_model_name": "Qwen/Qwen3-8B",
            # Read at load: a directory holding a config.json.
            "engine.model": os.path.dirname(self.write("config.json", '{"vocab_size": 8}')),
            "log.level": "debug",
        }
        if key == "server.api_keys":
            return samples[key], ["<redacted>"]
        if key == "server.allowlist":
            return samples[key], [samples[key]]
        if key == "engine.command":
            return samples[key], samples[key].split()
        if key in samples:
            return samples[key], samples[key]
        if isinstance(default, bool):
            return ("false" if default else "true"), not default
        if isinstance(default, (int, float)):
            # Settings in seconds print whole numbers like integers; n + 1 fits every range.
            return str(default + 1), default + 1
        raise AssertionError(f"no sample value for {key}: add one to sample()")

    def test_toml_page_flags_and_variables_set_their_keys(self):
        # External mode, so that every engine setting (data_parallel_size 2 too) is valid.
        base = '[engine]\nmode = "external"\nhandshake_address = "tcp://127.0.0.1:5570"\n'
        claimed_flags = set()
        for key, entry in self.toml_entries().items():
            # A TLS key needs its certificate (a certificate alone may hold both).
            companion = ""
            if key == "server.tls_key_file":
                cert = self.write("cert.pem", "sample certificate\n")
                companion = f'[server]\ntls_cert_file = "{cert}"\n'
            config = companion + base
            if key == "engine.data_parallel_master":  # coordinated DP needs DP >= 2
                config += "data_parallel_size = 2\n"
            before = self.print_config(config=config)
            text, value = self.sample(key, before[key])
            variable = entry["Environment"].split()[0]
            with self.subTest(key=key, variable=variable):
                after = self.print_config(config=config, env={variable: text})
                self.assertEqual(after[key], value, f"{variable}={text} did not set {key}")
                # Nothing else changed (but a key file's keys join server.api_keys).
                others = {key, "server.api_keys"} if key == "server.api_key_file" else {key}
                self.assertEqual({k: v for k, v in after.items() if k not in others},
                                 {k: v for k, v in before.items() if k not in others})
            flag = entry["Flag"].split()[0]
            if flag == "none":
                continue
            claimed_flags.add(flag)
            with self.subTest(key=key, flag=flag):
                argv = [flag] if isinstance(value, bool) else [flag, text]
                after = self.print_config(*argv, config=config)
                self.assertEqual(after[key], value, f"{flag} {text} did not set {key}")
        # Every setting flag of `vllmd --help` belongs to a documented key.
        self.assertEqual(claimed_flags, set(self.vllmd_flags()) - VLLMD_COMMAND_FLAGS)

    def test_the_routes_list_is_the_api_table(self):
        # vllmd(8)'s Routes list is the API table (vllmd --print-routes): every route, under
        # "Dev mode only" or "Always" as the table gates it, and nothing else.
        result = run([self.vllmd, "--print-routes"], env=self.env)
        self.assertEqual(result.returncode, 0, result.stderr)
        table = set()
        for line in result.stdout.splitlines():
            method, path, when, summary = line.split("\t")
            self.assertIn(when, ("dev", "always"), line)
            self.assertTrue(summary, line)
            table.add((when, f"{method} {path}"))
        lines = self.section("vllmd.8", "DESCRIPTION")
        start = lines.index("   Routes")
        listed = set()
        when = None
        for line in lines[start + 1:]:
            if re.match(r" {3}\S", line):
                break  # the next subsection
            if re.fullmatch(r" {7}Dev mode only:", line):
                when = "dev"
            elif re.fullmatch(r" {7}Always:", line):
                when = "always"
            elif match := re.match(r" {7}(GET|POST) (/\S+)(\s|$)", line):
                listed.add((when, f"{match.group(1)} {match.group(2)}"))
        self.assertEqual(listed, table)


if __name__ == "__main__":
    unittest.main()
