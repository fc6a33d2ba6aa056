"""The Debian package: `cpack -G DEB` (into a temp directory, from the build tree) makes
vllmd_<version>_<arch>.deb, which `dpkg --root` installs into a scratch root. Checks what
it holds and declares, that lintian finds no error and no warning in it, that the binaries
carry the hardening (PIE, RELRO, BIND_NOW, stack protector, fortified calls), that the
installed binaries run on the system's libraries, that man finds the pages, that the example
configuration is a registered conffile and valid, and that `systemd-analyze verify` accepts
the unit.

The unit names /usr/bin/vllmd, which is not where the scratch root puts it: verify runs on a
copy whose Exec lines point into the scratch root, with MANPATH set to the scratch root's man
pages so that its Documentation= references resolve (verify runs `man` for each).

Environment (set by ctest): CPACK, BUILD_DIR, SOURCE_DIR, VLLMD_BIN. Needs dpkg-dev
(dpkg-shlibdeps), man-db, systemd (systemd-analyze), binutils and lintian (the lintian test
is skipped without it): scripts/deps.sh.
"""

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import unittest

FILES = {
    "etc/vllmd/vllmd.toml": "daemon/vllmd.toml",
    "usr/lib/systemd/system/vllmd.service": "daemon/vllmd.service",
    "usr/share/doc/vllmd/changelog.gz": "cmake/packaging/changelog",
    "usr/share/doc/vllmd/copyright": "cmake/packaging/copyright",
    "usr/share/lintian/overrides/vllmd": "cmake/packaging/lintian-overrides",
    "usr/share/man/man1/vllm-ref-engine.1.gz": "man/vllm-ref-engine.1",
    "usr/share/man/man1/vllmctl.1.gz": "man/vllmctl.1",
    "usr/share/man/man5/vllmd.toml.5.gz": "man/vllmd.toml.5",
    "usr/share/man/man8/vllmd.8.gz": "man/vllmd.8",
}
# Shell completion: what the packaged vllmctl prints for each shell.
COMPLETIONS = {
    "usr/share/bash-completion/completions/vllmctl": "bash",
    "usr/share/zsh/vendor-completions/_vllmctl": "zsh",
    "usr/share/fish/vendor_completions.d/vllmctl.fish": "fish",
}
BINARIES = ["vllmd", "vllmctl", "vllm-ref-engine"]
CONFFILE = "/etc/vllmd/vllmd.toml"
# Packages the binaries need (NEEDED entries: Poco, ZeroMQ, libsystemd, toml++, the C++
# runtime), as dpkg-shlibdeps names them on Debian 12.
DEPENDS = [r"libc6", r"libstdc\+\+6", r"libpoconet\d+", r"libpocofoundation\d+", r"libzmq5",
           r"libsystemd0", r"libtomlplusplus\d+"]


def required_env(variable):
    value = os.environ.get(variable)
    if not value:
        # Not a skip: a misconfigured run must not pass silently.
        raise RuntimeError(f"{variable} is not set (ctest sets it; or export it by hand)")
    return value


def tool(name, package):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed ({package}; scripts/deps.sh installs it)")
    return path


def run(argv, env=None, cwd=None, timeout=120):
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


def system_env(**extra):
    """The environment without anything that would point the binaries at other libraries."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "MANPATH", "DESTDIR")
           and not key.startswith(("VLLMD_", "VLLM_", "VLLMCTL_"))}
    env.update(extra)
    return env


class DebPackageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.source_dir = required_env("SOURCE_DIR")
        build_dir = required_env("BUILD_DIR")
        version = run([required_env("VLLMD_BIN"), "--version"]).stdout.split()
        cls.version = version[-1]
        cls.arch = run([tool("dpkg", "dpkg"), "--print-architecture"]).stdout.strip()
        cls.workdir = tempfile.mkdtemp(prefix="vllmd-it-deb-")
        try:
            cls.build_package(build_dir)
            cls.install_package()
        except BaseException:
            shutil.rmtree(cls.workdir, True)
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.workdir, True)

    @classmethod
    def build_package(cls, build_dir):
        tool("dpkg-shlibdeps", "dpkg-dev")
        out = os.path.join(cls.workdir, "out")
        result = run([required_env("CPACK"), "-G", "DEB", "-B", out,
                      "--config", os.path.join(build_dir, "CPackConfig.cmake")],
                     env=system_env(), cwd=build_dir, timeout=240)
        if result.returncode != 0:
            raise AssertionError(f"cpack failed:\n{result.stdout}\n{result.stderr}")
        cls.debs = sorted(name for name in os.listdir(out) if name.endswith(".deb"))
        cls.deb = os.path.join(out, f"vllmd_{cls.version}_{cls.arch}.deb")

    @classmethod
    def install_package(cls):
        # A dpkg database of its own: nothing of the host's is read or written.
        cls.root = os.path.join(cls.workdir, "root")
        for directory in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"]:
            os.makedirs(os.path.join(cls.root, directory))
        open(os.path.join(cls.root, "var/lib/dpkg/status"), "w").close()
        cls.install = run([tool("dpkg", "dpkg"), f"--root={cls.root}",
                           f"--log={cls.root}/var/log/dpkg.log",
                           "--force-depends", "--force-not-root", "-i", cls.deb],
                          env=system_env())

    def path(self, relative):
        return os.path.join(self.root, relative)

    def field(self, name):
        result = run(["dpkg-deb", "--field", self.deb, name])
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout.strip()

    # --- the .deb itself --------------------------------------------------------------

    def test_cpack_makes_one_deb_named_by_debian_rules(self):
        self.assertEqual(self.debs, [os.path.basename(self.deb)])

    def test_control_fields(self):
        self.assertEqual(self.field("Package"), "vllmd")
        self.assertEqual(self.field("Version"), self.version)
        self.assertEqual(self.field("Architecture"), self.arch)
        self.assertEqual(self.field("Section"), "net")
        self.assertRegex(self.field("Maintainer"), r".+ <.+@.+>")
        description = self.field("Description").splitlines()
        self.assertGreater(len(description), 2)
        self.assertIn("vllmd", description[0])
        self.assertEqual(self.field("Homepage"), "")

    def test_depends_names_the_system_libraries(self):
        info = run(["dpkg-deb", "--info", self.deb]).stdout
        self.assertRegex(info, r"(?m)^ Depends: ")
        depends = [re.match(r"\s*([^\s(]+)", item).group(1)
                   for item in self.field("Depends").split(",")]
        for pattern in DEPENDS:
            with self.subTest(package=pattern):
                self.assertTrue(any(re.fullmatch(pattern, name) for name in depends), depends)
        # Real packages: each is installed here, where the binaries were linked.
        for name in depends:
            with self.subTest(installed=name):
                status = run(["dpkg-query", "-W", "-f=${Status}", name]).stdout
                self.assertEqual(status, "install ok installed")

    def test_conffiles_lists_the_example_configuration(self):
        result = run(["dpkg-deb", "--info", self.deb, "conffiles"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, CONFFILE + "\n")

    def test_lintian_reports_no_error_or_warning(self):
        lintian = shutil.which("lintian")
        if lintian is None:
            self.skipTest("lintian is not installed (scripts/deps.sh installs it)")
        # Every tag shown, info and pedantic too, so that the failure message has them all;
        # only errors and warnings fail, and overrides that no longer match (stale reasons).
        result = run([lintian, "--pedantic", "--display-info", "--display-experimental",
                      "--no-tag-display-limit", self.deb], env=system_env(), timeout=240)
        tags = [line for line in result.stdout.splitlines() if re.match(r"[A-Z]: ", line)]
        bad = [line for line in tags if line.startswith(("E: ", "W: "))
               or re.search(r"\b(unused|mismatched)-override\b", line)]
        self.assertEqual(bad, [], "lintian:\n" + result.stdout + result.stderr)
        self.assertNotEqual(result.returncode, 2, result.stderr)  # 2: lintian itself failed

    def test_binaries_are_hardened(self):
        readelf = tool("readelf", "binutils")
        for binary in BINARIES:
            with self.subTest(binary):
                path = self.path(f"usr/bin/{binary}")
                headers = run([readelf, "--wide", "--file-header", "--program-headers",
                               "--dynamic", path]).stdout
                symbols = run([readelf, "--wide", "--dyn-syms", path]).stdout
                imported = set(re.findall(r"\bUND (\w+)", symbols))
                self.assertRegex(headers, r"Type:\s+DYN")  # PIE: position independent
                self.assertRegex(headers, r"\(FLAGS_1\).*\bPIE\b")
                self.assertRegex(headers, r"(?m)^\s*GNU_RELRO\b")  # -z relro
                self.assertRegex(headers, r"\(FLAGS\).*\bBIND_NOW\b|\(FLAGS_1\).*\bNOW\b")
                self.assertIn("__stack_chk_fail", imported)  # -fstack-protector-strong
                fortified = {name for name in imported if re.fullmatch(r"__\w+_chk", name)}
                self.assertTrue(fortified - {"__stack_chk_fail"}, sorted(imported))
                # Not checked: -fcf-protection's IBT/SHSTK marking. Our objects have it, but
                # the linker keeps it only when every input has it, and Debian 12's glibc start
                # files (Scrt1.o, crti.o) do not: no program linked there is marked.

    def test_contents_are_the_binaries_pages_unit_completion_and_config(self):
        listing = run(["dpkg-deb", "--contents", self.deb]).stdout.splitlines()
        files = {}
        for line in listing:
            mode, owner, _size, _date, _time, name = line.split(None, 5)
            self.assertEqual(owner, "root/root", line)
            if mode.startswith("-"):
                files[name.removeprefix("./")] = mode
        expected = set(FILES) | set(COMPLETIONS) | {f"usr/bin/{binary}" for binary in BINARIES}
        self.assertEqual(set(files), expected)
        for binary in BINARIES:
            self.assertEqual(files[f"usr/bin/{binary}"], "-rwxr-xr-x")
        for name in set(FILES) | set(COMPLETIONS):
            self.assertEqual(files[name], "-rw-r--r--", name)

    # --- installed into the scratch root ------------------------------------------------

    def test_dpkg_installs_it_and_registers_the_conffile(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)
        admindir = self.path("var/lib/dpkg")
        result = run(["dpkg-query", f"--admindir={admindir}", "-W",
                      "-f=${Status}\n${Conffiles}\n", "vllmd"])
        self.assertEqual(result.returncode, 0, result.stderr)
        status, conffiles = result.stdout.split("\n", 1)
        self.assertEqual(status, "install ok installed")
        with open(self.path(CONFFILE.lstrip("/")), "rb") as handle:
            digest = hashlib.md5(handle.read()).hexdigest()
        self.assertEqual(conffiles.split(), [CONFFILE, digest])

    def test_installed_files_are_the_sources(self):
        for installed, source in FILES.items():
            with self.subTest(installed):
                opener = gzip.open if installed.endswith(".gz") else open
                with opener(self.path(installed), "rb") as handle:
                    content = handle.read()
                with open(os.path.join(self.source_dir, source), "rb") as handle:
                    self.assertEqual(content, handle.read())

    def test_installed_completion_is_what_vllmctl_prints(self):
        for installed, shell in COMPLETIONS.items():
            with self.subTest(installed):
                printed = run([self.path("usr/bin/vllmctl"), "completion", shell],
                              env=system_env())
                self.assertEqual(printed.returncode, 0, printed.stderr)
                with open(self.path(installed), encoding="utf-8") as handle:
                    self.assertEqual(handle.read(), printed.stdout)

    def test_installed_binaries_run_on_the_system_libraries(self):
        for binary in BINARIES:
            path = self.path(f"usr/bin/{binary}")
            with self.subTest(binary):
                dynamic = run(["objdump", "-p", path]).stdout
                self.assertIn("NEEDED", dynamic)
                self.assertNotRegex(dynamic, r"\b(RPATH|RUNPATH)\b")  # no build-tree paths
                argv = [path, "--version"] if binary == "vllmd" else [path, "--help"]
                result = run(argv, env=system_env())
                self.assertEqual(result.returncode, 0, result.stderr)
                if binary == "vllmd":
                    self.assertEqual(result.stdout, f"vllmd {self.version}\n")

    def test_installed_example_configuration_is_valid(self):
        result = run([self.path("usr/bin/vllmd"), "--config", self.path(CONFFILE.lstrip("/")),
                      "--check-config"], env=system_env())
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_man_finds_the_pages(self):
        man_dir = self.path("usr/share/man")
        for args, page in [(["vllmctl"], "man1/vllmctl.1.gz"), (["8", "vllmd"], "man8/vllmd.8.gz"),
                           (["5", "vllmd.toml"], "man5/vllmd.toml.5.gz"),
                           (["vllm-ref-engine"], "man1/vllm-ref-engine.1.gz")]:
            with self.subTest(page):
                result = run([tool("man", "man-db"), "-M", man_dir, "-w", *args],
                             env=system_env())
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stdout.strip(), os.path.join(man_dir, page))

    def verify_unit(self, man_path):
        """systemd-analyze verify on the installed unit, its Exec lines pointing into the
        scratch root; MANPATH=man_path for the Documentation= checks."""
        with open(self.path("usr/lib/systemd/system/vllmd.service"), encoding="utf-8") as handle:
            unit = handle.read()
        lines = []
        for line in unit.splitlines():
            if line.startswith("Exec"):
                for binary in BINARIES:
                    line = re.sub(rf"(?<![\w/])/usr/bin/{re.escape(binary)}\b",
                                  self.path(f"usr/bin/{binary}"), line)
            lines.append(line)
        unit_dir = tempfile.mkdtemp(dir=self.workdir)
        with open(os.path.join(unit_dir, "vllmd.service"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        return run([tool("systemd-analyze", "systemd"), "verify",
                    os.path.join(unit_dir, "vllmd.service")],
                   env=system_env(MANPATH=man_path, SYSTEMD_LOG_COLOR="0"))

    def test_systemd_analyze_verify_accepts_the_unit(self):
        result = self.verify_unit(self.path("usr/share/man"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout + result.stderr, "")
        # The check is live: without the pages, verify reports the Documentation= references.
        result = self.verify_unit(os.path.join(self.workdir, "no-man-pages"))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("man vllmd(8)", result.stderr)


if __name__ == "__main__":
    unittest.main()
