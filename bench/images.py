"""What an image frame costs the server: parsing its message, checking its bytes, the limits.

    python -m bench.images

Prints microseconds per frame for a JPEG of about the largest size that fits in a
64 KiB frame (noise: it does not compress) and for a typical camera frame.
"""

from __future__ import annotations

import io
import random
import time

from PIL import Image as PILImage

from live.images import inspect_image
from live.protocol import Image, encode, parse_client_message
from live.engine.session import SessionCore


def noise_jpeg(side: int) -> bytes:
    out = io.BytesIO()
    PILImage.frombytes("RGB", (side, side), random.Random(side).randbytes(side * side * 3)).save(out, "JPEG", quality=80)
    return out.getvalue()


def camera_jpeg() -> bytes:
    image = PILImage.linear_gradient("L").resize((768, 432)).convert("RGB")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=70)
    return out.getvalue()


def per_frame_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    for name, data in (("largest (noise)", noise_jpeg(260)), ("camera-like 768x432", camera_jpeg())):
        message = encode(Image(mime_type="image/jpeg", data=data))
        core = SessionCore(input_rate=16000, max_image_rate=1e9)
        clock = iter(range(10**9))
        parse = per_frame_us(lambda: parse_client_message(message), 2000)
        check = per_frame_us(lambda: inspect_image(data, "image/jpeg"), 20000)
        whole = per_frame_us(lambda: core.client_text(message, float(next(clock))), 2000)
        print(
            f"{name}: {len(data)} bytes ({len(message)} as a message): parse+check {parse:.0f} us, "
            f"header check alone {check:.1f} us, through the session core {whole:.0f} us per frame"
        )


if __name__ == "__main__":
    main()
