"""A pool of backends as configuration: a TOML file or an agent's, keys from
the environment only, the families rule, and what `live serve` says about a
pool it cannot use (one line, at start)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.genai import types

from live.agent import Agent
from live.backends import Backend, BackendPool, FailoverPolicy, PoolError
from live.errors import LiveError
from live.families import family_of, fit_config
from live.registry import default_registry

ROOT = Path(__file__).resolve().parent.parent

POOL = """
[failover]
retries_here = 3

[[backend]]
name = "studio-1"
api_key_env = "TEST_KEY_ONE"

[[backend]]
name = "vertex-eu"
project = "my-project"
location = "europe-west4"
models = ["gemini-live-2.5-flash-native-audio"]
"""


def test_a_pool_file_reads_in_order_with_each_backends_models():
    pool = BackendPool.parse(POOL)
    assert [b.name for b in pool.backends] == ["studio-1", "vertex-eu"]
    assert pool.failover == FailoverPolicy(retries_here=3)
    targets = pool.targets("gemini-2.5-flash-native-audio-preview-12-2025")
    assert [(t.name, t.model) for t in targets] == [
        ("studio-1", "gemini-2.5-flash-native-audio-preview-12-2025"),  # the agent's model
        ("vertex-eu", "gemini-live-2.5-flash-native-audio"),
    ]
    assert targets[1].backend.kind == "vertex"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[backend]]\nname = "a"\napi_key = "AIzaSyNOTAKEY"', "a secret never goes in this file"),
        ('[[backend]]\nname = "a"\nkey = "AIza"', "api_key_env"),
        ('[[backend]]\nname = "a"\nregion = "eu"', "backend 1 has no region"),
        ('[[backend]]\nname = "a"\n[[backend]]\nname = "a"', "unique: a"),
        ('[[backend]]\nname = "a b"', "letters, digits"),
        ('[[backend]]\nname = "a"\nproject = "p"', "both project and location"),
        ("[failover]\nretries_here = 0\n[[backend]]\nname = 'a'", "retries_here"),
        ("[failover]\nbreaker = 1\n[[backend]]\nname = 'a'", "[failover] has no breaker"),
        ("", "no [[backend]]"),
        ("[[backend", "not TOML"),
    ],
)
def test_a_pool_that_cannot_be_used_says_what_to_change(text: str, says: str):
    with pytest.raises(PoolError, match=None) as caught:
        BackendPool.parse(text)
    assert says in str(caught.value)
    assert "AIza" not in str(caught.value)  # a key written where it must not be is never echoed


def test_models_of_two_families_need_the_operators_leave():
    backends = (
        Backend("a", models=("gemini-2.5-flash-native-audio-preview-12-2025",)),
        Backend("b", models=("gemini-3.1-flash-live-preview",)),
    )
    with pytest.raises(PoolError, match="allow_family_change"):
        BackendPool(backends).targets("x")
    allowed = BackendPool(backends, FailoverPolicy(allow_family_change=True))
    assert [t.model for t in allowed.targets("x")] == [b.models[0] for b in backends]


def test_a_key_comes_from_the_environment_and_a_missing_one_is_named_not_shown(monkeypatch: pytest.MonkeyPatch):
    backend = Backend("a", api_key_env="TEST_KEY_ONE")
    monkeypatch.setenv("TEST_KEY_ONE", "the-key")
    assert backend.api_key() == "the-key"
    assert "the-key" not in repr(backend)
    monkeypatch.delenv("TEST_KEY_ONE")
    with pytest.raises(LiveError, match="TEST_KEY_ONE .its key. is not set"):
        default_registry().resolve_at("gemini-live-2.5-flash-preview", backend)


def test_a_move_to_another_family_fits_the_settings_that_family_refuses():
    config = types.LiveConnectConfig(
        thinking_config=types.ThinkingConfig(thinking_budget=0),
        enable_affective_dialog=True,
        proactivity=types.ProactivityConfig(proactive_audio=False),
        speech_config=types.SpeechConfig(
            voice_config=types.VoiceConfig(prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name="Sulafat"))
        ),
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="f", behavior=types.Behavior.BLOCKING)])],
    )
    on_38, changed = fit_config(config, family_of("gemini-3.8-live"))
    assert on_38.thinking_config is None and on_38.enable_affective_dialog is None
    assert on_38.proactivity.proactive_audio is None
    assert on_38.speech_config == config.speech_config  # 3.8 speaks with every voice
    thinking, changed = fit_config(config, family_of("gemini-3.8-live-extended-thinking"))
    assert thinking.tools[0].function_declarations[0].behavior is None  # it calls functions asynchronously only
    assert thinking.thinking_config == config.thinking_config  # its thinking levels are the setup's to choose
    assert config.thinking_config is not None  # the agent's own config is untouched
    half_cascade, changed = fit_config(config, family_of("gemini-live-2.5-flash-preview"), voice="Kore")
    assert half_cascade.speech_config.voice_config.prebuilt_voice_config.voice_name == "Kore"
    assert changed == ["voice Sulafat -> Kore"]
    unchanged, nothing = fit_config(config, family_of("gemini-2.5-flash-native-audio-preview-12-2025"))
    assert unchanged is config and nothing == []


def test_a_move_to_a_family_that_does_not_carry_a_service_tool_leaves_that_tool_out():
    """The Live tools guide: code execution and URL context on the half-cascade
    2.5 models only; Search and functions everywhere."""
    config = types.LiveConnectConfig(
        tools=[
            types.Tool(function_declarations=[types.FunctionDeclaration(name="f")]),
            types.Tool(google_search=types.GoogleSearch(), code_execution=types.ToolCodeExecution()),
            types.Tool(url_context=types.UrlContext()),
        ]
    )
    on_31, changed = fit_config(config, family_of("gemini-3.1-flash-live-preview"))
    assert on_31.tools == [
        types.Tool(function_declarations=[types.FunctionDeclaration(name="f")]),
        types.Tool(google_search=types.GoogleSearch()),
    ]
    assert changed == ["tool code_execution", "tool url_context"]
    assert len(config.tools) == 3 and config.tools[1].code_execution is not None  # the agent's own is untouched
    same, nothing = fit_config(config, family_of("gemini-live-2.5-flash-preview"))
    assert same is config and nothing == []


def test_an_agent_carries_its_pool():
    pool = BackendPool((Backend("a"),))
    assert Agent(name="a", model="gemini-live-2.5-flash-preview", backends=pool).backends is pool


def _serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "live.cli", "serve", "--port", "0", "--max-sessions", "2", *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )


def test_live_serve_refuses_a_pool_whose_key_is_not_in_the_environment(tmp_path: Path):
    pool = tmp_path / "backends.toml"
    pool.write_text(POOL)
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_KEY_ONE", "GOOGLE_API_KEY", "GEMINI_API_KEY")}
    native = "gemini-2.5-flash-native-audio-preview-12-2025"
    done = _serve(["--model", native, "--backends", str(pool)], env)
    assert done.returncode == 2
    assert done.stderr.strip() == "live serve: backend 'studio-1': the environment variable TEST_KEY_ONE (its key) is not set"
    mixed = _serve(["--model", "gemini-live-2.5-flash-preview", "--backends", str(pool)], env)
    assert mixed.returncode == 2 and "allow_family_change" in mixed.stderr
    written = tmp_path / "leaky.toml"
    written.write_text('[[backend]]\nname = "a"\napi_key = "AIzaSySECRET"\n')
    leaky = _serve(["--model", "gemini-live-2.5-flash-preview", "--backends", str(written)], env)
    assert leaky.returncode == 2 and "a secret never goes in this file" in leaky.stderr
    assert "SECRET" not in leaky.stderr + leaky.stdout


def test_the_pools_the_resilience_page_shows_are_pools_live_serve_reads():
    page = (ROOT / "docs" / "resilience.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", page, flags=re.S)
    blocks += re.findall(r"<<'TOML'\n(.*?)TOML\n", page, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        pool = BackendPool.parse(block, source="docs/resilience.md")
        assert pool.targets("gemini-2.5-flash-native-audio-preview-12-2025")
