"""Turns at SQLite's one write lock between the threads of one process (``db.WriteTurns``).

The stream loop writes batch after batch; a thread that asks for a turn (the Slack sender's
lease before it posts) must get it before the loop's next batch, not whenever SQLite's busy
handler happens to wake it. Ordered with events, no timing.
"""

from __future__ import annotations

import threading

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from detector import db


def test_a_waiting_thread_writes_before_the_loops_next_batch() -> None:
    turns = db.WriteTurns()
    order: list[str] = []
    loop_holds, sender_waits = threading.Event(), threading.Event()
    release_loop = threading.Event()

    def loop_batch(name: str, hold: threading.Event | None = None) -> None:
        with turns.turn(after_others=True):
            order.append(name)
            if hold is not None:
                loop_holds.set()
                release_loop.wait()

    def sender() -> None:
        sender_waits.set()
        with turns.turn():
            order.append("sender")

    first = threading.Thread(target=loop_batch, args=("batch 1", loop_holds))
    first.start()
    loop_holds.wait()
    waiting = threading.Thread(target=sender)
    waiting.start()
    sender_waits.wait()
    while not turns._waiting:  # the sender is inside turn(), counted as waiting
        threading.Event().wait(0.001)
    second = threading.Thread(target=loop_batch, args=("batch 2",))
    second.start()
    release_loop.set()
    for t in (first, waiting, second):
        t.join()
    assert order == ["batch 1", "sender", "batch 2"]


def test_the_turn_is_released_when_the_block_raises() -> None:
    turns = db.WriteTurns()
    try:
        with turns.turn():
            raise ValueError("the batch failed")
    except ValueError:
        pass
    done = threading.Event()

    def again() -> None:
        with turns.turn(after_others=True):
            done.set()

    t = threading.Thread(target=again)
    t.start()
    t.join(10)
    assert done.is_set()


def test_one_turn_per_sqlite_database_and_none_for_postgresql(tmp_path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with Session(engine) as one, Session(engine) as two, db.write_turn(one):
        holder = db._TURNS[engine]
        assert holder._held
        assert db._TURNS[two.get_bind()] is holder  # type: ignore[index]
    assert not holder._held
    server = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    with Session(server) as session, db.write_turn(session):
        assert server not in db._TURNS
    engine.dispose()
