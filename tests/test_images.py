"""Image frames without sockets: what the bytes are, the message, the limits, the queue."""

from __future__ import annotations

import base64
import io
import json

import pytest
from google.genai import types
from PIL import Image as PILImage

from live.images import InvalidImage, inspect_image
from live.protocol import Image, ProtocolError, encode, parse_client_message
from live.server.queues import UpstreamQueue
from live.engine.session import ImageUpstream, SendEvent, SessionCore


def picture(width: int, height: int, fmt: str = "JPEG", **save) -> bytes:
    image = PILImage.new("RGB", (width, height), (200, 40, 90))
    for x in range(0, width, 7):  # some detail, so the encoder has work to do
        image.putpixel((x, x * height // width), (10, 220, 30))
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def image_message(data: bytes, mime_type: str = "image/jpeg") -> str:
    return json.dumps(
        {"type": "image", "mime_type": mime_type, "data": base64.b64encode(data).decode()}
    )


# --------------------------------------------------------------- what the bytes are


@pytest.mark.parametrize(
    ("fmt", "mime", "save"),
    [
        ("JPEG", "image/jpeg", {}),
        ("JPEG", "image/jpeg", {"progressive": True, "quality": 60}),
        ("PNG", "image/png", {}),
    ],
)
@pytest.mark.parametrize(("width", "height"), [(768, 432), (1, 1), (300, 1024)])
def test_type_and_dimensions_are_read_from_the_header(fmt, mime, save, width, height):
    data = picture(width, height, fmt, **save)
    info = inspect_image(data, mime)
    assert (info.mime_type, info.width, info.height, info.size) == (mime, width, height, len(data))


def test_a_jpeg_with_exif_before_its_frame_header_is_read():
    exif = PILImage.Exif()
    exif[0x010F] = "Camera maker " * 50  # a long APP1 segment before SOF
    data = picture(640, 480, "JPEG", exif=exif.tobytes())
    assert data.index(b"Exif") < 40
    assert (inspect_image(data).width, inspect_image(data).height) == (640, 480)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (picture(64, 64, "GIF"), "neither a JPEG nor a PNG"),
        (b"", "neither a JPEG nor a PNG"),
        (b"hello world, not a picture", "neither a JPEG nor a PNG"),
        (picture(64, 64)[:-200], "incomplete"),  # cut short in transit
        (picture(64, 64, "PNG")[:-5], "incomplete"),
        (b"\xff\xd8\xff\xd9", "no frame header"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, "IHDR"),
    ],
)
def test_what_is_not_a_complete_jpeg_or_png_is_refused(data, says):
    with pytest.raises(InvalidImage, match=says):
        inspect_image(data)


def test_the_bytes_must_be_of_the_type_the_label_says():
    with pytest.raises(InvalidImage, match="are a PNG, not image/jpeg"):
        inspect_image(picture(8, 8, "PNG"), "image/jpeg")


# --------------------------------------------------------------- the message


def test_image_message_round_trips_through_the_protocol():
    data = picture(320, 240)
    parsed = parse_client_message(encode(Image(mime_type="image/jpeg", data=data)))
    assert isinstance(parsed, Image)
    assert parsed.data == data
    assert (parsed.info.width, parsed.info.height) == (320, 240)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (image_message(picture(8, 8, "GIF"), "image/gif"), "unsupported_image_type"),
        (image_message(picture(8, 8, "WEBP"), "image/webp"), "unsupported_image_type"),
        (image_message(picture(8, 8, "GIF"), "image/jpeg"), "invalid_image"),
        (image_message(picture(8, 8, "PNG"), "image/jpeg"), "invalid_image"),
        (json.dumps({"type": "image", "mime_type": "image/png", "data": "not base64!"}), "invalid_image"),
        (
            json.dumps({"type": "image", "mime_type": "image/png",
                        "data": "data:image/png;base64," + base64.b64encode(picture(8, 8, "PNG")).decode()}),
            "invalid_image",
        ),
        (json.dumps({"type": "image", "mime_type": "image/png"}), "missing_field"),
        (json.dumps({"type": "image", "data": "AAAA"}), "missing_field"),
    ],
)
def test_a_frame_that_is_not_an_allowed_image_gets_its_own_error(message, code):
    with pytest.raises(ProtocolError) as caught:
        parse_client_message(message)
    assert caught.value.code == code
    assert not caught.value.fatal
    assert "dropped" in caught.value.message or code == "missing_field"


# --------------------------------------------------------------- limits in the session


def core(**kwargs) -> SessionCore:
    return SessionCore(input_rate=16000, **kwargs)


def test_an_image_goes_upstream_as_a_blob_of_its_type():
    data = picture(64, 48, "PNG")
    actions = core().client_text(image_message(data, "image/png"), now=0.0)
    assert actions == [ImageUpstream(types.Blob(data=data, mime_type="image/png"))]


def test_an_image_is_context_not_a_turn_the_model_owes_a_reply_to():
    session = core()
    session.client_text(image_message(picture(64, 48)), now=0.0)
    assert session.awaiting_reply_since is None
    assert session.at_safe_point


def test_an_image_over_the_size_limit_is_dropped_with_an_error():
    data = picture(800, 600, "PNG")
    session = core(max_image_bytes=len(data) - 1)
    [action] = session.client_text(image_message(data, "image/png"), now=0.0)
    assert isinstance(action, SendEvent)
    assert action.event.code == "image_too_large"
    assert not action.event.fatal
    assert f"{len(data)} bytes" in action.event.message
    # A smaller one goes through.
    small = picture(80, 60)
    assert isinstance(session.client_text(image_message(small), now=0.1)[0], ImageUpstream)


def sent_at(session: SessionCore, times: list[float]) -> list[str]:
    """What became of one frame sent at each time: 'sent', an error code, or '' (silently dropped)."""
    data = picture(32, 32)
    out = []
    for t in times:
        actions = session.client_text(image_message(data), now=t)
        if any(isinstance(a, ImageUpstream) for a in actions):
            out.append("sent")
        else:
            out.append(actions[0].event.code if actions else "")
    return out


def test_at_most_two_images_a_second_by_default():
    # Four a second: every other frame is refused; the error comes once a second.
    times = [i * 0.25 for i in range(9)]
    assert sent_at(core(), times) == [
        "sent", "sent", "image_rate_limited", "",
        "sent", "sent", "image_rate_limited", "",
        "sent",
    ]


def test_images_at_the_rate_or_slower_all_go():
    assert sent_at(core(), [i * 0.5 for i in range(10)]) == ["sent"] * 10
    assert sent_at(core(max_image_rate=1.0), [0.0, 1.0, 1.9, 3.0]) == [
        "sent", "sent", "image_rate_limited", "sent",
    ]


def test_a_fractional_rate_allows_one_frame_per_period():
    assert sent_at(core(max_image_rate=0.5), [0.0, 1.0, 2.0, 4.0]) == [
        "sent", "image_rate_limited", "sent", "sent",
    ]


def test_the_rate_error_counts_what_was_dropped_since_it_was_last_reported():
    session = core()
    data = picture(16, 16)
    errors = []
    for i in range(40):  # 20 frames a second for two seconds
        for action in session.client_text(image_message(data), now=i * 0.05):
            if isinstance(action, SendEvent):
                errors.append(action.event.message)
    assert len(errors) == 2
    assert "1 frame(s) dropped" in errors[0]
    assert "18 frame(s) dropped" in errors[1]  # 17 silent, then this one


def test_without_context_compression_the_first_image_brings_a_warning():
    session = core(video_capped=True)
    first = session.client_text(image_message(picture(16, 16)), now=0.0)
    assert [a.event.code for a in first if isinstance(a, SendEvent)] == ["video_time_limit"]
    assert "two minutes" in first[0].event.message
    assert not first[0].event.fatal
    assert isinstance(first[-1], ImageUpstream)
    second = session.client_text(image_message(picture(16, 16)), now=1.0)
    assert [type(a) for a in second] == [ImageUpstream]


# --------------------------------------------------------------- the upstream queue


async def drain(queue: UpstreamQueue) -> list:
    out = []
    while queue._items:  # noqa: SLF001 - what is left, in order
        _, items = await queue.peek_run(100)
        queue.commit()
        out.extend(items)
    return out


@pytest.mark.anyio
async def test_images_keep_their_place_among_audio_frames():
    queue: UpstreamQueue[str] = UpstreamQueue()
    for item in ["a1", "a2"]:
        queue.put_audio(item)
    queue.put_image("img1")
    queue.put_audio("a3")
    assert await queue.peek_run(100) == (True, ["a1", "a2"])
    queue.commit()
    assert await queue.peek_run(100) == (False, ["img1"])
    queue.commit()
    assert await drain(queue) == ["a3"]


@pytest.mark.anyio
async def test_a_new_image_replaces_the_old_one_still_waiting_and_audio_is_kept():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=100)
    for i in range(50):  # a model a second behind: audio waits, images pile up
        queue.put_audio(f"a{i}", 640)
        if i % 25 == 0:
            queue.put_image(f"img{i}", 40_000)
    assert queue.dropped_images == 1
    assert queue.dropped_audio == 0
    assert queue.held_bytes == 50 * 640 + 40_000  # one image's worth, not two
    left = await drain(queue)
    assert [x for x in left if x.startswith("img")] == ["img25"]
    assert len([x for x in left if x.startswith("a")]) == 50


@pytest.mark.anyio
async def test_an_image_being_sent_is_never_dropped():
    queue: UpstreamQueue[str] = UpstreamQueue()
    queue.put_image("img1")
    assert await queue.peek_run(100) == (False, ["img1"])
    assert not queue.put_image("img2")  # img1 is in flight: it is not dropped
    queue.release()  # the send failed; it is still first
    assert await queue.peek_run(100) == (False, ["img1"])
    queue.commit()
    assert await drain(queue) == ["img2"]


@pytest.mark.anyio
async def test_when_audio_reaches_its_bound_a_waiting_image_goes_first():
    queue: UpstreamQueue[str] = UpstreamQueue(max_audio=4, max_images=2)
    queue.put_image("img-old")
    for i in range(4):
        queue.put_audio(f"a{i}")
    queue.put_image("img-new")
    assert queue.put_audio("a4")  # at the bound: the oldest audio and the oldest image go
    assert (queue.dropped_images, queue.dropped_audio) == (1, 1)
    assert await drain(queue) == ["a1", "a2", "a3", "img-new", "a4"]
