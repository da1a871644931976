"""clients/criu.LazyPages against stand-in daemons (shell scripts at the process boundary): a daemon is
listening before the restore starts, and only its exit status 0 says that every page is in."""

import os
import stat

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import CommandError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.clients import criu_cli as criu


def daemon(tmp_path, body):
    """A 'criu' whose lazy-pages subcommand runs ``body`` in the work directory it was given."""
    script = tmp_path / "criu"
    script.write_text('#!/bin/sh\nwhile [ "$1" != "--work-dir" ]; do shift; done\ncd "$2" || exit 9\n%s\n' % body)
    script.chmod(stat.S_IRWXU)
    work = tmp_path / "work"
    work.mkdir()
    return criu.LazyPages(criu.CriuCli(str(script)), str(tmp_path / "images"), str(work))


def test_every_page_in_is_exit_status_zero(tmp_path):
    lazy = daemon(tmp_path, "touch lazy-pages.socket; sleep 0.2; exit 0").start(5)
    assert lazy.done(5) and lazy.status == 0


def test_a_daemon_that_fails_or_is_killed_is_not_done_and_says_why(tmp_path):
    lazy = daemon(tmp_path, "touch lazy-pages.socket\necho '(00.1) Error (criu/uffd.c:1): uffd: copy failed' "
                            "> lazy-pages.log\nexit 3").start(5)
    assert not lazy.done(5)
    assert lazy.failure() == "exited 3: (00.1) Error (criu/uffd.c:1): uffd: copy failed"
    (tmp_path / "k").mkdir()
    killed = daemon(tmp_path / "k", "touch lazy-pages.socket; kill -9 $$").start(5)
    assert not killed.done(5) and killed.failure() == "killed by signal 9"


def test_a_daemon_still_copying_at_the_deadline_is_stopped(tmp_path):
    lazy = daemon(tmp_path, "touch lazy-pages.socket; exec sleep 60").start(5)
    assert not lazy.done(0.2)
    assert lazy.process.poll() is not None and lazy.failure().startswith("killed by signal")


def test_a_daemon_that_never_listens_fails_the_start_and_is_gone(tmp_path):
    with pytest.raises(CommandError, match=r"criu lazy-pages did not start \(exited 4"):
        daemon(tmp_path, "exit 4").start(5)
    os.mkdir(str(tmp_path / "h"))
    hung = daemon(tmp_path / "h", "exec sleep 60")
    with pytest.raises(CommandError, match="did not listen on .* within 0.3 s"):
        hung.start(0.3)
    assert hung.process.poll() is not None, "a daemon that never listened is not left running"


def test_died_waits_a_grace_for_an_exit_about_to_show_and_not_for_a_daemon_still_working(tmp_path):
    # what a wrapper does: its parent learns of the daemon's death a moment after the tasks saw its holes
    dying = daemon(tmp_path, "touch lazy-pages.socket; sleep 0.3; kill -9 $$").start(5)
    assert not dying.died(), "not dead yet: without a grace nothing is waited for"
    assert dying.died(3.0) and dying.failure() == "killed by signal 9"
    (tmp_path / "w").mkdir()
    working = daemon(tmp_path / "w", "touch lazy-pages.socket; exec sleep 60").start(5)
    assert not working.died(0.2), "a daemon still copying has not died"
    working.stop()
    (tmp_path / "d").mkdir()
    finished = daemon(tmp_path / "d", "touch lazy-pages.socket; exit 0").start(5)
    assert finished.done(5) and not finished.died(1.0)
