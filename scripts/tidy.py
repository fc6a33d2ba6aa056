"""clang-tidy (.clang-tidy) over every C++ file the build compiles, production and tests, in
parallel, with a cache of the files found clean; any finding fails. scripts/tidy.sh runs it.

A file is analysed again only when something it is analysed from changed. Its key hashes
clang-tidy's version, .clang-tidy, the file's compile command and the contents of every file
its object depends on, as the build recorded them (Ninja keeps the compiler's -MD lists in its
own log, .ninja_deps, and deletes the .d files): the file itself, our headers and the
system's. A key with a stamp in the cache was analysed clean before. Files the build has no
up-to-date list for (not built yet, or changed since) are always analysed. Paths under the source tree are hashed relative to
it, so another clone of the tree shares the cache (.ci/run's fresh clones do).
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import time

TIDY = "clang-tidy-14"
SOURCE_FOLDERS = ("common/", "daemon/", "cmd/", "tests/")
# run-clang-tidy's noise: per-file warning counts and the hints about suppressed ones.
NOISE = re.compile(r"^([0-9]+ warnings? (and [0-9]+ errors? )?generated|Suppressed |"
                   r"Use -header-filter)")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", "build"))
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache-dir", default=os.environ.get("VLLMD_TIDY_CACHE") or
                        os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                     os.path.expanduser("~/.cache"), "vllmd-tidy"))
    parser.add_argument("--no-cache", action="store_true", help="analyse every file")
    return parser.parse_args()


class Hasher:
    """Contents of files, hashed once each; paths under `root` named relative to it."""

    def __init__(self, root):
        self.root = root + os.sep
        self.digests = {}

    def name(self, path):
        return path[len(self.root):] if path.startswith(self.root) else path

    def digest(self, path):
        if path not in self.digests:
            with open(path, "rb") as handle:
                self.digests[path] = hashlib.sha256(handle.read()).hexdigest()
        return self.digests[path]


def recorded_dependencies(build_dir):
    """{object path relative to the build: [files it was compiled from]}, from Ninja's log.

    The log (.ninja_deps, format version 4) is read here rather than through `ninja -t deps`:
    that command opens the log for writing and may recompact it, which made a build started
    beside it (.ci/run's test stage) find no dependencies and recompile everything. An object
    whose record is older than the object itself (STALE to Ninja) is left out."""
    path = os.path.join(build_dir, ".ninja_deps")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    if not data.startswith(b"# ninjadeps\n") or len(data) < 16:
        return {}
    if struct.unpack_from("<i", data, 12)[0] != 4:
        return {}  # another format: analyse everything
    names, records, at = [], {}, 16
    while at + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, at)
        at += 4
        is_deps, size = size & 0x80000000, size & 0x7FFFFFFF
        if at + size > len(data):
            break  # a record still being written
        if is_deps:
            output, low, high = struct.unpack_from("<iII", data, at)
            count = (size - 12) // 4
            records[output] = ((high << 32) | low, struct.unpack_from(f"<{count}i", data, at + 12))
        else:
            names.append(data[at:at + size - 4].rstrip(b"\0").decode("utf-8", "replace"))
        at += size
    recorded = {}
    for output, (mtime, dependencies) in records.items():
        if output >= len(names) or any(index >= len(names) for index in dependencies):
            continue
        target = names[output]
        try:
            if os.stat(os.path.join(build_dir, target)).st_mtime_ns > mtime:
                continue  # rebuilt since its dependencies were recorded
        except OSError:
            continue
        recorded[os.path.normpath(target)] = [
            os.path.normpath(os.path.join(build_dir, names[index])) for index in dependencies]
    return recorded


def key_of(entry, root, hasher, common, recorded):
    """The file's cache key, or None when the build has no dependency list for it."""
    command = entry.get("command") or shlex.join(entry["arguments"])
    output = entry.get("output")
    if output is None:
        found = re.search(r"(?:^|\s)-o\s+(\S+)", command)
        if not found:
            return None
        output = found.group(1)
    files = recorded.get(os.path.normpath(output))
    if not files:
        return None
    key = hashlib.sha256(common)
    key.update(command.replace(root, ".").encode())
    try:
        # Sorted by the name hashed, so that every clone orders them alike.
        for name, path in sorted({(hasher.name(path), path) for path in files}):
            key.update(f"\n{name} {hasher.digest(path)}".encode())
    except OSError:
        return None  # a header is gone: the record is stale, analyse
    return key.hexdigest()


def analyse(build_dir, path):
    started = time.monotonic()
    result = subprocess.run(
        [TIDY, "-p", build_dir, "--quiet", "--extra-arg=-Wno-unknown-warning-option", path],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    text = "\n".join(line for line in result.stdout.decode("utf-8", "replace").splitlines()
                     if not NOISE.match(line))
    return path, result.returncode, text.strip(), time.monotonic() - started


def main():
    args = parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build_dir = os.path.abspath(args.build_dir)
    database = os.path.join(build_dir, "compile_commands.json")
    if not os.path.isfile(database):
        print(f"tidy: {database} is missing: build first (scripts/build.sh)", file=sys.stderr)
        return 1
    with open(database, encoding="utf-8") as handle:
        entries = {}
        for entry in json.load(handle):
            path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
            relative = os.path.relpath(path, root)
            if relative.startswith(SOURCE_FOLDERS):
                entries.setdefault(path, entry)

    version = subprocess.run([TIDY, "--version"], stdout=subprocess.PIPE, check=True).stdout
    with open(os.path.join(root, ".clang-tidy"), "rb") as handle:
        common = version + b"\0" + handle.read()
    hasher = Hasher(root)
    recorded = {} if args.no_cache else recorded_dependencies(build_dir)
    keys = {path: (None if args.no_cache else key_of(entry, root, hasher, common, recorded))
            for path, entry in entries.items()}
    os.makedirs(args.cache_dir, exist_ok=True)
    todo = sorted(path for path, key in keys.items()
                  if key is None or not os.path.exists(os.path.join(args.cache_dir, key)))

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for path, code, text, _ in pool.map(lambda p: analyse(build_dir, p), todo):
            if code != 0 or text:
                failed.append(path)
                print(f"--- {os.path.relpath(path, root)}\n{text}", file=sys.stderr)
            elif keys[path] is not None:
                with open(os.path.join(args.cache_dir, keys[path]), "w", encoding="utf-8") as stamp:
                    stamp.write(os.path.relpath(path, root) + "\n")

    summary = (f"tidy: {len(entries)} files, {len(todo)} analysed, "
               f"{len(entries) - len(todo)} unchanged since found clean ({args.cache_dir})")
    if failed:
        print(f"{summary}; findings in {len(failed)} (above, .clang-tidy)", file=sys.stderr)
        return 1
    print(f"{summary}; no findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
