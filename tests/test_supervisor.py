"""The reconnect and hand-over decisions, without sockets or clocks."""

from __future__ import annotations

from live.errors import ConfigurationError, InvalidArgumentError, RecoverableConnectionError
from live.supervisor import ReconnectPolicy
from live.supervisor import CLOSED, GiveUp, HandOver, Resume, Stall, Supervisor, Wait


def supervisor(**kw) -> Supervisor:
    return Supervisor(handover_margin=1.0, stall_timeout=20.0, policy=ReconnectPolicy(**kw))


def step(s: Supervisor, now: float = 0.0, **state) -> object:
    state.setdefault("outcome", None)
    state.setdefault("go_away_at", None)
    state.setdefault("safe_point", True)
    state.setdefault("awaiting_reply_since", None)
    state.setdefault("has_handle", True)
    return s.next_step(now, **state)


def test_idle_waits_without_a_deadline():
    assert step(supervisor()) == Wait(None)


def test_go_away_hands_over_at_a_safe_point_or_at_the_deadline():
    s = supervisor()
    assert step(s, 0.0, go_away_at=10.0) == HandOver()
    busy = step(s, 0.0, go_away_at=10.0, safe_point=False)
    assert busy == Wait(9.0)  # the deadline less the margin
    assert step(s, 9.0, go_away_at=10.0, safe_point=False) == HandOver()


def test_an_owed_reply_past_the_timeout_is_a_stall():
    s = supervisor()
    assert isinstance(step(s, 5.0, awaiting_reply_since=0.0), Wait)
    assert isinstance(step(s, 20.5, awaiting_reply_since=0.0), Stall)


def test_fatal_ends_give_up_at_once_whatever_the_budget():
    s = supervisor()
    for error in (InvalidArgumentError("bad"), ConfigurationError("key")):
        assert step(s, outcome=error) == GiveUp(error)


def test_a_recoverable_end_resumes_with_backoff_then_gives_up():
    s = supervisor(max_failures=2, base_delay=0.5)
    drop = RecoverableConnectionError("dropped", close_code=1006)
    first = step(s, 0.0, outcome=drop)
    assert isinstance(first, Resume) and first.delay == 0.5
    again = s.reconnect_failed(1.0, drop, has_handle=True)
    assert isinstance(again, Resume) and again.delay == 1.0
    final = s.reconnect_failed(2.0, drop, has_handle=True)
    assert isinstance(final, GiveUp) and "gave up after 2 attempts" in str(final.error)


def test_a_close_announced_by_go_away_resumes_at_once():
    s = supervisor()
    assert step(s, outcome=CLOSED, go_away_at=5.0) == Resume("the model closed the connection", 0.0)
    unannounced = step(supervisor(), outcome=CLOSED)
    assert isinstance(unannounced, Resume) and unannounced.delay > 0


def test_without_a_handle_there_is_nothing_to_resume():
    result = step(supervisor(), outcome=RecoverableConnectionError("dropped"), has_handle=False)
    assert isinstance(result, GiveUp) and "cannot be resumed" in str(result.error)


def test_a_stable_connection_forgives_earlier_failures():
    s = supervisor(max_failures=1, stable_after=60.0)
    drop = RecoverableConnectionError("dropped")
    assert isinstance(step(s, 0.0, outcome=drop), Resume)
    s.connected(1.0)
    assert isinstance(step(s, 100.0, outcome=drop), Resume)  # up 99 s: the count restarted
