"""The tasks of a session's tool calls: a server tool running, a client tool's deadline.

`SessionCore` decides which calls run where and what their outcome means; this
module starts the task for each (`RunTool`, `AwaitClientTool`), cancels it
(`CancelTool`), and feeds the outcome back to the core. Every task runs in the
session's task group, in a cancel scope of its own that exists before the task
starts, so a cancellation that arrives first still cancels it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from google.genai import types

from live.agent import Agent, run_tool
from live.engine.session import SessionCore

__all__ = ["ToolHost", "ToolTasks"]


class ToolHost(Protocol):
    """What a session's tool tasks need of their session."""

    agent: Agent
    core: SessionCore
    tg: TaskGroup
    clock: Callable[[], float]

    async def apply(self, actions: list[Any]) -> None: ...

    def facts_changed(self) -> None: ...

    def poke(self) -> None: ...


class ToolTasks:
    """The tool tasks of one session, by call id."""

    def __init__(self, runner: ToolHost) -> None:
        self._runner = runner
        self._scopes: dict[str, anyio.CancelScope] = {}

    def run_server_tool(self, call: types.FunctionCall) -> None:
        self._start(call.id or "", self._run_server_tool, call)

    def await_client_tool(self, call_id: str, timeout: float) -> None:
        self._start(call_id, self._await_client_tool, call_id, timeout)

    def cancel(self, call_id: str) -> None:
        scope = self._scopes.pop(call_id, None)
        if scope is not None:
            scope.cancel()

    def _start(self, call_id: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        scope = anyio.CancelScope()
        self._scopes[call_id] = scope
        self._runner.tg.start_soon(self._in_scope, call_id, scope, fn, *args)

    async def _in_scope(
        self, call_id: str, scope: anyio.CancelScope, fn: Callable[..., Awaitable[None]], *args: Any
    ) -> None:
        with scope:
            await fn(*args)
        if self._scopes.get(call_id) is scope:
            del self._scopes[call_id]

    async def _run_server_tool(self, call: types.FunctionCall) -> None:
        runner = self._runner
        agent = runner.agent
        tool = agent.tools_by_name[call.name or ""]
        response = await run_tool(tool, dict(call.args or {}), agent.tool_timeout)
        await runner.apply(runner.core.tool_finished(call.id or "", response, runner.clock()))
        runner.facts_changed()
        runner.poke()

    async def _await_client_tool(self, call_id: str, timeout: float) -> None:
        await anyio.sleep(timeout)
        runner = self._runner
        await runner.apply(runner.core.client_tool_expired(call_id, runner.clock()))
        runner.poke()
