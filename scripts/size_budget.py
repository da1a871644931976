"""Growth of the collection's code as a decision, as checkpointctl's test/check-lib-size.sh makes it for its library.

Counted: every Python file under plugins/ (the generated plugins/module_utils/core/base/schemas.py aside: schemas/ is
its source) and the C plugin (roles/snapshot_prereqs/files/npu-plugin/*.c, *.h). Two rules:

1. no counted file has more than FILE_CAP lines (split it by job);
2. no commit since the base grows the counted files by more than COMMIT_BUDGET lines (added minus removed) unless its
   message ends with a trailer ``Size-Budget: <why the growth is worth it>``.

The base is the later of the last release (the last commit that changed galaxy.yml's ``version:``) and the commit that
added this script: commits before it were written without the rule. In a shallow clone, commits whose parent is not
there cannot be measured and are listed as such. Exits 1 naming what breaks a rule; run by `make test`
(tests/unit/project/test_size_budget.py) and by hand: ``python3 scripts/size_budget.py``.
"""

import argparse
import fnmatch
import os
import subprocess
import sys

FILE_CAP = 500
COMMIT_BUDGET = 150
TRAILER = "Size-Budget"
COUNTED = ("plugins/*.py", "roles/snapshot_prereqs/files/npu-plugin/*.c", "roles/snapshot_prereqs/files/npu-plugin/*.h")
GENERATED = ("plugins/module_utils/core/base/schemas.py",)  # scripts/gen_schemas.py
SELF = "scripts/size_budget.py"


def counted(path):
    return any(fnmatch.fnmatch(path, pattern) for pattern in COUNTED) and path not in GENERATED


def git(repo, *args):
    return subprocess.run(["git", "-C", repo] + list(args), capture_output=True, text=True, check=True).stdout


def files_over_cap(repo):
    """{path: lines} of the counted files of the work tree over FILE_CAP."""
    over = {}
    for path in git(repo, "ls-files").splitlines():
        full = os.path.join(repo, path)
        if counted(path) and os.path.isfile(full):
            with open(full, "rb") as handle:
                lines = handle.read().count(b"\n")
            if lines > FILE_CAP:
                over[path] = lines
    return over


def base(repo):
    """The commit growth is measured from (exclusive), or None when this script is not committed yet."""
    added = git(repo, "log", "--diff-filter=A", "--format=%H", "--", SELF).split()
    if not added:
        return None
    start = added[-1] + "^" if git(repo, "rev-list", "--parents", "-n", "1", added[-1]).split()[1:] else added[-1]
    release = git(repo, "log", "-1", "--format=%H", "-G", r"^version:", "--", "galaxy.yml").strip()
    if release and subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", start, release],
                                  capture_output=True, check=False).returncode == 0:
        return release
    return start


def growth(repo, sha):
    """Lines the commit adds to the counted files, less those it removes."""
    total = 0
    for line in git(repo, "show", "--numstat", "--format=", "--no-renames", sha).splitlines():
        added, removed, path = line.split("\t", 2)
        if counted(path) and added != "-":
            total += int(added) - int(removed)
    return total


def reason(repo, sha):
    return git(repo, "log", "-1", "--format=%(trailers:key=" + TRAILER + ",valueonly,separator=%x20)", sha).strip()


def commits_over_budget(repo, since):
    """([(sha, subject, growth)] over COMMIT_BUDGET without a reason, [shas not measured: their parent is missing])."""
    over, unmeasured = [], []
    revs = git(repo, "rev-list", "--no-merges", "--parents", "HEAD" if since is None else "%s..HEAD" % since)
    for line in revs.splitlines():
        sha, parents = line.split()[0], line.split()[1:]
        if not parents:
            unmeasured.append(sha)
            continue
        grown = growth(repo, sha)
        if grown > COMMIT_BUDGET and len(reason(repo, sha)) < 10:
            over.append((sha, git(repo, "log", "-1", "--format=%s", sha).strip(), grown))
    return over, unmeasured


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args(argv)
    failed = False
    for path, lines in sorted(files_over_cap(args.repo).items()):
        print("%s: %d lines, over the cap of %d: split it by job" % (path, lines, FILE_CAP))
        failed = True
    since = base(args.repo)
    if since is None:
        print("%s is not committed yet: no commit is measured" % SELF)
        return 1 if failed else 0
    over, unmeasured = commits_over_budget(args.repo, since)
    for sha, subject, grown in over:
        print("%s %s: +%d lines of code, over the budget of %d per commit, and its message has no '%s: <why>' trailer"
              % (sha[:12], subject[:72], grown, COMMIT_BUDGET, TRAILER))
        failed = True
    if unmeasured:
        print("not measured (a shallow clone: their parent is not here): %s" % " ".join(sha[:12] for sha in unmeasured))
    print("size budget: %s since %s" % ("broken" if failed else "kept", since[:12]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
