"""The project's locks (pipeline/locks.py, issue 50): one holder of a stage's lock at a time,
the second refused naming the first; a lock that ends with its holder, killed or not; and one
creator of a new SQLite store at a time, where two at once broke one of them."""

import multiprocessing
import os
import re
import signal

import pytest

from pipeline.errors import UserError
from pipeline.locks import holding, lock_path, refusal
from pipeline.tracking.store import store_creation

FORK = multiprocessing.get_context("fork")


def hold_until_killed(locks, taken) -> None:
    with holding("train-ddp", "train[ddp]", locks):
        taken.set()
        signal.pause()


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with holding("train-ddp", "train[ddp]", tmp_path):
        with pytest.raises(UserError) as refused:
            with holding("train-ddp", "train[ddp]", tmp_path):
                pass
        with holding("train-single", "train[single]", tmp_path):  # another strategy's: free
            pass
    assert re.fullmatch(
        rf"train\[ddp\] is already running in this project \(pid {os.getpid()}, since "
        r"\d\d:\d\d:\d\d: python .+\); wait for it to end, or stop it "
        rf"\(kill {os.getpid()}\), then run this again",
        str(refused.value),
    )
    with holding("train-ddp", "train[ddp]", tmp_path):  # released with its holder
        pass


def test_a_killed_holder_leaves_nothing_behind(tmp_path):
    taken = FORK.Event()
    holder = FORK.Process(target=hold_until_killed, args=(tmp_path, taken))
    holder.start()
    assert taken.wait(60)
    with pytest.raises(UserError, match=f"pid {holder.pid}"):
        with holding("train-ddp", "train[ddp]", tmp_path):
            pass
    os.kill(holder.pid, signal.SIGKILL)  # no cleanup at all
    holder.join()
    with holding("train-ddp", "train[ddp]", tmp_path):
        pass
    assert lock_path("train-ddp", tmp_path).exists()  # the file stays: only the lock went


def test_a_holder_not_yet_named():
    assert refusal("train[ddp]", "") == (
        "train[ddp] is already running in this project; wait for it to end, then run this again"
    )


def create_store(uri: str, locked: bool, results) -> None:
    from mlflow.tracking import MlflowClient

    try:
        with store_creation(uri) if locked else open(os.devnull):
            client = MlflowClient(tracking_uri=uri)
            client.get_experiment_by_name("tests") or client.create_experiment("tests")
        results.put("made")
    except Exception as err:  # noqa: BLE001 - what the test reads
        results.put(f"failed: {err}")


def test_two_creators_of_a_new_store_one_after_the_other(tmp_path):
    """Unlocked, two processes making one new SQLite store broke one of them in 3 of 3 tries
    here ("duplicate column name": both ran the migrations); locked, both make it."""
    results = FORK.Queue()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    creators = [FORK.Process(target=create_store, args=(uri, True, results)) for _ in range(2)]
    for creator in creators:
        creator.start()
    for creator in creators:
        creator.join(120)
    assert [results.get(timeout=10) for _ in creators] == ["made", "made"]
    assert (tmp_path / "mlflow.db.lock").exists()


def test_other_stores_guard_themselves(tmp_path):
    with store_creation("http://127.0.0.1:5000"):
        pass
    assert list(tmp_path.iterdir()) == []
