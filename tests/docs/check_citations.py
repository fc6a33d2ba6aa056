#!/usr/bin/python3
"""Every document the tree cites exists, and so does every section it cites.

Sources, scripts, build files, man pages and the documents themselves cite the repository's
contracts by file name, often with a section: "docs/http-api.md §3.2", "engine-protocol.md
section 5", "docs/http-api.md §1.2, §1.3". This check finds every such citation and fails,
naming file:line, for

- a cited document that is not in the repository (a bare name is looked for next to the
  citing file, then in docs/, then at the top level; a path with a slash is taken from the
  top level, or from the citing file's folder; an absolute path is outside the repository);
- a cited section that is not a numbered heading of that document ("## 3. Validation" and
  "### 3.2 Fields" make §3 and §3.2 exist);
- a "§N" that names no document: in a Markdown file it means a section of that file itself,
  anywhere else it must follow a document's name.

Debian's python3, standard library only. Usage: check_citations.py [--root DIR] [--self-test]
"""

import argparse
import os
import re
import sys

from tree_check import default_root, judge, run_on_tree

# Where citations live, relative to the root: folders scanned recursively, and single files.
SCAN_DIRS = ["common", "daemon", "cmd", "tests", "scripts", "cmake", "man", "docs", "examples",
             ".ci"]
SCAN_FILES = ["README.md", "ARCHITECTURE.md", "CMakeLists.txt"]
SKIP_DIRS = {".git", "__pycache__"}
# Text files by name: sources, headers, Python, shell, CMake, man pages, Markdown, configs.
SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".py", ".sh", ".bash", ".cmake", ".md", ".1",
            ".5", ".8", ".toml", ".service", ".bash-completion", ".txt")
# Not documents of the repository but files programs write: docs/real-engine/run.sh writes its
# report as summary.md in the output directory, and docs/real-engine.md talks about it.
NOT_CITATIONS = {"summary.md"}

# A document's name: a path ending in .md, not part of a longer word or path ("hashlib.md5",
# "$OUT/summary.md" are not citations of their own).
DOC = re.compile(r"(?<![\w./$-])(/?(?:[\w.-]+/)*[\w-][\w.-]*\.md)(?![\w])")
NUMBER = r"\d+(?:\.\d+)*(?![\w]|\.\d)"
# What may follow a document's name to cite sections of it: "§3.2", "§1.2, §1.3 and §2",
# "section 5", "sections 4 and 5", with a closing quote or backtick and a comma, colon or
# paren in between. After a "§", every further number needs its own "§" ("§2, 3 times" cites
# §2 only).
LEAD = r"[`'\"]?[ \t]*[,(:]?[ \t]*"
JOIN = r"[ \t]*(?:,|and|or|&)[ \t]*"
SECTIONS = re.compile(
    LEAD + r"(?:§[ \t]*(" + NUMBER + r")((?:" + JOIN + r"§[ \t]*" + NUMBER + r")*)"
    r"|sections?[ \t]+(" + NUMBER + r")((?:" + JOIN + r"(?:§[ \t]*)?" + NUMBER + r")*))")
MORE = re.compile(NUMBER)
BARE = re.compile(r"§[ \t]*(" + NUMBER + r")")
HEADING = re.compile(r"^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?(?:[ \t]|$)")
# Comment leaders a citation's section may continue after, on the next line.
CONTINUATION = re.compile(r"^[ \t]*(?://+|#+|\*+|/\*+|--|;+|\"\"\"|''')?[ \t]*")



def scanned_files(root):
    for name in SCAN_FILES:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            yield name
    for top in SCAN_DIRS:
        base = os.path.join(root, top)
        for folder, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith("_corpus"))
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(SUFFIXES) or name == "CMakeLists.txt" or is_script(path):
                    yield os.path.relpath(path, root)


def is_script(path):
    if "." in os.path.basename(path):
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def read_lines(root, relative):
    with open(os.path.join(root, relative), "rb") as handle:
        return handle.read().decode("utf-8", errors="replace").split("\n")


class Documents:
    """The documents cited so far and their numbered sections, read once each."""

    def __init__(self, root):
        self.root = root
        self.sections = {}

    def resolve(self, citing, name):
        """The cited document's path relative to the root, or None with the reason."""
        if name.startswith("/"):
            return None, "is outside the repository"
        folder = os.path.dirname(citing)
        if name.startswith("./") or name.startswith("../"):
            candidates = [os.path.join(folder, name)]
        elif "/" in name:
            candidates = [name, os.path.join(folder, name)]
        else:
            candidates = [os.path.join(folder, name), os.path.join("docs", name), name]
        for candidate in candidates:
            candidate = os.path.normpath(candidate)
            if candidate.startswith(".."):
                continue
            if os.path.isfile(os.path.join(self.root, candidate)):
                return candidate, None
        looked = ", ".join(os.path.normpath(c) for c in candidates)
        return None, "is not in the repository (looked for " + looked + ")"

    def numbered(self, document):
        if document not in self.sections:
            found = set()
            fenced = False
            for line in read_lines(self.root, document):
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                match = None if fenced else HEADING.match(line)
                if match:
                    found.add(match.group(1))
            self.sections[document] = found
        return self.sections[document]


def continued(lines, index, rest):
    """Text a citation's sections may be read from: the rest of its line or, when nothing but
    punctuation follows the name, that and the start of the next line after its comment
    leader. With the offset in the next line where that start is, or None."""
    if rest.strip(" \t`'\"") or index + 1 >= len(lines):
        return rest, None
    following = lines[index + 1]
    leader = CONTINUATION.match(following).end()
    return rest + " " + following[leader:], leader


def check(root):
    """Problems as (file, line, message), and counts of what was checked."""
    documents = Documents(root)
    problems = []
    citations = 0
    sections_checked = 0
    myself = os.path.abspath(__file__)
    for relative in scanned_files(root):
        if os.path.abspath(os.path.join(root, relative)) == myself:
            continue  # its examples and self-test tree are citations on purpose
        try:
            lines = read_lines(root, relative)
        except OSError as error:
            problems.append((relative, 0, "cannot read: " + str(error)))
            continue
        markdown = relative.endswith(".md")
        # Per line: spans of "§N" that belong to a document named before them.
        attached = [[] for _ in lines]
        for index, line in enumerate(lines):
            number = index + 1
            for match in DOC.finditer(line):
                name = match.group(1)
                if os.path.basename(name) in NOT_CITATIONS:
                    continue
                citations += 1
                rest, leader = continued(lines, index, line[match.end():])
                cited = SECTIONS.match(rest)
                if cited and leader is None:
                    attached[index].append((match.end(), match.end() + cited.end()))
                elif cited:
                    skip = len(line) - match.end() + 1  # the rest of this line and the space
                    attached[index + 1].append((leader, leader + cited.end() - skip))
                wanted = []
                if cited:
                    first, more = (cited.group(1), cited.group(2)) if cited.group(1) else (
                        cited.group(3), cited.group(4))
                    wanted = [first] + MORE.findall(more)
                document, why = documents.resolve(relative, name)
                if document is None:
                    problems.append((relative, number, name + " " + why))
                    continue
                available = documents.numbered(document)
                for section in wanted:
                    sections_checked += 1
                    if section not in available:
                        problems.append((relative, number, "%s has no section §%s (%s)"
                                         % (document, section, summary(available, section))))
            for match in BARE.finditer(line):
                if any(start <= match.start() < end for start, end in attached[index]):
                    continue
                if not markdown:
                    problems.append((relative, number, "§%s names no document: write the "
                                     "document before it (docs/http-api.md §%s)"
                                     % (match.group(1), match.group(1))))
                    continue
                sections_checked += 1
                available = documents.numbered(relative)
                if match.group(1) not in available:
                    problems.append((relative, number, "§%s: this document has no such "
                                     "section (%s)"
                                     % (match.group(1), summary(available, match.group(1)))))
    return problems, citations, sections_checked


def summary(sections, wanted):
    """The sections near the one wanted: those under its top-level section when that exists,
    else the top-level ones."""
    top = wanted.split(".")[0]
    near = [s for s in sections if s.split(".")[0] == top] if top in sections else []
    shown = near or [s for s in sections if "." not in s]
    if not shown:
        return "numbered sections: none"
    ordered = sorted(shown, key=lambda s: [int(part) for part in s.split(".")])
    return ("under §%s: " % top if near else "top-level sections: ") + ", ".join(ordered)


def self_test():
    """The checker against a small tree of known good and bad citations."""
    tree = {
        "docs/guide.md": "# Guide\n## 1. One\n### 1.2 Two\nSee §1.2 and §7.\n"
                         "```\n## 9. not a heading\n```\n",
        "README.md": "# Readme\nThe guide: docs/guide.md §1, and summary.md is output.\n",
        "common/a.cpp": "// guide.md §1.2 is fine; guide.md section 3 is not.\n"
                        "// docs/guide.md sections 1 and 1.3, missing.md, /abs/guide.md\n"
                        "// a long citation of docs/guide.md\n// §9 on the next line\n"
                        "// hashlib.md5 is no citation; §1 alone names no document\n",
        "tests/b.py": "'''README.md is at the top; ../docs/guide.md §1 is relative.'''\n"
                      "x = 'docs/guide.md §9.1'\n"
                      "# docs/guide.md §1, 3 times; docs/guide.md (§1.2, §4 and §1)\n",
        "tests/corpus_corpus/c.md": "missing.md\n",
    }
    expected = {
        ("docs/guide.md", 4, "§7"),
        ("common/a.cpp", 1, "§3"),
        ("common/a.cpp", 2, "§1.3"),
        ("common/a.cpp", 2, "missing.md"),
        ("common/a.cpp", 2, "/abs/guide.md"),
        ("common/a.cpp", 3, "§9"),
        ("common/a.cpp", 5, "§1 names no document"),
        ("tests/b.py", 2, "§9.1"),
        ("tests/b.py", 3, "§4"),
    }
    problems, citations, _ = run_on_tree(tree, check)
    return judge(problems, expected, citations, 12, "citations")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=default_root(),
                        help="the repository (default: %(default)s)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the checker against a tree of known citations")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems, citations, sections = check(args.root)
    for relative, number, message in problems:
        print("%s:%d: %s" % (relative, number, message))
    if citations == 0:
        print("no citations found under %s: the scan is broken" % args.root)
        return 1
    if problems:
        print("%d broken citation(s); %d citations, %d sections checked"
              % (len(problems), citations, sections))
        return 1
    print("ok: %d citations, %d sections checked" % (citations, sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
