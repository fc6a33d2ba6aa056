#!/usr/bin/python3
"""Every source file includes only what its layer may, as ARCHITECTURE.md's Layers table says.

The table (the "## Layers" section of ARCHITECTURE.md) has one row per folder: the folder, and
what its files may include besides the folder itself, as folders ("common/wire/") or single
files ("common/engine/endpoints.hpp"), or "nothing". This check reads every C++ source and
header under those folders and fails, naming file:line, for

- an include of the repository's own code that the including file's row does not allow (an
  include is the repository's when its first path component is a top-level folder of the
  repository, or when it names a file relative to the including file's folder);
- a source file under common/ that no row covers, so that a new folder gets a row;
- a row naming a folder or file that does not exist, and a table that is missing or empty.

A file's row is the one with the longest folder that contains it. Tests are not checked: they
may include any layer. Debian's python3, standard library only.
Usage: check_layers.py [--root DIR] [--self-test]
"""

import argparse
import os
import re
import sys

from tree_check import default_root, judge, run_on_tree

DOCUMENT = "ARCHITECTURE.md"
SECTION = "## Layers"
SOURCES = (".cpp", ".hpp", ".h", ".cc", ".hpp.in")
SKIP_DIRS = {".git", "__pycache__"}
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]')
QUOTED = re.compile(r"`([^`]+)`")
# Generated into the build tree (common/version.hpp.in -> <build>/generated/common/version.hpp):
# the only include of the repository's that may name a file not in the source tree.
GENERATED = {"common/version.hpp": "common/version.hpp.in"}



def read_table(root):
    """The rows as {folder: [allowed, ...]}, and problems as (file, line, message)."""
    path = os.path.join(root, DOCUMENT)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except OSError as error:
        return {}, [(DOCUMENT, 0, "cannot read: " + str(error))]
    rows, problems = {}, []
    inside = False
    for index, line in enumerate(lines):
        if line.startswith("#"):
            inside = line.strip() == SECTION
            continue
        if not inside or not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue  # the separator row
        folder = QUOTED.findall(cells[0])
        if not folder:
            continue  # the header row
        allowed = QUOTED.findall(cells[1])
        if len(folder) != 1 or not folder[0].endswith("/") or (
                not allowed and cells[1] != "nothing"):
            problems.append((DOCUMENT, index + 1, "a Layers row is `folder/` | `path`, ... "
                             "or nothing: " + line.strip()))
            continue
        rows[folder[0]] = allowed
        for entry in [folder[0]] + allowed:
            if not exists(root, entry):
                problems.append((DOCUMENT, index + 1, entry + " is not in the repository"))
    if not rows and not problems:
        problems.append((DOCUMENT, 0, "no Layers table (a \"%s\" section with rows like "
                         "| `common/wire/` | `common/util/` |)" % SECTION))
    return rows, problems


def exists(root, entry):
    if entry.endswith("/"):
        return os.path.isdir(os.path.join(root, entry))
    return os.path.isfile(os.path.join(root, GENERATED.get(entry, entry)))


def source_files(root, top):
    for folder, dirs, files in os.walk(os.path.join(root, top)):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(SOURCES):
                yield os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")


def row_of(rows, relative):
    containing = [folder for folder in rows if relative.startswith(folder)]
    return max(containing, key=len) if containing else None


def top_folders(root):
    return {name for name in os.listdir(root)
            if os.path.isdir(os.path.join(root, name)) and not name.startswith(".")}


def own_target(root, tops, relative, included):
    """The repository path an include names, or None when it is not the repository's."""
    if included.split("/")[0] in tops and not included.startswith(("./", "../")):
        return included
    beside = os.path.normpath(os.path.join(os.path.dirname(relative), included))
    if not beside.startswith("..") and os.path.isfile(os.path.join(root, beside)):
        return beside.replace(os.sep, "/")
    return None


def check(root):
    """Problems as (file, line, message), and the number of the repository's includes seen."""
    rows, problems = read_table(root)
    if not rows:
        return problems, 0
    seen = 0
    tops = top_folders(root)
    for top in sorted({folder.split("/")[0] for folder in rows}):
        for relative in source_files(root, top):
            row = row_of(rows, relative)
            if row is None:
                if relative.startswith("common/") and relative.count("/") > 1:
                    problems.append((relative, 0, "no row of the Layers table in %s covers "
                                     "its folder" % DOCUMENT))
                continue
            with open(os.path.join(root, relative), "rb") as handle:
                text = handle.read().decode("utf-8", errors="replace")
            for index, line in enumerate(text.split("\n")):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = own_target(root, tops, relative, match.group(2))
                if target is None:
                    continue
                seen += 1
                allowed = [row] + rows[row]
                if any(target == entry or (entry.endswith("/") and target.startswith(entry))
                       for entry in allowed):
                    continue
                may = ", ".join(rows[row]) or "nothing"
                problems.append((relative, index + 1, "includes %s: %s may include %s (%s, "
                                 "Layers)" % (target, row, may, DOCUMENT)))
    return problems, seen


def self_test():
    """The checker against a small tree of known good and bad includes."""
    table = ("# Architecture\n## Layers\n\n| folder | may include, besides itself |\n"
             "|---|---|\n| `common/util/` | nothing |\n| `common/wire/` | `common/util/` |\n"
             "| `common/reference/` | `common/wire/`, `common/engine/endpoints.hpp` |\n"
             "| `common/engine/` | `common/wire/`, `common/util/` |\n"
             "| `daemon/` | `common/`, `common/version.hpp` |\n"
             "| `cmd/` | nothing at all |\n## Next\n| `tests/` | `common/` |\n")
    tree = {
        "ARCHITECTURE.md": table,
        "common/version.hpp.in": "#pragma once\n",
        "common/util/log.hpp": "#include <string>\n#include \"common/util/log.hpp\"\n",
        "common/wire/codec.cpp": "#include \"common/util/log.hpp\"\n"
                                 "#include \"common/engine/endpoints.hpp\"\n"
                                 "  #  include <common/reference/core.hpp>\n",
        "common/engine/endpoints.hpp": "#include <msgpack.hpp>\n#include \"../wire/codec.cpp\"\n",
        "common/engine/client.cpp": "#include \"endpoints.hpp\"\n#include \"daemon/engines.hpp\"\n"
                                    "#include \"../reference/core.hpp\"\n",
        "common/reference/core.hpp": "#include \"common/engine/endpoints.hpp\"\n"
                                     "#include \"common/engine/client.cpp\"\n",
        "common/api/service.cpp": "#include \"common/wire/codec.cpp\"\n",
        "daemon/engines.hpp": "#include \"common/version.hpp\"\n"
                              "#include \"common/reference/core.hpp\"\n#include \"cmd/x.cpp\"\n",
        "cmd/x.cpp": "#include \"common/util/log.hpp\"\n",
        "tests/t.cpp": "#include \"daemon/engines.hpp\"\n",
    }
    expected = {
        ("common/wire/codec.cpp", 2, "common/engine/endpoints.hpp"),
        ("common/wire/codec.cpp", 3, "common/reference/core.hpp"),
        ("common/engine/client.cpp", 2, "daemon/engines.hpp"),
        ("common/engine/client.cpp", 3, "common/reference/core.hpp"),
        ("common/reference/core.hpp", 2, "common/engine/client.cpp"),
        ("common/api/service.cpp", 0, "no row"),
        ("daemon/engines.hpp", 3, "cmd/x.cpp"),
        ("ARCHITECTURE.md", 11, "a Layers row"),
    }
    problems, seen = run_on_tree(tree, check)
    return judge(problems, expected, seen, 13, "includes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=default_root(),
                        help="the repository (default: %(default)s)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the checker against a tree of known includes")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems, seen = check(args.root)
    for relative, number, message in problems:
        print("%s:%d: %s" % (relative, number, message))
    if seen == 0 and not problems:
        print("no includes of the repository's code found under %s: the scan is broken"
              % args.root)
        return 1
    if problems:
        print("%d layering problem(s); %d includes checked" % (len(problems), seen))
        return 1
    print("ok: %d includes checked against %s's Layers table" % (seen, DOCUMENT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
