"""Small test images, made with Pillow: distinct random pictures by seed, and their forms as a
file, a file URL and a data: URL."""

from __future__ import annotations

import base64
import functools
import io
from pathlib import Path


def picture(seed: int, size: tuple[int, int] = (40, 30), kind: str = "PNG") -> bytes:
    """A picture of random colours, a different one for each seed."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", size)
    image.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(size[0] * size[1])])
    buffer = io.BytesIO()
    image.save(buffer, kind)
    return buffer.getvalue()


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def picture_file(folder: Path, seed: int, name: str | None = None) -> Path:
    path = folder / (name or f"picture-{seed}.png")
    path.write_bytes(picture(seed))
    return path


# Bytes that promise a PNG and are not one: the row naming them fails alone.
CORRUPT_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


@functools.cache
def png_bomb(width: int = 7000, height: int = 7000) -> bytes:
    """A PNG of a blank width x height RGB image, compressed a row at a time: 143 KB at
    7000x7000, which decodes to 147 MB (a decompression bomb)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    packer = zlib.compressobj(9)
    row = b"\0" * (1 + 3 * width)  # filter byte, then the row's pixels
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )
