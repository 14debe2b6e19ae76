"""What a session carries from one model connection to the next.

The `Handover` part of `live.engine.session.SessionCore`. Model connections come and
go under one session; a resumed connection continues from the state behind its
handle, and a fresh one (no usable handle) from the session's transcript. What
the new one must still be told is decided here: results of calls an earlier
connection made (as context, never as function responses it would reject), a
typed turn no handle covers, nothing it already knows. And the facts another
server of a fleet needs to carry the conversation on. No I/O.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from google.genai import types

from live.engine.actions import Action, SendEvent, ToUpstream
from live.llm import ClientTurns, RealtimeText
from live.protocol import TurnComplete
from live.engine.session_state import ToolCall, ToolState, TurnState, tool_context_content

if TYPE_CHECKING:
    from live.engine.transcript import Transcript
    from live.families import ModelFamily

__all__ = ["Handover"]


class Handover:
    """Connection changes for `SessionCore` (its state lives on the core)."""

    tools: dict[str, ToolCall]
    epoch: int
    turn: TurnState
    transcript: Transcript
    _appended: list[ClientTurns]
    _replay: list[types.Content | ClientTurns]
    # False: a reply a lost connection cut short is not asked again (its
    # client heard its start: the question and what was said of the reply
    # are told to the new connection as context instead).
    cut_replies_repeated: bool = True
    _reply_said: list[str]
    _reply_texts: list[str]
    _retold: list[ClientTurns]  # appended content on its way to a new connection
    _answering_calls: list[str]  # calls whose results the reply in progress follows
    family: ModelFamily
    _sent_unseen: bool
    _handle_due: bool
    _held_by_next: list[ClientTurns]

    def _quiet(self) -> bool: ...

    def for_connection(self, content: types.Content) -> types.Content:
        """What of `content` the current connection may take, decided as it is sent.

        Function responses to calls an earlier connection issued become a context
        note: this connection never made those calls and would reject the
        responses. Everything else goes as it is.
        """
        parts = content.parts or []
        if not parts or parts[0].function_response is None:
            return content
        own: list[types.Part] = []
        foreign: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        told: list[str] = []
        for part in parts:
            fr = part.function_response
            call = self.tools.get(fr.id or "") if fr is not None else None
            if fr is not None and call is not None and call.epoch != self.epoch:
                foreign.append((call.name, call.args, dict(fr.response or {})))
                told.append(fr.id or "")
            else:
                own.append(part)
        if not foreign:
            return content
        if own:
            # Both in one content cannot happen (calls answered together were
            # issued together); keep the own responses rather than mix kinds.
            return content.model_copy(update={"parts": own})
        note = tool_context_content(foreign)
        self._remember_note(note, told, [])
        return note

    def _remember_note(self, note: types.Content, told: list[str], typed: list[types.Content]) -> None:
        key = id(note)
        notes = self._notes

        def forget(ref: weakref.ref[types.Content]) -> None:
            entry = notes.get(key)
            if entry is not None and entry[0] is ref:
                del notes[key]

        notes[key] = (weakref.ref(note, forget), told, typed)

    def _take_note(self, content: types.Content) -> tuple[list[str], list[types.Content]] | None:
        """The calls and typed turns `content` carries, if it is a note on its way."""
        entry = self._notes.get(id(content))
        if entry is None or entry[0]() is not content:
            return None
        del self._notes[id(content)]
        return entry[1], entry[2]

    def content_sent(self, content: types.Content | ClientTurns | RealtimeText, now: float | None = None) -> None:
        """A content reached the model's connection.

        A typed user turn (or a context note, or realtime text) is then owed a
        reply; function responses are recorded as taken by this connection,
        until a handle covers them; client content that completes no turn is
        kept until a handle holds it.
        """
        if isinstance(content, RealtimeText):
            self._sent_unseen = True
            self._owed.append(types.Content(role="user", parts=[types.Part(text=content.text)]))
            self.transcript.user(content.text)
            return
        if isinstance(content, ClientTurns):
            self._client_turns_sent(content)
            return
        parts = content.parts or []
        if not parts:
            return
        self._sent_unseen = True
        note = self._take_note(content)
        if note is not None:
            # A context note: its calls are now told to this connection, until a
            # handle holds them; typed turns joined to it are owed an answer.
            told, typed = note
            for call_id in told:
                call = self.tools.get(call_id)
                if call is not None:
                    call.sent_epoch = self.epoch
                    call.covered = False
                    self._told(call)
            self._owed.extend(typed)
            return
        if parts[0].function_response is not None:
            for part in parts:
                fr = part.function_response
                call = self.tools.get(fr.id or "") if fr is not None else None
                if call is not None:
                    call.sent_epoch = self.epoch
                    call.covered = False
                    self._told(call)
            self._update_hold()
            return
        if content.role == "user" and parts[0].text is not None:
            self._owed.append(content)
            self.transcript.user("".join(p.text or "" for p in parts))

    def _client_turns_sent(self, content: ClientTurns) -> None:
        """Client content reached the model: its turns join the transcript; a
        completed one is owed a reply (its user's words), one that completes
        nothing (or the initial history) is held until a handle covers it.

        The model acts on nothing content that completes no turn says, so no
        reply or call shows a handle was taken after it arrived. A resumable
        handle comes as a turn ends, with nothing more coming; sent while the
        model is quiet (no turn going, owed, or ended with its handle still to
        come; no call unanswered), the context arrives before the next one is
        taken, and that handle holds it.
        """
        quiet = not content.turn_complete and not content.initial and self._quiet()
        if not quiet:
            self._sent_unseen = True
        texts = []
        retold = next((i for i, c in enumerate(self._retold) if c is content), None)
        if retold is not None:  # told again to a new connection: in the transcript already
            del self._retold[retold]
            self._appended_until_held(content, quiet)
            return
        for turn in content.turns:
            text = "".join(part.text or "" for part in turn.parts or () if not part.thought)
            if turn.role == "model":
                self.transcript.model(text)
            elif text:
                self.transcript.user(text)
                texts.append(text)
        if content.turn_complete and not content.initial:
            if texts:
                self._owed.append(types.Content(role="user", parts=[types.Part(text="\n".join(texts))]))
        elif content.turns:
            self._appended_until_held(content, quiet)

    def _appended_until_held(self, content: ClientTurns, quiet: bool) -> None:
        """Content appended without a reply: told again to a new connection until
        a handle holds it (the next one, when it was sent to a quiet model)."""
        self._appended.append(content)
        if quiet:
            self._held_by_next.append(content)

    def _told(self, call: ToolCall) -> None:
        """A call's result reached the model: into the transcript, once."""
        if not call.told and call.response is not None:
            call.told = True
            self.transcript.result(call.name, call.args, call.response)

    def fresh_start(self, now: float) -> list[types.Content]:
        """The history a fresh connection is seeded with (no handle to resume
        from): the transcript, whose last turn, when it is the user's, is the
        one owed an answer. Everything it holds is then known to the model:
        nothing is told or asked again on top of it."""
        for note in self._replay:
            # Results waiting to be told as context (the calls of a server that
            # died, taken over) join the transcript instead.
            entry = self._take_note(note)
            for call_id in entry[0] if entry is not None else ():
                call = self.tools.get(call_id)
                if call is not None:
                    self._told(call)
        self._replay = []
        self._owed = []
        self._appended = []
        self._held_by_next = []
        self._retold = []
        self._answerable = 0
        self._answering_calls = []
        for call in self.tools.values():
            if call.told:
                call.covered = True
                call.sent_epoch = self.epoch
        if self.transcript.last_role == "user":
            self.awaiting_reply_since = now
        return self.transcript.contents()

    def connection_lost(self) -> list[Action]:
        """The model connection is going away; a new one (resumed) will follow.

        A reply cut short will not go on: the client hears `turn.complete` with
        reason `connection_lost`, and nothing more of that reply. What the next
        connection must be told is gathered: results of calls the old one took
        but no handle covers, and a typed turn it never finished answering
        (as context when the model called tools for it: the results ask).
        """
        actions: list[Action] = []
        if self.turn is not TurnState.LISTENING:
            actions.append(SendEvent(TurnComplete("connection_lost")))
            if not self.cut_replies_repeated and self._answerable:
                # Its client heard the reply begin: the question is not asked
                # again (its words would come twice); the new connection is
                # told what was asked and what was said of the reply.
                asked = self._owed[: self._answerable]
                del self._owed[: self._answerable]
                said = ("".join(self._reply_said) or "".join(self._reply_texts)).strip()
                cut = types.Content(role="model", parts=[types.Part(text=said)]) if said else None
                self._appended.append(ClientTurns((*asked, *((cut,) if cut else ())), False))
                self._results_answered()  # the results it followed are not asked about again either
                if said:
                    self.transcript.model(said)
                self._reply_texts = []
        self._reply_said = []
        self.turn = TurnState.LISTENING
        self.user_speaking = False
        self._hearing_user = False
        self.interaction_busy = False  # the new connection has no interaction going on
        self._sent_unseen = False  # what goes to the new connection is tracked anew
        self._handle_due = False  # no turn of the new connection has ended yet
        self._generated = []  # answered: not to be asked again
        self.epoch += 1
        self._update_hold()  # the new connection owes nothing: it made no call yet
        told = [
            call_id
            for call_id, c in self.tools.items()
            if c.sent_epoch is not None and not c.covered and c.response is not None
        ]
        for call_id in told:
            # To be told again; tracked until a handle holds what the new connection took.
            self.tools[call_id].sent_epoch = None
        # Context that asks for no reply needs client content mid-session; a
        # family without it (3.1) is told in a turn, as what it may not lose.
        context_only = self.family.client_content_mid_session
        answered = [i for i in told if self.tools[i].replied] if context_only else []
        told = [i for i in told if i not in answered]
        replay: list[types.Content] = []
        if told:
            replay.append(
                tool_context_content(
                    [(self.tools[i].name, self.tools[i].args, self.tools[i].response or {}) for i in told]
                )
            )
        typed = self._owed
        acted = self._acted_on(typed, self.epoch - 1) if context_only and told else []
        if acted:
            # The model called tools for these: asked again, it would call
            # them again. They go as what was said, and the calls' results,
            # told with them, ask for the answer.
            typed = [c for c in typed if not any(c is a for a in acted)]
            self._appended.append(ClientTurns(tuple(acted), False))
        if answered:
            # Results the model already answered from: told as context, not
            # asked about (the user would hear that answer twice). The content
            # carries them from now on, until a handle holds it.
            results = [(self.tools[i].name, self.tools[i].args, self.tools[i].response or {}) for i in answered]
            self._appended.append(ClientTurns((tool_context_content(results),), False))
            for call_id in answered:
                self.tools[call_id].covered = True
        self._answering_calls = []
        heard = "".join(self._heard).strip()
        self._heard = []
        if heard:
            # The user spoke and the connection went before the turn ended: the
            # model never answered those words, and a new connection never heard
            # them. They are owed like a typed turn.
            self.transcript.user(heard)
            typed.append(types.Content(role="user", parts=[types.Part(text=heard)]))
        replay.extend(typed)
        self._owed = []
        self._answerable = 0
        # Content appended without a reply, that no handle holds: first, again.
        appended = [ClientTurns(tuple(t for c in self._appended for t in c.turns), False)] if self._appended else []
        self._appended = []
        self._held_by_next = []
        self._retold = list(appended)
        self._replay = list(appended)
        # Notes still waiting in the upstream queue keep their entries: they go to
        # the next connection, and their calls are tracked once they are sent.
        if replay:
            joined = _joined_turn(replay)
            self._remember_note(joined, told, typed)
            self._replay.append(joined)
        return actions

    def _results_answered(self) -> None:
        """The reply in progress is whole: the results it followed are answered."""
        for call_id in self._answering_calls:
            call = self.tools.get(call_id)
            if call is not None:
                call.replied = True
        self._answering_calls = []

    def _acted_on(self, owed: list[types.Content], epoch: int) -> list[types.Content]:
        """The turns of `owed` the connection of `epoch` made calls for, that
        ran or still run (a cancelled call answers nothing)."""
        calls = [
            c for c in self.tools.values()
            if c.epoch == epoch and c.asked and c.state is not ToolState.CANCELLED
        ]
        return [t for t in owed if any(t is a for c in calls for a in c.asked)]

    def connection_resumed(self, now: float) -> list[Action]:
        """A resumed connection took over: send what it must be told first.

        Pending tool calls stay pending (their results reach the new
        connection as context), and a reply still owed is timed from now.
        """
        if self.awaiting_reply_since is not None:
            self.awaiting_reply_since = now
        replay, self._replay = self._replay, []
        if any(not isinstance(item, ClientTurns) or item.turn_complete for item in replay):
            self.awaiting_reply_since = now  # it asks for a reply (context alone does not)
        return [ToUpstream(item) for item in replay]

    # -------------------------------------------------------------- durable facts

    def snapshot(self) -> dict[str, Any]:
        """What another server needs to carry this conversation on (JSON-able).

        The newest resumption handle; the calls the model may not know the
        outcome of (pending, or answered with no handle since); the typed turn
        it owes an answer to.
        """
        tools = []
        for call_id, call in self.tools.items():
            if call.state is ToolState.PENDING or (call.response is not None and not call.covered):
                tools.append(
                    {
                        "id": call_id,
                        "name": call.name,
                        "runs_on": call.runs_on,
                        "args": call.args,
                        "state": call.state.value,
                        "response": call.response,
                    }
                )
        owed = "\n".join(p.text or "" for c in self._owed for p in c.parts or []) or None
        return {
            "handle": self.resumption_handle,
            "tools": tools,
            "owed": owed,
            "transcript": self.transcript.snapshot(),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Take over a conversation another server carried (see `snapshot`).

        Its connections are gone: every call it listed is told to the next
        connection as context, with its result, or, for a call still running
        when that server stopped, as lost (its outcome is unknown). Call
        `connection_lost()` next, then open a connection resumed from
        `resumption_handle`.
        """
        self.resumption_handle = snapshot.get("handle")
        for item in snapshot.get("tools") or []:
            response = item.get("response")
            state = ToolState(item.get("state", "pending"))
            if state is ToolState.PENDING:
                state = ToolState.TIMED_OUT
                response = {
                    "error": "the server running this call stopped before it finished; "
                    "its outcome is unknown"
                }
            self.tools[str(item["id"])] = ToolCall(
                name=str(item.get("name", "")),
                runs_on=str(item.get("runs_on", "server")),
                args=dict(item.get("args") or {}),
                epoch=-1,
                state=state,
                response=response,
                sent_epoch=-1,
            )
        owed = snapshot.get("owed")
        if owed:
            self._owed = [types.Content(role="user", parts=[types.Part(text=str(owed))])]
        self.transcript.restore(snapshot.get("transcript") or [])


def _joined_turn(contents: list[types.Content]) -> types.Content:
    """Several user texts as one turn, a paragraph each, so the model answers them once."""
    texts = ["".join(part.text or "" for part in content.parts or []) for content in contents]
    return types.Content(role="user", parts=[types.Part(text="\n\n".join(t for t in texts if t))])
