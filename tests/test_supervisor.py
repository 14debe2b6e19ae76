"""The reconnect and hand-over decisions, without sockets or clocks."""

from __future__ import annotations

from live.errors import ConfigurationError, InvalidArgumentError, RecoverableConnectionError
from live.engine.supervisor import ReconnectPolicy
from live.engine.supervisor import CLOSED, GiveUp, HandOver, Resume, Stall, Supervisor, Wait


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


def test_without_a_handle_the_session_goes_on_fresh_from_its_transcript():
    """A drop before the first handle (the service sends none after setup and
    withholds them while it works) is a hiccup, not the end of the call."""
    result = step(supervisor(), outcome=RecoverableConnectionError("dropped"), has_handle=False)
    assert isinstance(result, Resume) and result.fresh and result.delay > 0


def test_a_resume_refused_for_an_unknown_handle_starts_fresh_and_only_a_fresh_refusal_ends_it():
    s = supervisor()
    stale = ConfigurationError("BidiGenerateContent session not found", close_code=1008)
    again = s.reconnect_failed(1.0, stale, has_handle=True)
    assert isinstance(again, Resume) and again.fresh
    assert s.reconnect_failed(2.0, stale, has_handle=False) == GiveUp(stale)
    expired = InvalidArgumentError("Invalid session resumption handle.", close_code=1007)
    assert isinstance(s.reconnect_failed(3.0, expired, has_handle=True), Resume)


def test_a_go_away_without_a_handle_still_hands_over_fresh_and_its_deadline_close_is_no_failure():
    s = supervisor(max_failures=1)
    assert step(s, 0.0, go_away_at=10.0, has_handle=False) == HandOver()
    deadline = RecoverableConnectionError("Deadline expired before operation could complete.", close_code=1011)
    for _ in range(3):  # announced ends never count against the budget
        assert step(s, outcome=deadline, go_away_at=5.0) == Resume(str(deadline), 0.0)


def test_a_useful_connection_resets_the_budget_however_soon_it_drops():
    """Six resumes within a minute, each answering a turn, do not end a session."""
    s = supervisor(max_failures=2)
    drop = RecoverableConnectionError("dropped", close_code=1011)
    for second in range(6):
        assert isinstance(step(s, float(second), outcome=drop), Resume)
        s.connected(float(second))
        s.useful()
    assert isinstance(step(s, 7.0, outcome=drop), Resume)
    s.connected(7.0)
    assert isinstance(step(s, 8.0, outcome=drop), Resume)
    assert isinstance(step(s, 9.0, outcome=drop), GiveUp)  # two in a row, no answer between


def test_a_stable_connection_forgives_earlier_failures():
    s = supervisor(max_failures=1, stable_after=60.0)
    drop = RecoverableConnectionError("dropped")
    assert isinstance(step(s, 0.0, outcome=drop), Resume)
    s.connected(1.0)
    assert isinstance(step(s, 100.0, outcome=drop), Resume)  # up 99 s: the count restarted
