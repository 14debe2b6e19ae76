"""The operator's policy for Live API apps (`live serve --gemini-policy FILE`):
which models they may name, an instruction said before theirs, tools removed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    refused,
    sdk_client,
    serving,
    token,
    turn,
)
from google.genai import errors, types

from connections.emulator import Script
from live.liveapi import get_field, not_found
from live.doors.gemini_policy import GeminiPolicy, PolicyError

pytestmark = pytest.mark.anyio

POLICY = GeminiPolicy.from_table(
    {
        "models": ["gemini-*-live-*"],
        "instruction": "Never give medical advice.",
        "remove_tools": ["delete_*"],
        "builtin_tools": ["code_execution"],
    }
)


def declared(name: str) -> types.FunctionDeclaration:
    return types.FunctionDeclaration(name=name, description=f"{name}.")


async def test_the_policy_shapes_what_an_app_asks_and_the_model_hears_it(ca, cert_files):
    script = Script(speed=20, replies=["Hello."])
    config = CONFIG.model_copy(
        update={
            "system_instruction": "You are a cheerful nurse.",
            "tools": [
                types.Tool(function_declarations=[declared("delete_account"), declared("check_weather")]),
                types.Tool(google_search=types.GoogleSearch()),
                types.Tool(code_execution=types.ToolCodeExecution()),
            ],
        }
    )
    async with serving(script, policy=POLICY, **cert_files) as (emu, _, url):
        client = sdk_client(url, ca, token())
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            await session.send_realtime_input(text="hello")
            await turn(session)
        # A model the policy does not name is the service's "not found".
        code, reason = await refused(url, ca, token(), model="gemini-2.0-flash-exp")
        assert code == 1008 and reason == not_found("models/gemini-2.0-flash-exp", "v1beta")[:123]
    [upstream] = emu.sessions
    instruction = " ".join(p["text"] for p in get_field(upstream.setup, "systemInstruction")["parts"])
    # The operator's policy is said before the app's own words, which still reach the model.
    assert instruction.index("Never give medical advice.") < instruction.index("You are a cheerful nurse.")
    tools = get_field(upstream.setup, "tools")
    names = {d["name"] for tool in tools for d in get_field(tool, "functionDeclarations") or []}
    assert "check_weather" in names and "delete_account" not in names
    assert not any(get_field(tool, "googleSearch") is not None for tool in tools)
    assert any(get_field(tool, "codeExecution") is not None for tool in tools)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("models = 'gemini-*'", "models must be a list"),
        ("instruction = 3", "instruction must be text"),
        ("remove_tool = ['x']", "unknown key 'remove_tool'"),
        ("builtin_tools = ['web_browsing']", "'web_browsing' is not one of"),
        ("models = [", "not TOML"),
    ],
)
def test_a_bad_policy_file_is_one_line_saying_where(tmp_path, text, words):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=words):
        GeminiPolicy.load(path)
    result = subprocess.run(
        [sys.executable, "-m", "live.cli", "serve", "--model", "local/echo", "--gemini-endpoint", "--gemini-policy", str(path)],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2 and str(path) in result.stderr and words.split("'")[0] in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_policys_models_replace_the_servers_own_and_flags_add_to_them(tmp_path):
    from live.registry import default_registry
    from live.cli.serve import build_parser, resolve

    path = tmp_path / "policy.toml"
    path.write_text('models = ["models/gemini-*-live-*"]\n')

    def gemini_door(*argv: str):
        args = build_parser().parse_args(["--model", "local/echo", "--gemini-endpoint", *argv])
        [door] = {d for d in resolve(args, default_registry()).doors.values() if getattr(d, "name", "") == "gemini"}
        return door

    assert gemini_door().policy.models == ("local/echo",)  # no policy: the server's own model
    assert gemini_door("--gemini-policy", str(path)).policy.models == ("gemini-*-live-*",)
    both = gemini_door("--gemini-policy", str(path), "--gemini-model", "x-*")
    assert both.policy.models == ("gemini-*-live-*", "x-*")


async def test_a_removed_tool_stays_removed_whatever_its_case_or_separators(ca, cert_files):
    """Gemini's function names are case-sensitive, but to the model that reads
    them `Delete_Account`, `DELETE-ACCOUNT` and `delete.account` are one tool:
    `remove_tools = ["delete_*"]` removes each."""
    script = Script(speed=20, replies=["Hello."])
    variants = ["Delete_Account", "DELETE-ACCOUNT", "delete.account", "dElEtE:everything"]
    config = CONFIG.model_copy(
        update={"tools": [types.Tool(function_declarations=[*map(declared, variants), declared("check_weather")])]}
    )
    async with serving(script, policy=POLICY, **cert_files) as (emu, _, url):
        async with sdk_client(url, ca, token()).aio.live.connect(model=MODEL, config=config) as session:
            await session.send_realtime_input(text="hello")
            await turn(session)
    [upstream] = emu.sessions
    names = {d["name"] for tool in get_field(upstream.setup, "tools") for d in get_field(tool, "functionDeclarations") or []}
    assert "check_weather" in names
    assert not names & set(variants), names


@pytest.mark.parametrize("name", [" delete_account", "delete_account ", "delete account", "delete_account\u200b", "1delete", ""])
async def test_a_function_name_the_service_would_refuse_is_refused(ca, cert_files, name):
    """The API's rule for a function's name: it starts with a letter or an
    underscore, then a-z, A-Z, 0-9, underscores, dots, colons and dashes, at
    most 128 characters (google-genai's FunctionDeclaration.name). A name
    padded with spaces is not a way around the policy: it is the service's
    1007."""
    config = CONFIG.model_copy(update={"tools": [types.Tool(function_declarations=[declared(name)])]})
    async with serving(Script(speed=20), policy=POLICY, **cert_files) as (emu, _, url):
        client = sdk_client(url, ca, token())
        with pytest.raises(errors.APIError) as caught:
            async with client.aio.live.connect(model=MODEL, config=config) as session:
                await turn(session)
    assert caught.value.code == 1007 and "function name" in (caught.value.details or "").lower()
    assert emu.sessions == []


def test_remove_tools_patterns_are_read_as_names_are():
    policy = GeminiPolicy.from_table({"remove_tools": [" Transfer-Money ", "wipe_[a-c]*"]})
    for name in ("transfer_money", "TRANSFER.MONEY", "transfer:Money", "wipe_all", "WIPE-Cache"):
        assert not policy.keeps_function(name), name
    for name in ("transfer_moneys", "wipe_disk", "check_balance"):
        assert policy.keeps_function(name), name
