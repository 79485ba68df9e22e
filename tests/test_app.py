"""davir-app as a user has it: the demo model's page answers with caption.py's captions, through gradio_client and
in a real browser (Debian's headless Chromium over its DevTools protocol); bad uploads get caption.py's messages;
the browse tab filters a captions.jsonl; the compare tab shows two models side by side."""

import json
import os
import re
import socket
import struct
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from davir.app.browser import Chromium, chromium_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from davir.cli import app as app_script  # noqa: E402
from davir.cli import caption as caption_script  # noqa: E402
from tests.test_caption import trained  # noqa: E402,F401 - the tiny DAVIR run fixture

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

GOOD = ("p00", "p01")
BAD = ("corrupt", "mismatch", "huge")


def huge_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG whose header claims 400 megapixels (a few hundred bytes): decoding it would be a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    )
    return path


@pytest.fixture(scope="module")
def pairs(trained):
    """The demo's test pairs (before/ + after/, matching names) and one of each bad upload."""
    root, data = trained / "pairs", trained / "data"
    (root / "before").mkdir(parents=True)
    (root / "after").mkdir()
    for name, path in zip(GOOD, sorted((data / "images").iterdir())):
        Image.open(path).save(root / "before" / f"{name}.png")
        Image.open(data / "sc_images" / path.name.replace("default", "semantic")).save(root / "after" / f"{name}.png")
    (root / "before" / "corrupt.png").write_text("not an image\n")
    Image.new("RGB", (96, 72)).save(root / "after" / "corrupt.png")
    Image.new("RGB", (50, 40)).save(root / "before" / "mismatch.png")
    Image.new("RGB", (96, 72)).save(root / "after" / "mismatch.png")
    huge_png(root / "before" / "huge.png")
    Image.new("RGB", (96, 72)).save(root / "after" / "huge.png")
    return root


@pytest.fixture(scope="module")
def expected(trained, pairs):
    """caption.py's rows for the same pairs (exit 1: some pairs failed, listed), by id; and its JSONL."""
    out = trained / "captioned" / "captions.jsonl"
    assert (
        caption_script.main(
            [
                "--checkpoint",
                str(trained / "runs" / "tiny"),
                "--pairs",
                str(pairs),
                "--out",
                str(out),
                "--workers",
                "0",
                "--quiet",
            ]
        )
        == 1
    )
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == set(GOOD + BAD) and all(rows[k]["caption"] for k in GOOD)
    return rows, out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def app(trained, expected):
    """`davir-app --checkpoint RUN --captions JSONL --compare RUN/last` on a free port, in this process."""
    run = trained / "runs" / "tiny"
    demo, url = app_script.main(
        [
            "--checkpoint",
            str(run),
            "--compare",
            str(run / "last"),
            "--captions",
            str(expected[1]),
            "--port",
            str(free_port()),
            "--device",
            "cpu",
        ],
        block=False,
    )
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(app):
    return Client(app, verbose=False)


def pair_files(pairs: Path, name: str) -> tuple[Path, Path]:
    return pairs / "before" / f"{name}.png", pairs / "after" / f"{name}.png"


def test_the_app_captions_a_pair_as_caption_py_does(client, pairs, expected):
    rows, _ = expected
    for name in GOOD:
        before, after = pair_files(pairs, name)
        caption, entities, *images, status = client.predict(
            handle_file(str(before)), handle_file(str(after)), api_name="/caption"
        )
        assert caption == rows[name]["caption"]
        assert [[e, pytest.approx(s, abs=1e-3)] for e, s in rows[name]["entities"]] == entities["data"]
        assert len(images) == 4 and all(Path(image).is_file() for image in images)  # masks and FAC attention
        with Image.open(images[3]) as attention:
            assert attention.width >= 320  # the demo's 96 px images are shown enlarged
        assert "davir" in status and "96×72 px" in status


def _without_folders(message: str) -> str:
    """A message with each absolute path shortened to its file name (caption.py's name its folders, uploads not)."""
    return re.sub(r"/[^\s'\"()]*/([^/\s'\"()]+)", r"\1", message)


def test_bad_uploads_get_caption_py_messages(client, pairs, expected):
    rows, _ = expected
    for name in BAD:
        before, after = pair_files(pairs, name)
        with pytest.raises(AppError) as raised:
            client.predict(handle_file(str(before)), handle_file(str(after)), api_name="/caption")
        message = str(raised.value)
        assert message == _without_folders(rows[name]["error"]), name
        assert "/tmp" not in message and str(pairs) not in message  # no server-side folder in what the user reads
    assert "corrupt or not an image" in rows["corrupt"]["error"] and "50x40" in rows["mismatch"]["error"]
    assert "too large to decode safely" in rows["huge"]["error"]
    with pytest.raises(AppError, match="no after image: give a before image and an after image"):
        client.predict(handle_file(str(pair_files(pairs, "p00")[0])), None, api_name="/caption")


def test_browse_filters_the_failed_pairs_and_a_word(client, expected):
    rows, jsonl = expected
    summary, strips, table = client.predict(str(jsonl), "", False, "", api_name="/browse")
    assert "**5** pairs · 2 captioned · 3 not captioned · **5** match" in summary
    assert [r[0] for r in table["data"]] == [r["id"] for r in map(json.loads, jsonl.read_text().splitlines())]
    assert len(strips) == 2 and all(Path(s["image"]).is_file() for s in strips)  # the report's strips, labelled
    assert strips[0]["caption"] == f"p00: {rows['p00']['caption']}"
    _, strips, table = client.predict(str(jsonl), "", True, "", api_name="/browse")
    assert sorted(r[0] for r in table["data"]) == sorted(BAD) and not strips
    word = rows["p00"]["caption"].split()[-1]
    summary, _, table = client.predict(str(jsonl), "", False, word.upper(), api_name="/browse")
    assert {r[0] for r in table["data"]} == {k for k in GOOD if word in rows[k]["caption"].split()}
    summary, _, table = client.predict(str(jsonl), "", True, "safely", api_name="/browse")  # in an error
    assert [r[0] for r in table["data"]] == ["huge"] and "**1** match" in summary
    with pytest.raises(AppError, match="no such file"):
        client.predict(str(jsonl.with_name("other.jsonl")), "", False, "", api_name="/browse")


def test_compare_shows_two_models_side_by_side(client, trained, pairs, expected):
    rows, _ = expected
    before, after = pair_files(pairs, "p01")
    run = trained / "runs" / "tiny"
    name_a, caption_a, _, strip_a, name_b, caption_b, _, strip_b = client.predict(
        handle_file(str(before)), handle_file(str(after)), str(run), str(run / "last"), api_name="/compare"
    )
    assert caption_a == caption_b == rows["p01"]["caption"]
    # run and run/last are one model folder: loaded once, named as first asked for
    assert name_a.startswith(f"**A**: {run} (davir, last/)") and name_b.startswith(f"**B**: {run} (davir, last/)")
    assert "before | after | change mask | attention before | attention after" in name_a
    assert Path(strip_a).is_file() and Path(strip_b).is_file()
    with pytest.raises(AppError, match="model B: checkpoint .*nowhere: no such folder"):
        client.predict(
            handle_file(str(before)), handle_file(str(after)), str(run), str(trained / "nowhere"), api_name="/compare"
        )


def test_a_checkpoint_that_is_no_model_is_one_line(tmp_path, capsys):
    assert app_script.main(["--checkpoint", str(tmp_path), "--port", str(free_port())], block=False) == 2
    assert "neither a saved model" in capsys.readouterr().err


def test_screenshots_errors_are_one_line_and_a_failed_page_writes_no_picture(tmp_path, capsys, monkeypatch):
    """`python -m davir.cli.screenshots`: a missing --before, a checkpoint that is no model (DataError) or a page that
    never shows what it waits for (BrowserError) ended in a traceback; the pictures were written one by one into
    --out (docs/images), so a failure after the first left a mixed set. Now one line, exit 2, and --out gets the three
    pictures only when all were taken."""
    from davir.app import screenshots as shots_module
    from davir.app import serve
    from davir.app.browser import BrowserError
    from davir.cli import screenshots as screenshots_script

    for name in ("before.png", "after.png"):
        Image.new("RGB", (32, 24), (90, 90, 90)).save(tmp_path / name)
    (tmp_path / "captions.jsonl").write_text("")
    out = tmp_path / "images é"
    out.mkdir()
    (out / "app_caption.png").write_bytes(b"the picture of the docs")
    argv = ["--checkpoint", str(tmp_path), "--compare", str(tmp_path), "--captions", str(tmp_path / "captions.jsonl")]
    argv += ["--before", str(tmp_path / "before.png"), "--after", str(tmp_path / "after.png"), "--out", str(out)]

    missing = [*argv[:6], "--before", str(tmp_path / "absent.png"), *argv[8:]]
    assert screenshots_script.main(missing) == 2
    assert capsys.readouterr().err == f"error: --before {tmp_path / 'absent.png'}: no such file\n"
    assert screenshots_script.main(argv) == 2  # the real app on a folder that is no model
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "neither a saved model" in err and "Traceback" not in err

    class Demo:
        def close(self):
            pass

    monkeypatch.setattr(serve, "start", lambda *args, **kwargs: (Demo(), "http://127.0.0.1:1"))

    def one_then_stuck(url, folder, before, after, *, word, width):
        Image.new("RGB", (64, 48), (200, 10, 10)).save(folder / "app_caption.png")
        raise BrowserError("waited 30 s for: the browse tab's strips")

    monkeypatch.setattr(shots_module, "_take", one_then_stuck)
    assert screenshots_script.main(argv) == 2
    assert capsys.readouterr().err == "error: waited 30 s for: the browse tab's strips\n"
    assert [p.name for p in out.iterdir()] == ["app_caption.png"]
    assert (out / "app_caption.png").read_bytes() == b"the picture of the docs"

    def all_three(url, folder, before, after, *, word, width):
        names = ("app_caption.png", "app_browse.png", "app_compare.png")
        for name in names:
            Image.new("RGB", (64, 48), (200, 10, 10)).save(folder / name)
        return [folder / name for name in names]

    monkeypatch.setattr(shots_module, "_take", all_three)
    assert screenshots_script.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["app_browse.png", "app_caption.png", "app_compare.png"]
    assert Image.open(out / "app_caption.png").mode == "P"  # reduced to a palette


@pytest.mark.parametrize("value", ["-1", "0"])
def test_an_upload_limit_below_one_mb_is_a_usage_error_before_the_model_loads(tmp_path, capsys, value):
    # it loaded the model, then Gradio stopped with a traceback (ValueError: invalid literal for int() …: '')
    with pytest.raises(SystemExit) as stopped:
        app_script.main(["--checkpoint", str(tmp_path), "--max-upload-mb", value], block=False)
    assert stopped.value.code == 2 and f"--max-upload-mb: must be 1 or more, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "-1", "0"])
def test_a_port_out_of_range_is_a_usage_error_before_the_model_loads(tmp_path, capsys, port):
    # it loaded the model, then Gradio stopped with a traceback (OverflowError: bind(): port must be 0-65535)
    with pytest.raises(SystemExit) as stopped:
        app_script.main(["--checkpoint", str(tmp_path), "--port", port], block=False)
    assert stopped.value.code == 2 and "argument --port: expected a port number 1-65535" in capsys.readouterr().err


@pytest.mark.skipif(
    chromium_path() is None,
    reason="no Chromium installed (make system-deps installs Debian's "
    "chromium); the page is tested in a real browser where it is",
)
@pytest.mark.slow  # headless Chromium driving the page
def test_the_page_in_headless_chromium_captions_the_demo_pair_as_caption_py(app, pairs, expected):
    rows, _ = expected
    before, after = pair_files(pairs, "p00")
    with Chromium() as browser:
        browser.open(app)
        browser.wait_for("!!document.querySelector('#before input[type=file]')", timeout=30)
        browser.upload("#before input[type=file]", before)
        browser.upload("#after input[type=file]", after)
        browser.wait_for("!!(document.querySelector('#before img') && document.querySelector('#after img'))")
        browser.click("#caption-button")
        caption = browser.wait_for("document.querySelector('#caption textarea').value", timeout=30)
        assert caption == rows["p00"]["caption"]
        browser.wait_for("[...document.querySelectorAll('#attention-after img')].some(i => i.naturalWidth > 0)")
        browser.click_text("button[role=tab]", "Browse captions")
        browser.click("#browse-button")
        summary = browser.wait_for(
            "(e => e && e.innerText.includes('match') && e.innerText)(document.querySelector('#browse-summary'))"
        )
        assert "5 pairs" in summary
