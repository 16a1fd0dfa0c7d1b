"""lmpress.vocabulary.images: every way a row names an image, read and checked in one place, and the one
line a bad image gets."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import pytest

from lmpress.data.row_shapes import parse_row
from lmpress.vocabulary import images
from lmpress.vocabulary.errors import InputError
from lmpress.vocabulary.images import (
    ImageBytes,
    ImageError,
    TooManyPixels,
    image_part,
    image_urls,
    load_image,
    open_image,
    read_image,
)
from lmpress.vocabulary.types import Request

PIL = pytest.importorskip("PIL.Image")


def png_bytes(color=(200, 30, 30), size=(12, 9), kind="PNG") -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", size, color).save(buffer, kind)
    return buffer.getvalue()


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


@pytest.fixture
def png(tmp_path):
    path = tmp_path / "red cat.png"
    path.write_bytes(png_bytes())
    return path


def test_every_url_form_reads_the_same_pixels(png):
    raw = png.read_bytes()
    for url in (png.as_uri(), str(png), data_url(raw)):
        image = load_image(url)
        assert image.mode == "RGB" and image.size == (12, 9)
        assert image.getpixel((0, 0)) == (200, 30, 30)
    assert read_image(str(png)).media_type == "image/png"


def test_jpeg_gif_and_webp_are_known_by_their_bytes_not_their_name(tmp_path):
    for kind, media_type in (("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")):
        path = tmp_path / "named.png"  # the name lies; the bytes decide
        path.write_bytes(png_bytes(kind=kind))
        assert read_image(str(path)).media_type == media_type
        assert load_image(str(path)).size == (12, 9)


def test_http_urls_are_fetched(png):
    body = png.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/cat.png":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        assert load_image(f"{base}/cat.png").size == (12, 9)
        with pytest.raises(ImageError, match="answered HTTP 404"):
            read_image(f"{base}/dog.png")
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///no/such/cat.png", r"^image 1 \(file:///no/such/cat.png\): no such file$"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png", "needs a comma"),
        (data_url(b"%PDF-1.7 not an image"), "is not a PNG, JPEG, GIF or WebP image"),
        (data_url(b""), "is empty"),
        (data_url(png_bytes()[:40]), "cannot be decoded as PNG"),
        ("file://otherhost/cat.png", "a file URL names a file on this machine"),
    ],
)
def test_a_bad_image_is_one_line_naming_it(url, message):
    with pytest.raises(ImageError, match=message) as caught:
        load_image(url)
    assert "\n" not in str(caught.value) and caught.value.kind == "invalid_request"
    assert "base64," not in str(caught.value)  # a data: URL is named by its type, not its data


def test_too_large_in_bytes_or_pixels(png, monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 50)
    with pytest.raises(ImageError, match="over the 0 MiB an image may be"):
        read_image(str(png))
    monkeypatch.undo()
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ImageError, match="is 12x9 pixels, over the 100"):
        load_image(str(png))


def png_header(width: int, height: int) -> bytes:
    """A PNG that is only its header: what Pillow reads to open an image."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def test_a_bomb_is_refused_from_its_header_naming_the_setting():
    """A 143 KB PNG that decodes to 147 MB: refused before a pixel is decoded."""
    from tests.image_files import png_bomb

    raw = ImageBytes(png_bomb(7000, 7000), "image/png")
    limit = r"is 7000x7000 pixels, over the 16,777,216 pixels an image may have \(serve.max_image_pixels\)"
    with pytest.raises(TooManyPixels, match=limit):
        open_image(raw, "image 1", 4096 * 4096, "serve.max_image_pixels")


def test_an_image_past_pillows_own_bomb_limit_is_over_any_limit():
    """Pillow refuses to open an image of more than twice its MAX_IMAGE_PIXELS (a
    DecompressionBombError): that is an image over the limit too, not a damaged file."""
    raw = ImageBytes(png_header(20_000, 20_000), "image/png")
    with pytest.raises(TooManyPixels, match="^image 1: is over the 1,000,000,000 pixels"):
        open_image(raw, "image 1", 10**9, "serve.max_image_pixels")


def test_oumi_items_and_openai_parts_name_the_same_image(png, tmp_path, monkeypatch):
    raw = png.read_bytes()
    monkeypatch.chdir(tmp_path)
    content = [
        {"type": "image_url", "image_url": {"url": png.as_uri(), "detail": "low"}},
        {"type": "image_path", "content": "red cat.png"},  # Oumi: relative to the cwd
        {"type": "image_url", "content": data_url(raw)},
        {"type": "image_binary", "binary": base64.b64encode(raw).decode()},
        {"type": "text", "content": "What is this?"},
    ]
    row = parse_row({"messages": [{"role": "user", "content": content}]}, 1)
    request = Request("r", row.messages)
    urls = image_urls(request)
    assert len(urls) == 4 and urls[1] == png.as_uri()
    assert {read_image(url).data for url in urls} == {raw}


def test_image_part_checks_the_file_at_once(png, tmp_path):
    assert image_part(str(png), "--image").image_url == png.as_uri()
    assert image_part("https://example.invalid/cat.png", "--image").image_url.startswith("https")
    with pytest.raises(InputError, match=r"^--image: nope.png: no such file$"):
        image_part("nope.png", "--image")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(InputError, match=r"^/image: .*notes.txt: is not a PNG, JPEG, GIF or WebP"):
        image_part(str(text), "/image")
