"""What an image frame really is, read from its own bytes (no decoder, no I/O).

A client says an image is `image/jpeg` or `image/png`; the server believes the
bytes, not the label. `inspect_image` checks the signature, reads the width and
height from the header (PNG's IHDR chunk, JPEG's start-of-frame segment) and
checks the file is complete (PNG's IEND chunk, JPEG's end-of-image marker), so a
truncated upload or a renamed GIF is refused before it reaches the model. The
checks read a few hundred bytes at most; decoding pixels is the model's job.
"""

from __future__ import annotations

import dataclasses
import struct

__all__ = ["IMAGE_TYPES", "ImageInfo", "InvalidImage", "inspect_image", "sniff_type"]

IMAGE_TYPES = ("image/jpeg", "image/png")
"""The image types a client may send, as Gemini Live takes them as video frames."""

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_JPEG_SOI = b"\xff\xd8\xff"
_JPEG_EOI = b"\xff\xd9"
# Start-of-frame markers (baseline, progressive, lossless, ...); C4, C8 and CC
# share the range but are other segments.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class InvalidImage(ValueError):
    """The bytes are not a complete image of the type they claim to be."""


@dataclasses.dataclass(frozen=True, slots=True)
class ImageInfo:
    mime_type: str
    width: int
    height: int
    size: int

    def describe(self) -> str:
        kind = "JPEG" if self.mime_type == "image/jpeg" else "PNG"
        return f"a {self.width}x{self.height} {kind} image of {self.size} bytes"


def sniff_type(data: bytes) -> str | None:
    """The image type the bytes' signature says, or None for anything else."""
    if data.startswith(_PNG_SIGNATURE):
        return "image/png"
    if data.startswith(_JPEG_SOI):
        return "image/jpeg"
    return None


def inspect_image(data: bytes, mime_type: str | None = None) -> ImageInfo:
    """Type, size and dimensions of a JPEG or PNG; raises `InvalidImage` otherwise.

    With `mime_type`, the bytes must also be of that type.
    """
    actual = sniff_type(data)
    if actual is None:
        raise InvalidImage("the bytes are neither a JPEG nor a PNG (their signature does not match)")
    if mime_type is not None and mime_type != actual:
        raise InvalidImage(f"the bytes are {'a PNG' if actual == 'image/png' else 'a JPEG'}, not {mime_type}")
    if actual == "image/png":
        width, height = _png_size(data)
    else:
        width, height = _jpeg_size(data)
    if width <= 0 or height <= 0:
        raise InvalidImage(f"the image header says {width}x{height} pixels")
    return ImageInfo(actual, width, height, len(data))


def _png_size(data: bytes) -> tuple[int, int]:
    # Signature, then IHDR must be the first chunk: length 13, type, width, height.
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise InvalidImage("a PNG must begin with its IHDR chunk; this one does not")
    if not data.endswith(_PNG_IEND):
        raise InvalidImage("the PNG is incomplete: it does not end with an IEND chunk")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _jpeg_size(data: bytes) -> tuple[int, int]:
    if not data.endswith(_JPEG_EOI):
        raise InvalidImage("the JPEG is incomplete: it does not end with an end-of-image marker")
    i = 2
    end = len(data)
    while i < end:
        if data[i] != 0xFF:
            raise InvalidImage(f"the JPEG has a broken segment at byte {i}")
        while i < end and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= end:
            break
        marker = data[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            continue  # markers without a length
        if marker in (0xD9, 0xDA):
            break  # end of image, or scan data before any frame header
        if i + 2 > end:
            break
        (length,) = struct.unpack(">H", data[i : i + 2])
        if length < 2:
            raise InvalidImage(f"the JPEG has a segment of impossible length at byte {i}")
        if marker in _JPEG_SOF:
            if length < 7 or i + 7 > end:
                break
            height, width = struct.unpack(">HH", data[i + 3 : i + 7])
            return width, height
        i += length
    raise InvalidImage("the JPEG has no frame header (no width and height before its image data)")
