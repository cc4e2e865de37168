"""``qkv translate`` as a tool, on a trained model: a sentence's translation never depends on
the file around it, n-best blank lines, --src/--output, line by line at a terminal, progress."""

from __future__ import annotations

import io
import math

import pytest

from qkv.cli import main
from qkv.inference import default_output_len
from qkv.translate import Translator

#: mixed lengths (one to a dozen words), a blank line, repeats; the long ones make an
#: undertrained model run to its length limit, which used to follow the batch's longest source
LINES = [
    "go .",
    "i lost the game and we are all very sad today because of the rain .",
    "he's calm .",
    "",
    "i'm home .",
    "we are all very tired and the children want to go home now .",
    "stop !",
    "she is a good friend of my brother and my sister .",
    "who are you ?",
    "i lost .",
    "run !",
    "they are waiting for us at the station with their friends .",
    "go .",
    "i am very happy to see you again after all these years .",
]


def cli_lines(capsys, *args: str) -> list[str]:
    assert main(["translate", *args]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
@pytest.mark.parametrize("beam", ["1", "3"])
def test_every_line_of_a_file_translates_as_it_does_alone(trained, kind, beam, tmp_path, capsys):
    src = tmp_path / "en.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    # nothing blocked: the undertrained Bahdanau model loops until its length limit, so the
    # limit decides these translations (the Transformer stops at once)
    model = ["--model-dir", str(trained[kind]), "--beam", beam, "--no-repeat-ngram", "0"]
    # a small token budget too: other batches, other neighbours, the same translations
    whole = cli_lines(capsys, *model, "--src", str(src))
    small = cli_lines(capsys, *model, "--src", str(src), "--batch-tokens", "40")
    alone = [cli_lines(capsys, *model, "--", line) for line in LINES]
    assert len(whole) == len(LINES) and all(len(a) == 1 for a in alone)
    assert whole == [a[0] for a in alone] == small
    assert whole[3] == ""  # the blank line
    if kind == "bahdanau":  # the test reaches what it tests: translations cut at their limit
        tr = Translator.load(trained[kind])
        cut = [
            len(tr.tgt_tokenizer.encode(out)) >= default_output_len(len(tr.encode(line))) - 1
            for line, out in zip(LINES, whole)
            if line
        ]
        assert sum(cut) >= len(cut) // 2


def test_n_best_gives_every_line_the_same_shape(trained, capsys, monkeypatch):
    d = str(trained["transformer"])
    monkeypatch.setattr("sys.stdin", io.StringIO("go .\n\n   \ni lost .\n"))
    rows = [r.split("\t") for r in cli_lines(capsys, "--model-dir", d, "--n-best", "3")]
    assert [r[0] for r in rows] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    for i, blank in ((1, ""), (2, "   ")):  # nothing (its spaces kept), with certainty
        assert rows[3 * i : 3 * i + 3] == [[str(i), "0.0000", blank]] + [[str(i), "-inf", ""]] * 2
    for i in (0, 3):
        scores = [float(r[1]) for r in rows[3 * i : 3 * i + 3]]
        assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)
    tr = Translator.load(d)
    assert tr.translate(["", "go ."], beam_size=2, n_best=2)[0] == [("", 0.0), ("", -math.inf)]


def test_src_and_output_file(trained, tmp_path, capsys):
    d = str(trained["transformer"])
    src, out = tmp_path / "en.txt", tmp_path / "fr.txt"
    src.write_text("go .\n\ni lost .\n", encoding="utf-8")
    out.write_text("my old translations\n")
    assert cli_lines(capsys, "--model-dir", d, "--src", str(src), "--output", str(out)) == []
    want = cli_lines(capsys, "--model-dir", d, "go .", "", "i lost .")
    assert out.read_text(encoding="utf-8").splitlines() == want
    assert {p.name for p in tmp_path.iterdir()} == {"en.txt", "fr.txt"}  # no temporary left


@pytest.mark.parametrize("n_best", [1, 2])
def test_a_file_is_shown_once_not_once_per_line(trained, tmp_path, capsys, monkeypatch, n_best):
    """Every sentence of a file is turned into text once: writing line k of the file never
    detokenizes the whole file again (1,000 lines took 12 s that way, the decoding 1 s)."""
    from qkv.inference.engine import TranslatorBase

    shown = []
    for name in ("shown", "shown_n_best"):
        real = getattr(TranslatorBase, name)
        monkeypatch.setattr(
            TranslatorBase,
            name,
            lambda self, segs, *a, _r=real: shown.append(len(segs)) or _r(self, segs, *a),
        )
    src = tmp_path / "en.txt"
    src.write_text("".join(f"{line}\n" for line in LINES * 3), encoding="utf-8")
    args = ["--model-dir", str(trained["transformer"]), "--src", str(src), "--n-best", str(n_best)]
    rows = cli_lines(capsys, *args)
    assert len(rows) == 3 * len(LINES) * n_best
    assert shown == [len({line for line in LINES if line})]  # once, each sentence once


def test_a_failed_translation_leaves_output_as_it_was(trained, tmp_path, capsys, monkeypatch):
    d = str(trained["transformer"])
    src, out = tmp_path / "en.txt", tmp_path / "fr.txt"
    src.write_text("go .\ni lost .\n", encoding="utf-8")
    out.write_text("my old translations\n")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("qkv.translate.Translator.attention", broken)
    args = ["--model-dir", d, "--src", str(src), "--output", str(out)]
    assert main(["translate", *args, "--attention", str(tmp_path / "a.html")]) == 1
    assert "qkv translate: error: disk full" in capsys.readouterr().err
    assert out.read_text() == "my old translations\n"
    assert {p.name for p in tmp_path.iterdir()} == {"en.txt", "fr.txt"}


class _Terminal(io.StringIO):
    """stdin typed at a terminal: before giving the next line, checks that the previous one's
    translation is already on stdout."""

    def __init__(self, lines: list[str], capsys) -> None:
        super().__init__("".join(f"{t}\n" for t in lines))
        self.capsys, self.seen, self.given = capsys, [], 0

    def isatty(self) -> bool:
        return True

    def readline(self, *a) -> str:
        if self.given:
            out = self.capsys.readouterr().out
            self.seen.append(out)
        self.given += 1
        return super().readline(*a)


def test_a_terminal_gets_each_translation_as_its_line_is_entered(trained, capsys, monkeypatch):
    d = str(trained["transformer"])
    tr = Translator.load(d)
    lines = ["go .", "", "he's calm ."]
    term = _Terminal(lines, capsys)
    monkeypatch.setattr("sys.stdin", term)
    assert main(["translate", "--model-dir", d]) == 0
    assert term.seen == [tr.translate(t) + "\n" for t in lines]


class _TtyErr(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_goes_to_a_terminal_stderr_only(trained, tmp_path, capsys, monkeypatch):
    d = str(trained["transformer"])
    src = tmp_path / "en.txt"
    # 80 distinct sentences (a repeated one is decoded once, and counted once)
    src.write_text("".join(" ".join(["go"] * k) + " .\n" for k in range(1, 81)), encoding="utf-8")
    clock = iter(range(0, 10_000, 1))  # a second per call: every batch draws
    monkeypatch.setattr("qkv.cli.translate.time.monotonic", lambda: float(next(clock)))
    err = _TtyErr()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["translate", "--model-dir", d, "--src", str(src), "--batch-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 80  # stdout holds translations only
    text = err.getvalue()
    assert "\rtranslated " in text and "80/80 sentences" in text and "sentences/s" in text
    assert text.endswith("\r\x1b[K")  # the line is cleared at the end
    err.truncate(0)
    assert main(["translate", "--model-dir", d, "--src", str(src), "--quiet"]) == 0
    assert "translated" not in err.getvalue()
