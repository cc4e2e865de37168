"""``POST /translate_file`` and ``GET /download_file/NAME`` as LibreTranslate answers them: a
multipart form (``file``, ``source``, ``target``, ``api_key``) answered with
``translatedFileUrl``, the file downloaded once under LibreTranslate's name (``notes_fr.txt``),
each format's translation the library's own (:func:`qkv.text.translate_document`); the
limits; temporary files removed after the download, after their time, and when the client
left; no path reaches outside the store."""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse

import pytest
from _serve_documents import SAMPLES, contents, readable
from _serve_helpers import live_server, wait_until

from qkv.serve.files import FileStore, disposition, translated_name
from qkv.text import format_of, translate_document

TEXT = "I am home. He is calm.\nGo on.\n\n  Thank you. Good night.\n"


def send(live, name: str, data: bytes, **fields: str):
    """A file sent as LibreTranslate's page sends it: a multipart form of file, source,
    target and api_key."""
    form = {"source": "en", "target": "fr", "api_key": "", **fields}
    return live.post("/translate_file", files={"file": (name, data)}, data=form)


def download(live, url: str):
    assert url.startswith(live.url + "/download_file/"), url
    return live.client.get(url)


def test_a_txt_file_round_trip(live, translator):
    r = send(live, "notes.txt", TEXT.encode())
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"translatedFileUrl"}
    url = r.json()["translatedFileUrl"]
    got = download(live, url)
    assert got.status_code == 200
    assert got.content == translate_document(TEXT.encode(), translator, "txt")
    assert got.content.decode().count("\n") == TEXT.count("\n")  # three lines and a blank one
    assert got.headers["content-disposition"] == 'attachment; filename="notes_fr.txt"'
    assert got.headers["content-type"].startswith("text/plain")
    # downloaded once: then it is gone, from the disk too
    assert download(live, url).status_code == 404
    assert not any(live.state.files.folder.iterdir())


def test_names_reach_nothing_but_the_files_written(live):
    r = send(live, "a.txt", b"Go.")
    name = r.json()["translatedFileUrl"].rsplit("/", 1)[1]
    assert name.endswith(".a_fr.txt") and len(name.split(".")[0]) == 32
    for bad in ("..%2F..%2Fetc%2Fpasswd", "%2e%2e", "x" * 32 + ".a_fr.txt", name + "x"):
        r = live.get("/download_file/" + bad)
        assert r.status_code in (400, 404), (bad, r.status_code)
        # refused by name, or (an encoded slash, decoded) matching no route at all
        assert r.json()["error"].startswith(("name: ", "path: no route")), r.text
    assert live.get("/download_file/../../etc/passwd").status_code == 404  # no route
    assert live.get("/download_file/" + name).status_code == 200


def test_file_errors_name_the_file(live, translator):
    r = send(live, "notes.exe", b"Go.")
    assert r.status_code == 400 and r.json()["error"].startswith("file: expected a file ending")
    r = live.post("/translate_file", data={"source": "en", "target": "fr"}, files={"x": ("a", b"")})
    assert r.status_code == 400 and r.json()["error"].startswith("file: missing")
    assert send(live, "empty.txt", b"").json()["error"] == "file: 'empty.txt' is empty"
    r = send(live, "latin1.txt", "café".encode("latin-1"))
    assert r.status_code == 400 and r.json()["error"].startswith("file: "), r.text
    r = live.post("/translate_file", json={"file": "Go."})
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]
    r = send(live, "a.txt", b"Go.", target="de")
    assert r.status_code == 400 and r.json()["error"].startswith("target: ")


def test_file_limits_are_413(translator):
    with live_server(translator, max_file_bytes=100, max_file_chars=30, max_chars=10) as s:
        r = send(s, "big.txt", b"Go. " * 40)
        assert r.status_code == 413 and "--max-file-bytes" in r.json()["error"], r.text
        r = send(s, "long.txt", b"One. Two. Three. Four. Five. Six. Seven. Eight.")
        assert r.status_code == 413 and "--max-file-chars" in r.json()["error"], r.text
        r = send(s, "one.txt", b"No end in sight")
        assert r.status_code == 413 and "--max-chars" in r.json()["error"], r.text
        assert send(s, "ok.txt", b"Go. Run.").status_code == 200


def test_the_api_key_may_come_in_the_form(translator):
    with live_server(translator, api_key="k3y") as s:
        assert send(s, "a.txt", b"Go.").status_code == 401
        r = send(s, "a.txt", b"Go.", api_key="k3y")
        assert r.status_code == 200, r.text
        # the download needs no key: its random name is what gives it
        assert s.client.get(r.json()["translatedFileUrl"]).status_code == 200


def test_a_file_not_downloaded_in_time_is_removed(translator):
    with live_server(translator, file_ttl=0.3) as s:
        url = send(s, "a.txt", b"Go.").json()["translatedFileUrl"]
        time.sleep(0.5)
        assert s.client.get(url).status_code == 404
        assert not any(s.state.files.folder.iterdir())


def test_a_client_that_leaves_leaves_no_file_and_no_work(translator):
    """The client sends its file and disconnects while it waits: its sentences are dropped
    from the queue (never decoded) and no file is written."""
    with live_server(translator, max_wait_ms=0) as s:
        batcher = s.lane.batcher
        seen: list[str] = []
        real = batcher.decode

        def recording(texts, decoding):
            seen.extend(texts)
            return real(texts, decoding)

        batcher.decode = recording
        gate, busy = threading.Event(), threading.Event()
        blocker = batcher.call(lambda: busy.set() or gate.wait(60))
        assert busy.wait(
            30
        )  # the worker is in it: only requests' jobs are queued from now  # the worker is busy
        body, ctype = _multipart("left.txt", b"Leave now. Right now.")
        host, port = urllib.parse.urlsplit(s.url).netloc.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            head = (
                f"POST /translate_file HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            wait_until(lambda: batcher.queue_depth >= 1, what="the file's job queued")
            assert s.state.in_flight == 1
        # the connection is closed: the request gives up, its job is cancelled
        wait_until(lambda: s.state.in_flight == 0, what="the request to end")
        gate.set()
        blocker.future.result(30)
        assert s.post("/translate", json={"q": "Go."}).status_code == 200
        assert "Leave now." not in seen and "Go." in seen
        assert len(s.state.files) == 0
        assert not any(s.state.files.folder.iterdir())


def _multipart(name: str, data: bytes) -> tuple[bytes, str]:
    boundary = "qkvboundary1234"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="source"\r\n\r\nen\r\n',
        f'--{boundary}\r\nContent-Disposition: form-data; name="target"\r\n\r\nfr\r\n',
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: text/plain\r\n\r\n",
    ]
    body = "".join(parts).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


# ---------------------------------------------------------------------------- the store alone
def test_libretranslates_names_and_a_download_named_in_utf8():
    assert translated_name("notes.txt", "fr") == "notes_fr.txt"
    assert translated_name("C:\\docs\\report.v2.docx", "de") == "report.v2_de.docx"
    assert translated_name("../../x.srt", "fr") == "x_fr.srt"
    assert translated_name("", "fr") == "file_fr"
    assert disposition("notes_fr.txt") == 'attachment; filename="notes_fr.txt"'
    assert disposition("résumé_fr.txt") == (
        "attachment; filename=\"r_sum__fr.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9_fr.txt"
    )


def test_the_store_keeps_files_private_a_while_and_at_most_so_many(tmp_path):
    now = [0.0]
    store = FileStore(ttl=60, max_files=2, clock=lambda: now[0])
    try:
        a = store.put(b"A", "a.txt")
        assert (store.folder.stat().st_mode & 0o777) == 0o700
        assert ((store.folder / a).stat().st_mode & 0o777) == 0o600
        now[0] = 1
        b = store.put(b"B", "b.txt")
        now[0] = 2
        c = store.put(b"C", "c.txt")  # a third: the oldest goes
        assert len(store) == 2 and store.take(a) is None
        now[0] = 61.5
        assert store.sweep() == 1  # b's time is up, c's is not
        assert store.take(b) is None and store.take(c) == (b"C", "c.txt")
        assert store.take(c) is None  # once
        assert not any(store.folder.iterdir())
        assert not FileStore.well_formed("../" + c) and not FileStore.well_formed("x.txt")
    finally:
        folder = store.folder
        store.close()
    assert not folder.exists()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_format_comes_back_as_the_library_translates_it(live, translator, name):
    if not readable(name):
        pytest.skip(f"the text layer reads no {name.rsplit('.', 1)[1]} file yet")
    data = SAMPLES[name]()
    r = send(live, name, data)
    assert r.status_code == 200, r.text
    got = download(live, r.json()["translatedFileUrl"])
    assert got.status_code == 200
    assert contents(got.content) == contents(translate_document(data, translator, format_of(name)))
    assert got.content != data  # its text was translated
    stem, ext = name.rsplit(".", 1)
    assert got.headers["content-disposition"] == f'attachment; filename="{stem}_fr.{ext}"'
