"""A server's pool of backends at run time: a model for each target, their
health, and what they do, measured.

`live.backends` is the pool as configuration; `live.engine.failover` decides
where a session goes; `live.fleet.health` keeps the breakers, shared by the
fleet. `Backends` puts them together for the sessions of one server: the model
instance that opens connections on each target (measured, and recorded when
asked), a session's request fitted to its target (its model name; after a
move to another family, the settings that family takes), the breakers read
before a decision and written after each connect and failure, and the metrics
per backend. Without a pool, the server's one model is the pool of one,
named `default`: no health is kept, nothing moves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from live.backends import Backend, BackendPool, FailoverPolicy, Target
from live.engine.breaker import CLOSED, OPEN, BreakerPolicy
from live.engine.failover import AT_ONCE, CAUSES, Failover, backend_key, model_key
from live.errors import LiveError
from live.families import family_of, fit_config
from live.fleet.health import BackendHealth
from live.fleet.store import SessionStore
from live.llm import BaseLlm, LlmRequest
from live.observe.metrics import Metrics

__all__ = ["DEFAULT_BACKEND", "FAILURE_CAUSES", "Backends"]

log = logging.getLogger("live.server")

DEFAULT_BACKEND = "default"
"""The name of the one backend of a server without a pool."""

FAILURE_CAUSES = ("quota", "model_missing", "unreachable", "refused", "unavailable", "dropped")
"""Why a model connection failed on a backend, as metric labels."""

_STATE_VALUE = {CLOSED: 0, "half_open": 1, OPEN: 2}


class Backends:
    """The targets of a server's sessions and what they share."""

    def __init__(
        self,
        targets: Sequence[Target],
        llm_at: Callable[[Target], BaseLlm],
        *,
        metrics: Metrics,
        policy: FailoverPolicy | None = None,
        agent_model: str,
    ) -> None:
        self.targets = tuple(targets)
        self.policy = policy or FailoverPolicy()
        self.metrics = metrics
        self.agent_model = agent_model
        self._agent_family = family_of(agent_model)
        self._llms = {target: llm_at(target) for target in self.targets}
        self.health = BackendHealth(
            BreakerPolicy(failures=self.policy.breaker_failures, cooldown=self.policy.breaker_cooldown)
        )
        self.health.on_change = self._breaker_seen
        self._fitted: set[tuple[Target, str]] = set()
        for name in dict.fromkeys(t.name for t in self.targets):
            # Every series of every backend is served from the start (at 0).
            metrics.backend_sessions.labels(name)
            metrics.backend_breaker.labels(name).set(0)
            for cause in FAILURE_CAUSES:
                metrics.backend_failures.labels(name, cause)
            for cause in CAUSES:
                metrics.backend_moves.labels(name, cause)

    @classmethod
    def single(cls, model: str, llm: BaseLlm, *, metrics: Metrics) -> Backends:
        """A server's one model as the pool of one."""
        target = Target(Backend(DEFAULT_BACKEND, models=(model,)), model)
        return cls([target], lambda _: llm, metrics=metrics, agent_model=model)

    @classmethod
    def of_pool(
        cls, pool: BackendPool, llm_at: Callable[[Target], BaseLlm], *, metrics: Metrics, agent_model: str
    ) -> Backends:
        return cls(pool.targets(agent_model), llm_at, metrics=metrics, policy=pool.failover, agent_model=agent_model)

    @property
    def single_target(self) -> bool:
        return len(self.targets) == 1

    def share(self, store: SessionStore) -> None:
        """Keep the breakers in the fleet's store (with `--redis`)."""
        self.health.share(store)

    def llm(self, target: Target) -> BaseLlm:
        return self._llms[target]

    def failover(self) -> Failover:
        """One session's place in the pool."""
        return Failover(self.targets)

    # ------------------------------------------------------------------ requests

    def fit(self, request: LlmRequest, target: Target) -> LlmRequest:
        """`request` for `target`: its model, and, on a model of another family
        than the agent's, the settings that family takes (`fit_config`)."""
        request.model = target.model
        family = family_of(target.model)
        if family.name != self._agent_family.name or target.backend.voice is not None:
            config, changed = fit_config(request.live_connect_config, family, voice=target.backend.voice)
            request.live_connect_config = config
            if changed and (target, family.name) not in self._fitted:
                self._fitted.add((target, family.name))
                log.info("on %s (%s) the session's settings are fitted: %s", target, family.name, ", ".join(changed))
        return request

    # ------------------------------------------------------------------ health

    async def refresh(self, failover: Failover) -> None:
        """The breakers as the fleet knows them, pushed into `failover`."""
        if self.single_target:
            return
        keys = [key for t in self.targets for key in (backend_key(t), model_key(t))]
        failover.update_health(await self.health.read(dict.fromkeys(keys)), self.health.now)

    async def claim(self, target: Target) -> None:
        """A session is about to connect to `target`: if its breaker is
        half-open, this connect is its probe (others wait for its outcome)."""
        if self.single_target:
            return
        await self.health.probing(backend_key(target))

    async def connected(self, target: Target) -> None:
        """A connection opened on `target`: its breakers close."""
        if self.single_target:
            return
        await self.health.succeeded(backend_key(target))
        model = self.health.view.get(model_key(target))
        if model is not None and model.failures:
            await self.health.succeeded(model_key(target))

    async def failed(self, target: Target, cause: str, error: LiveError | None = None) -> None:
        """A connection on `target` failed (`cause`: one of `FAILURE_CAUSES`)."""
        self.metrics.backend_failures.labels(target.name, cause).inc()
        if self.single_target:
            return
        if cause == "model_missing":
            await self.health.failed(model_key(target), at_once=True, cooldown=self.policy.model_missing_cooldown)
            log.warning("%s does not serve %s: not tried there for %g s", target.name, target.model, self.policy.model_missing_cooldown)
            return
        before = self.health.view.get(backend_key(target))
        after = await self.health.failed(backend_key(target), at_once=cause in AT_ONCE)
        if after.state(self.health.now) != CLOSED and (before is None or before.state(self.health.now) == CLOSED):
            log.warning("backend %s: its breaker is open (%s%s); new sessions start elsewhere", target.name, cause,
                        f": {error.message}" if error is not None else "")

    def moved(self, source: Target, cause: str) -> None:
        self.metrics.backend_moves.labels(source.name, cause).inc()

    def on(self, target: Target) -> None:
        """A session's model connection is on `target` now."""
        self.metrics.backend_sessions.labels(target.name).inc()

    def off(self, target: Target) -> None:
        self.metrics.backend_sessions.labels(target.name).dec()

    def _breaker_seen(self, key: str, breaker: object, now: float) -> None:
        if key.startswith("backend:"):
            state = breaker.state(now)  # type: ignore[attr-defined]
            self.metrics.backend_breaker.labels(key.removeprefix("backend:")).set(_STATE_VALUE[state])
