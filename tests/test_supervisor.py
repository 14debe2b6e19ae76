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


# ---------------------------------------------------------------- a pool of backends

from live.backends import Backend, Target  # noqa: E402
from live.engine.breaker import Breaker  # noqa: E402
from live.engine.failover import Failover, backend_key, model_key  # noqa: E402
from live.engine.supervisor import Move  # noqa: E402
from live.errors import ModelUnavailableError, QuotaExhaustedError, UnreachableError  # noqa: E402

MODEL = "gemini-live-2.5-flash-preview"
A, B, C = (Target(Backend(name, models=(MODEL,)), MODEL) for name in "abc")
QUOTA = QuotaExhaustedError("RESOURCE_EXHAUSTED", close_code=1011)
DOWN = RecoverableConnectionError("The service is currently unavailable.", close_code=1011)


def pooled(*targets: Target, **kw) -> Supervisor:
    return Supervisor(policy=ReconnectPolicy(**kw), failover=Failover(targets or (A, B, C)), retries_here=2)


def test_without_a_pool_quota_and_a_missing_model_end_the_session_as_before():
    alone = pooled(A)
    assert step(alone, outcome=QUOTA) == GiveUp(QUOTA)
    missing = ModelUnavailableError("models/x is not found", close_code=1008)
    assert alone.reconnect_failed(0.0, missing, has_handle=False) == GiveUp(missing)


def test_quota_mid_session_moves_at_once_to_the_next_backend_seeded_fresh():
    s = pooled()
    moved = step(s, outcome=QUOTA)
    assert isinstance(moved, Move) and moved.target == B and moved.cause == "quota" and moved.delay == 0.0


def test_a_drop_with_a_handle_is_tried_again_here_and_a_refused_handle_is_reseeded_here():
    s = pooled()
    again = step(s, outcome=DOWN, has_handle=True)
    assert isinstance(again, Resume) and not again.fresh
    stale = ConfigurationError("BidiGenerateContent session not found", close_code=1008)
    reseed = s.reconnect_failed(1.0, stale, has_handle=True)
    assert isinstance(reseed, Resume) and reseed.fresh and s.failover.current == A


def test_repeated_1011_on_resume_moves_after_the_retries_here():
    s = pooled()
    assert isinstance(step(s, outcome=DOWN), Resume)
    assert isinstance(s.reconnect_failed(1.0, DOWN, has_handle=True), Resume)  # once: try again here
    moved = s.reconnect_failed(2.0, DOWN, has_handle=True)  # twice: move
    assert isinstance(moved, Move) and moved.target == B and moved.cause == "unavailable"


def test_a_refused_connect_a_missing_model_and_a_429_move_at_once():
    for error, cause in (
        (UnreachableError("could not reach the Live endpoint: ConnectionRefusedError"), "unreachable"),
        (ModelUnavailableError("models/x is not found for API version v1beta", close_code=1008), "model_missing"),
        (QuotaExhaustedError("HTTP 429 during the handshake", close_code=429), "quota"),
        (ConfigurationError("the API key was rejected", close_code=1008), "refused"),
    ):
        moved = pooled().reconnect_failed(0.0, error, has_handle=False)
        assert isinstance(moved, Move) and moved.cause == cause and moved.target == B, error


def test_a_backend_whose_breaker_is_open_is_not_retried_nor_chosen():
    s = pooled()
    now = 100.0
    s.failover.update_health({backend_key(A): Breaker(3, open_until=now + 30)}, now)
    moved = step(s, outcome=DOWN, has_handle=True)  # a good handle, but the fleet knows A is down
    assert isinstance(moved, Move) and moved.cause == "breaker_open" and moved.target == B
    fresh = Failover((A, B, C))
    fresh.update_health({backend_key(A): Breaker(3, open_until=now + 30), model_key(B): Breaker(1, open_until=now + 600)}, now)
    assert fresh.first() == C  # A is down, B does not serve the model: new sessions start on C
    fresh.update_health({}, now + 31)  # A's cooldown is over: half-open, one probe
    assert fresh.first() == C  # still a closed one first


def test_every_backend_tried_without_an_answer_gives_up_and_an_answer_forgets_the_tries():
    s = pooled()
    assert step(s, outcome=QUOTA).target == B
    assert s.reconnect_failed(0.1, QUOTA, has_handle=False).target == C
    assert s.reconnect_failed(0.2, QUOTA, has_handle=False) == GiveUp(QUOTA)
    s = pooled()
    assert step(s, outcome=QUOTA).target == B
    s.useful()  # B answered
    back = s.reconnect_failed(5.0, QUOTA, has_handle=False)  # B's quota goes too: A may have recovered
    assert isinstance(back, Move) and back.target in (A, C)


def test_when_every_backend_failed_for_a_passing_cause_the_session_goes_round_again_until_its_budget_ends():
    """A backend refusing connects now (an outage) while the others failed for a
    moment earlier: the session goes back to the healthiest other one, after a
    backoff, instead of spending every attempt on the one refusing now."""
    refused = UnreachableError("could not reach the Live endpoint: ConnectionRefusedError")
    s = pooled(max_failures=3)
    assert s.reconnect_failed(0.0, refused, has_handle=False).target == B
    assert s.reconnect_failed(0.1, refused, has_handle=False).target == C
    rounds = []
    now = 0.2
    while isinstance(next_step := s.reconnect_failed(now, refused, has_handle=False), Move):
        rounds.append((next_step.target, next_step.delay))
        now += 1.0
    # Back to A, then B, then C, each after a longer wait: never twice in a row where it just failed.
    assert [t for t, _ in rounds] == [A, B, C]
    assert [d for _, d in rounds] == [0.25, 0.5, 1.0]
    assert isinstance(next_step, GiveUp)  # the budget of reconnects is spent: the session ends
    # An answer on the way forgets the tries and the budget.
    s = pooled(max_failures=3)
    for now in (0.0, 0.1, 0.2):
        s.reconnect_failed(now, refused, has_handle=False)
    s.useful()
    assert s.reconnect_failed(5.0, refused, has_handle=False).delay == 0.0


def test_the_first_connection_moves_down_the_pool_and_a_refused_context_does_not():
    s = pooled()
    moved = s.start_failed(0.0, QUOTA)
    assert isinstance(moved, Move) and moved.target == B
    bad = InvalidArgumentError("Request contains an invalid argument.", close_code=1007)
    assert pooled().start_failed(0.0, bad) == GiveUp(bad)
    assert pooled(A).start_failed(0.0, QUOTA) == GiveUp(QUOTA)


def test_a_move_starts_the_budget_of_reconnects_again():
    s = pooled(max_failures=1)
    assert isinstance(step(s, 0.0, outcome=DOWN), Resume)
    moved = step(s, 1.0, outcome=DOWN)  # the budget here is spent: elsewhere
    assert isinstance(moved, Move) and moved.cause == "unavailable"
    assert isinstance(step(s, 2.0, outcome=DOWN), Resume)  # on B: its own budget
