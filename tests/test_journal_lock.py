"""Ctrl-C while the tuner holds Optuna's journal lock: the lock is released and the interrupt is what surfaces."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relay_tune import cli
from relay_tune.errors import raised_by_interrupt
from relay_tune.tuning.journal_lock import InterruptSafeSymlinkLock, sigint_deferred
from relay_tune.tuning.search import open_storage


def interrupting(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, preceded by a SIGINT to this process: Python raises it before `function` runs, as a Ctrl-C
    landing just before Optuna renames or creates the lock link does."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        return function(*args, **kwargs)

    return wrapper


def test_ctrl_c_in_the_release_still_releases_and_raises_keyboard_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = str(tmp_path / "study.journal")
    lock = InterruptSafeSymlinkLock(journal)
    assert lock.acquire()
    assert os.path.lexists(journal + ".lock")
    monkeypatch.setattr(os, "rename", interrupting(os.rename))
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    monkeypatch.undo()
    assert not os.path.lexists(journal + ".lock")  # released: a resumed run does not wait for it
    assert lock.acquire()  # and it can be taken again at once
    lock.release()


def test_ctrl_c_in_the_acquire_gives_the_lock_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = str(tmp_path / "study.journal")
    lock = InterruptSafeSymlinkLock(journal)
    monkeypatch.setattr(os, "symlink", interrupting(os.symlink))
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    monkeypatch.undo()
    assert not os.path.lexists(journal + ".lock")


def test_outside_the_lock_ctrl_c_acts_at_once() -> None:
    with sigint_deferred() as deferred:
        pass
    assert not deferred.hit
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs at the latest here


def test_journal_storages_use_the_safe_lock(tmp_path: Path) -> None:
    storage = open_storage(tmp_path / "study.journal")
    assert isinstance(storage._backend._lock, InterruptSafeSymlinkLock)


def test_an_error_raised_while_handling_ctrl_c_counts_as_the_interrupt(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def clean_up_that_fails(args: Any) -> int:
        try:
            raise KeyboardInterrupt
        except BaseException:
            os.unlink(tmp_path / "missing.rename")  # FileNotFoundError, its context the KeyboardInterrupt
        return 0

    with pytest.raises(FileNotFoundError) as caught:
        clean_up_that_fails(None)
    assert raised_by_interrupt(caught.value)
    assert not raised_by_interrupt(FileNotFoundError("plain"))
    monkeypatch.setitem(cli._COMMANDS, "check", clean_up_that_fails)
    assert cli.main(["check", "model.relay"]) == cli.EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
