"""One turn of a Pipecat pipeline with its GeminiLiveLLMService, unmodified,
against the server's Live API endpoint. Runs in its own virtual environment
(tests/.pipecat-venv, made by ./test): Pipecat pins its own google-genai.

    python pipecat_gemini_live.py BASE_URL KEY MODEL TEXT CA_FILE

TEXT is the user's message, or a JSON list of messages (`{"role", "content"}`)
the context starts with, as an app seeds it.

Prints one JSON line: what the bot said (its transcript), how much reply audio
came, how many times its reply was interrupted, and the errors the pipeline
reported or logged. After the reply ends (or is interrupted) it listens one
second more, so what would follow it (a reply said again) is seen too.
"""

import asyncio
import json
import ssl
import sys

from google.genai.types import HttpOptions
from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService


async def main(base_url: str, key: str, model: str, text: str, ca_file: str) -> dict:
    result = {"said": "", "audio_bytes": 0, "errors": [], "responses": 0, "interruptions": 0}
    done = asyncio.Event()

    def logged(message) -> None:
        # What Pipecat logs as an error (a refused connection is only logged).
        result["errors"].append(message.record["message"])
        done.set()

    logger.add(logged, level="ERROR")

    class Collect(FrameProcessor):
        async def process_frame(self, frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                result["audio_bytes"] += len(frame.audio)
            elif isinstance(frame, TTSTextFrame):
                result["said"] += frame.text
            elif isinstance(frame, ErrorFrame):
                result["errors"].append(str(frame.error))
                done.set()
            elif isinstance(frame, LLMFullResponseEndFrame):
                result["responses"] += 1
                done.set()
            elif isinstance(frame, InterruptionFrame) and direction == FrameDirection.DOWNSTREAM:
                result["interruptions"] += 1
                done.set()
            await self.push_frame(frame, direction)

    context = ssl.create_default_context(cafile=ca_file)
    llm = GeminiLiveLLMService(
        api_key=key,
        model=model,
        http_options=HttpOptions(base_url=base_url, api_version="v1beta", async_client_args={"ssl": context}),
    )
    # Errors travel upstream from the service, its output downstream: one
    # collector on each side.
    task = PipelineTask(Pipeline([Collect(), llm, Collect()]), idle_timeout_secs=None)
    runner = PipelineRunner(handle_sigint=False)
    running = asyncio.create_task(runner.run(task))
    messages = json.loads(text) if text.startswith("[") else [{"role": "user", "content": text}]
    await task.queue_frame(LLMContextFrame(LLMContext(messages=messages)))
    try:
        await asyncio.wait_for(done.wait(), timeout=20)
    except TimeoutError:
        result["errors"].append("no response within 20 s")
    await asyncio.sleep(1.0)  # what follows the reply's end, if anything
    await task.cancel()
    await asyncio.wait_for(running, timeout=10)
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:6]))), flush=True)
