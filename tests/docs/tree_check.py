"""What the tree checkers (check_citations.py, check_layers.py) share: the repository root,
and a self-test that runs a checker on a scratch tree of known good and bad files."""

import os
import tempfile


def default_root():
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run_on_tree(tree, check):
    """check(root) on a scratch tree of {relative path: text}; its result."""
    with tempfile.TemporaryDirectory() as root:
        for relative, text in tree.items():
            path = os.path.join(root, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return check(root)


def judge(problems, expected, seen, expected_seen, what):
    """Exit status of a self-test: every expected (file, line, text in message) reported,
    nothing else, and `expected_seen` items (citations, includes) seen."""
    unmatched = [p for p in problems
                 if not any(p[0] == f and p[1] == n and s in p[2] for f, n, s in expected)]
    missed = [e for e in expected
              if not any(p[0] == e[0] and p[1] == e[1] and e[2] in p[2] for p in problems)]
    for problem in unmatched:
        print("self-test: unexpected problem: %s:%d: %s" % problem)
    for item in missed:
        print("self-test: not reported: %s:%d: ...%s..." % item)
    if unmatched or missed or seen != expected_seen:
        print("self-test: FAILED (%d %s seen, %d expected)" % (seen, what, expected_seen))
        return 1
    print("self-test: ok (%d problems found as expected)" % len(problems))
    return 0
