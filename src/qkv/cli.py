"""The ``qkv`` command: ``train``, ``translate``, ``evaluate``, ``average``, ``export``, ``serve``
and ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import __version__
from ._deps import MissingDependency, require

log = logging.getLogger(__name__)

# flag -> (TrainConfig key, type, help): the flags of `qkv train` (all default to "not given");
# each help ends with the key's TrainConfig default, read from the dataclass by _train_help
_TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--data": ("data", str, "parallel text in any qkv.data format"),
    "--format": ("data_format", str, "the data file's format"),
    "--src-column": (
        "src_column",
        str,
        "the source column of a tsv/csv file with a header row, or a jsonl field",
    ),
    "--tgt-column": (
        "tgt_column",
        str,
        "the target column of a tsv/csv file with a header row, or a jsonl field",
    ),
    "--max-skipped": (
        "max_skipped",
        float,
        "refuse a data file whose unreadable lines (blank ones aside) exceed this fraction",
    ),
    "--model": ("model", str, "transformer or bahdanau"),
    "--preset": ("preset", str, "auto, none, or a tier name (docs/train.md)"),
    "--max-steps": ("max_steps", int, "the most optimizer updates"),
    "--max-minutes": (
        "max_minutes",
        float,
        "the run's time budget (across --resume): training, evaluations and the final "
        "averaging fit in it",
    ),
    "--seed": ("seed", int, "seed of the weights, dropout and batch order"),
    "--max-tokens": ("max_tokens", int, "token budget of one micro-batch per process"),
    "--accum-steps": ("accum_steps", int, "micro-batches per update (gradient accumulation)"),
    "--lr": ("lr", float, "peak learning rate"),
    "--warmup-steps": ("warmup_steps", int, "linear warm-up updates"),
    "--schedule": ("schedule", str, "auto, linear, cosine or inverse_sqrt"),
    "--label-smoothing": ("label_smoothing", float, "label smoothing epsilon"),
    "--clip-norm": ("clip_norm", float, "gradient-norm clipping, 0 for none"),
    "--eval-every": ("eval_every", int, "validation loss and BLEU every N updates"),
    "--save-every": ("save_every", int, "checkpoint every N updates"),
    "--keep-last": ("keep_last", int, "checkpoints kept besides the best"),
    "--patience": ("patience", int, "early stopping: evaluations without a better BLEU (0: off)"),
    "--log-every": ("log_every", int, "progress line every N updates"),
    "--device": ("device", str, "auto, cpu, cuda, cuda:N"),
    "--threads": ("threads", int, "CPU threads for torch (0: torch's default)"),
}

#: what a TrainConfig default of None or "auto" stands for, shown after it in --help (the
#: numbers in braces are filled in from the library by train_flag_default)
_AUTO_MEANS: dict[str, str] = {
    "data": "the bundled corpus",
    "data_format": "guessed from the file",
    "src_column": "src or source",
    "tgt_column": "tgt or target",
    "preset": "from the corpus, budget and device",
    "max_steps": "{max_steps}; with --max-minutes, no limit but the clock",
    "max_minutes": "no time limit",
    "max_tokens": "the preset's",
    "lr": "the preset's",
    "warmup_steps": "{warmup:.0%} of the planned run",
    "schedule": "linear decay to the end of the run",
    "eval_every": "about {evals} per run",
    "save_every": "about {saves} per run",
    "device": "CUDA when available, else the CPU",
}


def train_flag_default(key: str) -> str:
    """How ``qkv train --help`` shows the default of TrainConfig field ``key``: its value, and
    for None or ``"auto"`` what that stands for."""
    from .train import TrainConfig
    from .train.config import DEFAULT_MAX_STEPS
    from .train.loop import _Plan

    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}[key]
    if default is not None and default != "auto":
        return str(default)
    means = _AUTO_MEANS[key].format(
        max_steps=DEFAULT_MAX_STEPS,
        warmup=_Plan.WARMUP_FRACTION,
        evals=_Plan.EVALS,
        saves=_Plan.SAVES,
    )
    return means if default is None else f"auto: {means}"


def _train_help(key: str, text: str) -> str:
    return f"{text} (default: {train_flag_default(key)})".replace("%", "%%")


def _user_errors(*extra: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What a command reports as one line: bad input, a missing file or package, a damaged
    checkpoint, a full disk, and ``extra`` (imported when a command runs, not for ``--help``)."""
    from .inference import CheckpointError
    from .inference.writing import NoSpaceError

    base = (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError, NoSpaceError)
    return (*base, *extra)


def _fail(command: str, err: BaseException) -> int:
    print(f"qkv {command}: error: {err}", file=sys.stderr)
    return 1 if not isinstance(err, (ValueError, TypeError, FileNotFoundError)) else 2


# ---------------------------------------------------------------------------- train
_MODEL_KINDS = ("transformer", "bahdanau")  # == qkv.nn.seq2seq.MODEL_KINDS (tested)


def _resume_from(text: str | None) -> int | str | None:
    """``--resume-from``: an update number (digits) or a checkpoint folder."""
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def _train_config(args: argparse.Namespace) -> tuple[Any, bool]:
    from .train import TrainConfig, load_config_file, parse_assignment
    from .train.checkpoint import resumed_settings

    changes: dict[str, Any] = {}
    if getattr(args, "config", None):
        changes.update(load_config_file(args.config))
    flags: dict[str, Any] = {}
    for flag, (key, _, _) in _TRAIN_FLAGS.items():
        dest = flag[2:].replace("-", "_")
        if hasattr(args, dest):
            flags[key] = getattr(args, dest)
    for name in ("bf16", "tensorboard"):
        if getattr(args, name, False):
            flags[name] = True
    if args.strict:
        if hasattr(args, "max_skipped"):
            raise ValueError(
                f"--strict: refuses any unreadable line, which --max-skipped "
                f"{args.max_skipped:g} contradicts; give one of them"
            )
        flags["max_skipped"] = 0.0
    for text in getattr(args, "set", None) or []:
        key, value = parse_assignment(text)
        flags[key] = value
    out = Path(args.out)
    resume_from = _resume_from(args.resume_from)
    resume = args.resume or resume_from is not None
    if resume:
        saved = resumed_settings(out / "checkpoints", resume_from)
        if saved is not None:
            base = TrainConfig.from_dict(saved)
            return base.updated({**changes, **flags}), True
    return TrainConfig().updated({**changes, **flags}), resume


def _as_flag(err: BaseException, args: argparse.Namespace) -> BaseException:
    """``err`` with a leading ``key:`` of the library named as the ``qkv train`` flag that
    gave it (``--data``, not ``data``), when the user gave it by that flag."""
    key, sep, rest = str(err).partition(": ")
    flags = {k: flag for flag, (k, _, _) in _TRAIN_FLAGS.items()}
    more = {"resume_from": "--resume-from", "init_from": "--init-from", "out": "--out"}
    flag = {**flags, **more}.get(key)
    if not sep or flag is None or getattr(args, flag[2:].replace("-", "_"), None) is None:
        return err
    return type(err)(f"{flag}: {rest}")


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import RunLockedError, TrainingError, TrainingInterrupted, train

    try:
        if args.init_from is not None and args.resume:
            raise ValueError(
                "init_from: --resume continues the run's own checkpoint; starting from another "
                "model's weights is a new run (drop --resume, or --init-from)"
            )
        config, resume = _train_config(args)
        result = train(
            config,
            args.out,
            resume=resume,
            resume_from=_resume_from(args.resume_from),
            init_from=args.init_from,
            progress=not args.quiet,
        )
    except _user_errors(RunLockedError) as e:
        return _fail("train", _as_flag(e, args))
    except TrainingError as e:
        print(f"qkv train: stopped: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:  # its line (how to resume) was logged
        return e.exit_status
    except KeyboardInterrupt:
        print("qkv train: interrupted; resume with --resume", file=sys.stderr)
        return 130
    if result.final_model is not None:
        how = "greedy" if result.decoding is None else result.decoding.describe()
        bleu = "?" if result.final_bleu is None else f"{result.final_bleu:.2f}"
        print(f"model: {result.final_model} (valid BLEU {bleu}, {how})")
    elif result.best_checkpoint is not None:
        print(f"best checkpoint: {result.best_checkpoint} (valid BLEU {result.best_bleu:.2f})")
    return 0


# ---------------------------------------------------------------------------- translate
def _check_positive(args: argparse.Namespace, *names: str) -> None:
    """ValueError naming the flag when one of ``names`` is given and below 1."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected >= 1, got {value}")


#: the figure formats of --attention (matplotlib) and the viewer's (no extra package)
_FIGURES, _PAGES = (".png", ".svg", ".pdf"), (".html", ".htm")


def _check_file_to_write(flag: str, path: str | Path) -> Path:
    """``path`` as a file this command may write, or a one-line ValueError naming ``flag``: not
    a folder, not under a file, in a folder that exists (nothing is created silently)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag}: {str(p)!r} is a folder; expected a file name")
    for folder in (p.parent, *p.parent.parents):
        if folder.exists():
            break
    if not folder.is_dir():
        raise ValueError(f"{flag}: {str(folder)!r} is a file, not a folder (in {str(p)!r})")
    if folder != p.parent:
        raise ValueError(f"{flag}: the folder {str(p.parent)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: cannot write in the folder {str(folder)!r}")
    return p


def _attention_path(base: Path, i: int, n: int | None) -> Path:
    """Sentence ``i``'s attention file: ``base`` itself for one sentence, else numbered
    (``n=None``: line by line, the count is not known)."""
    return base if n == 1 else base.with_name(f"{base.stem}-{i + 1}{base.suffix}")


def _check_translate_args(args: argparse.Namespace) -> None:
    """Every flag of ``qkv translate`` checked before the model is loaded."""
    _check_positive(args, "beam", "n_best", "max_len", "batch_tokens")
    if args.beam is not None and args.n_best > args.beam:
        raise ValueError(f"--n-best: expected at most --beam ({args.beam}), got {args.n_best}")
    if args.attention is not None:
        if Path(args.attention).suffix.lower() not in _FIGURES + _PAGES:
            raise ValueError(
                f"--attention: expected a file ending in .png, .svg, .pdf or .html, got "
                f"{args.attention!r}"
            )
        _check_file_to_write("--attention", args.attention)
    if args.src is not None:
        if args.text:
            raise ValueError("--src: give sentences as arguments or in --src FILE, not both")
        if not Path(args.src).is_file():
            raise FileNotFoundError(f"--src: no such file {args.src!r}")
    if args.output is not None:
        out = _check_file_to_write("--output", args.output)
        if args.src is not None and (
            out.resolve() == Path(args.src).resolve()
            or (out.exists() and os.path.samefile(out, args.src))
        ):
            raise ValueError(
                f"--output: {args.output!r} is the --src file; the translations would "
                "overwrite their sources (choose another file)"
            )


def _read_lines(stream: TextIO, what: str) -> list[str]:
    try:
        return [line.rstrip("\r\n") for line in stream]
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: expected UTF-8 text, got {e.reason} at byte {e.start}") from None


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """Where translations go: stdout, or ``path`` written atomically (a temporary file in its
    folder, renamed over it when every line is written; removed on an error)."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _Progress:
    """``translated K/N sentences (R sentences/s)`` on stderr, redrawn at most twice a second
    and only once a file has taken half a second (a terminal only; cleared at the end)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.t0 = self.last = time.monotonic()
        self.drawn = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last, self.drawn = now, True
        rate = done / max(now - self.t0, 1e-9)
        sys.stderr.write(
            f"\rtranslated {done}/{self.total} sentences ({rate:.1f} sentences/s)\x1b[K"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


#: the decoding flags of translate, evaluate and serve named otherwise than the Decoding option
#: they set (``--length-penalty`` sets ``length_penalty``, and so on for the others)
_DECODING_RENAMED = {"beam": "beam_size", "max_len": "max_output_len", "batch_tokens": "max_tokens"}


def _with_flags(tr: Any, args: argparse.Namespace) -> Any:
    """``tr`` with the decoding flags given over its model's decoding (a flag not given, None,
    keeps the model's); an option out of range is named by its flag."""
    from ._errors import SettingError
    from .inference import Decoding

    options = {f.name: f.name for f in dataclasses.fields(Decoding)} | _DECODING_RENAMED
    given = {key: getattr(args, dest) for dest, key in options.items() if hasattr(args, dest)}
    try:
        return tr.with_decoding(**given)
    except SettingError as e:
        flag = {key: dest for dest, key in options.items()}.get(e.key, e.key)
        raise e.renamed(f"--{flag.replace('_', '-')}") from None


def _load_translator(args: argparse.Namespace) -> Any:
    """The translator of ``--model-dir`` (``--engine``, ``--quantize``, ``--device``): a
    :class:`qkv.inference.TextTranslator`, its decoding the model's changed by the flags."""
    if args.engine == "ctranslate2":
        if getattr(args, "attention", None) is not None:
            raise ValueError("--attention: needs --engine qkv (CTranslate2 returns no weights)")
        require("--engine ctranslate2", ["ctranslate2"])
        import torch

        from .export.ctranslate2 import Ct2Translator

        try:
            tr: Any = Ct2Translator(
                args.model_dir,
                device=args.device,
                compute_type=args.quantize or "default",
                threads=torch.get_num_threads(),
            )
        except ValueError as e:
            if str(e).startswith("device: "):
                raise ValueError(f"--device: --engine ctranslate2 {str(e)[8:]}") from None
            raise
    else:
        from .translate import Translator

        if args.quantize is not None and args.device != "cpu":
            raise ValueError(
                f"--quantize: {args.quantize} runs on the CPU only (torch's dynamic "
                f"quantization), got --device {args.device}"
            )
        tr = Translator.load(args.model_dir, device=args.device, quantize=args.quantize)
    return _with_flags(tr, args)


def _cmd_translate(args: argparse.Namespace) -> int:
    from .inference import CheckpointError

    try:
        _check_translate_args(args)
        attention = None if args.attention is None else Path(args.attention)
        interactive = not args.text and args.src is None and sys.stdin.isatty()
        texts: list[str] = []
        if args.text:
            texts = list(args.text)
        elif args.src is not None:
            with open(args.src, encoding="utf-8") as f:
                texts = _read_lines(f, "--src")
        elif not interactive:  # a pipe or a file: read it all, then translate in batches
            texts = _read_lines(sys.stdin, "stdin")
        if attention is not None:
            for i in range(len(texts)):
                _check_file_to_write("--attention", _attention_path(attention, i, len(texts)))
        tr = _load_translator(args)  # its decoding: the model's, changed by the flags
        dec = tr.tgt_tokenizer.decode

        def emit(f: TextIO, i: int, text: str, r: Any, n: int | None) -> None:
            if args.n_best == 1:
                f.write(dec(r) + "\n")
            else:
                for ids, score in r:
                    f.write(f"{i}\t{float(score):.4f}\t{dec(ids)}\n")
            if attention is not None:  # of the very translation printed (best of the n-best)
                best = r if args.n_best == 1 else r[0][0]
                try:
                    path = tr.attention(text, ids=best).save(_attention_path(attention, i, n))
                except ValueError as e:  # the viewer's bound: a page too big to open
                    if not str(e).startswith("kinds: "):
                        raise
                    raise ValueError(f"--attention: {str(e)[len('kinds: ') :]}") from None
                log.info("attention of %r -> %s", text, path)

        if not interactive:
            progress = _Progress(len(texts), sys.stderr.isatty() and not args.quiet)
            try:
                res = tr.generate(texts, progress=progress)
            finally:
                progress.close()
            with _output(args.output) as f:
                for i, (text, r) in enumerate(zip(texts, res)):
                    emit(f, i, text, r, len(texts))
        else:  # a terminal: each line translated as it is entered
            with _output(args.output) as f:
                for i, line in enumerate(iter(sys.stdin.readline, "")):
                    text = line.rstrip("\r\n")
                    emit(f, i, text, tr.generate([text])[0], None)
                    f.flush()
    except (ValueError, TypeError, OSError, CheckpointError, ImportError) as e:
        return _fail("translate", e)  # OSError: reading --src, writing --output or a figure
    except KeyboardInterrupt:  # Ctrl-C ends a terminal session; --output is left as it was
        return 130
    return 0


# ---------------------------------------------------------------------------- evaluate
#: read_pairs' argument names -> the flags of qkv evaluate that give them
_READ_FLAGS = {
    "path": "--data",
    "format": "--format",
    "src_column": "--src-column",
    "tgt_column": "--tgt-column",
}


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .data import read_pairs
    from .inference import verify_checkpoint
    from .train import saved_run_pairs

    try:
        _check_positive(args, "beam", "batch_tokens")
        tr = _load_translator(args)
        if args.data is not None:
            try:
                pairs, report = read_pairs(
                    args.data, args.format, src_column=args.src_column, tgt_column=args.tgt_column
                )
            except (ValueError, TypeError, FileNotFoundError) as err:  # named as the flags
                key, _, rest = str(err).partition(": ")
                flag = _READ_FLAGS.get(key)
                raise (type(err)(f"{flag}: {rest}") if flag else err) from None
            if report.n_skipped:
                log.warning("%s", report)
            what = args.data
        else:
            if "split.json" not in verify_checkpoint(tr.path, files=[])["files"]:
                raise ValueError(
                    f"--data: {str(tr.path)!r} is an exported model (it keeps no record of "
                    "the data it was trained on, so there is no test split to score): give "
                    "the parallel text to score with --data FILE"
                )
            pairs, what = saved_run_pairs(tr.path, args.split)
            if not pairs:
                raise ValueError(f"--split: the run's {args.split} split is empty")
        if args.limit is not None:
            if args.limit < 1:
                raise ValueError(f"--limit: expected a number of pairs >= 1, got {args.limit}")
            pairs = pairs[: args.limit]
        ev = tr.evaluate(pairs, normalize_references=args.normalized_refs)
        beam, lp = tr.decoding.beam_size, tr.decoding.length_penalty
    except _user_errors() as e:
        return _fail("evaluate", e)
    if args.json:
        print(
            json.dumps(
                {
                    **ev.to_dict(),
                    "data": str(what),
                    "model": str(tr.path),
                    "beam": beam,
                    "length_penalty": lp,
                }
            )
        )
    else:
        print(f"{ev.n} sentences from {what}, model {tr.path}, " + tr.decoding.describe())
        if ev.references_normalized:
            print(
                "NOTE: references normalised as the training data (--normalized-refs): not "
                "comparable with sacreBLEU scores on raw text"
            )
        print(f"BLEU = {ev.bleu:.2f}   ({ev.bleu_detail})")
        print(f"  signature: {ev.signatures['bleu']}")
        print(f"chrF = {ev.chrf:.2f}")
        print(f"  signature: {ev.signatures['chrf']}")
    return 0


# ---------------------------------------------------------------------------- average
def _cmd_average(args: argparse.Namespace) -> int:
    from .train import CheckpointError
    from .train.checkpoint import average_checkpoints, find_checkpoints

    try:
        _check_positive(args, "last")
        if args.checkpoints:
            folders = [Path(c) for c in args.checkpoints]
        else:
            if args.model_dir is None:
                raise ValueError("--model-dir: expected a run folder (or give checkpoint folders)")
            root = Path(args.model_dir)
            root = root / "checkpoints" if (root / "checkpoints").is_dir() else root
            found = find_checkpoints(root)
            if not found:
                raise CheckpointError(f"--model-dir: no checkpoints in {str(root)!r}")
            folders = found[-args.last :]
        path = average_checkpoints(folders, args.out)
    except _user_errors() as e:
        return _fail("average", e)
    print(f"averaged {len(folders)} checkpoints ({', '.join(f.name for f in folders)}) -> {path}")
    return 0


# ---------------------------------------------------------------------------- export
def _cmd_export(args: argparse.Namespace) -> int:
    from .inference import load_model

    try:
        if args.quantize is not None and args.format != "ctranslate2":
            raise ValueError(
                f"--quantize: only for --format ctranslate2 (got --format {args.format})"
            )
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out: {str(out)!r} is a file; expected a folder to write")
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise ValueError(
                f"--out: {str(out)!r} exists and is not empty; choose a new folder, or pass "
                "--force to replace a model folder exported before"
            )
        saved = load_model(args.model_dir)
        if args.format == "ctranslate2":
            from .export.ctranslate2 import export_ctranslate2

            path = export_ctranslate2(saved, out, quantize=args.quantize, force=args.force)
        elif args.format == "onnx":
            from .export.onnx import export_onnx

            path = export_onnx(saved, out)
        else:
            from .export import export_model

            path = export_model(saved, out, force=args.force)
    except _user_errors() as e:
        return _fail("export", _as_flag(e, args))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {saved.path} ({args.format}) -> {path} ({size / 1e6:.1f} MB)")
    return 0


# ---------------------------------------------------------------------------- serve
#: `qkv serve` flag -> ServeConfig field (the flags whose errors the library names by field)
_SERVE_FIELDS = (
    "source_lang",
    "target_lang",
    "beam",
    "max_batch_tokens",
    "max_wait_ms",
    "max_body_bytes",
    "max_sentences",
    "max_chars",
    "max_alternatives",
    "max_beam",
    "max_queue",
    "max_attention_cells",
)


def _serve_flag(err: BaseException) -> BaseException:
    """``err``, a setting of ServeConfig (or the address) named by its ``qkv serve`` flag."""
    from ._errors import SettingError

    if isinstance(err, SettingError) and err.key in (*_SERVE_FIELDS, "host", "port"):
        return err.renamed(f"--{err.key.replace('_', '-')}")
    return err


def _cmd_serve(args: argparse.Namespace) -> int:
    from .serve import ServeConfig, create_app
    from .serve.server import bind, run

    api_key = args.api_key if args.api_key is not None else os.environ.get("QKV_SERVE_API_KEY")
    try:
        if api_key is not None and not api_key:
            raise ValueError("--api-key: expected a non-empty key")
        cfg = ServeConfig(
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            beam=args.beam,
            api_key=api_key,
            batching=not args.no_batching,
            max_batch_tokens=args.max_batch_tokens,
            max_wait_ms=args.max_wait_ms,
            max_body_bytes=args.max_body_bytes,
            max_sentences=args.max_sentences,
            max_chars=args.max_chars,
            max_alternatives=args.max_alternatives,
            max_beam=args.max_beam,
            max_queue=args.max_queue,
            model_dir=str(args.model_dir),
            **(
                {}
                if args.max_attention_cells is None
                else {"max_attention_cells": args.max_attention_cells}
            ),
        )
        if args.threads < 0:
            raise ValueError(f"--threads: expected >= 0, got {args.threads}")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        tr = _load_translator(args)
        app = create_app(tr, cfg)
        sock = bind(args.host, args.port)
    except _user_errors() as e:
        return _fail("serve", _serve_flag(e))
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    st = app.state.qkv
    if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s with no --api-key: anyone who reaches it can use it", args.host)

    def ready() -> None:
        batching = (
            f"batching up to {cfg.max_batch_tokens} tokens, {cfg.max_wait_ms:g} ms wait"
            if cfg.batching
            else "batching off"
        )
        print(
            f"qkv serve: {tr.path} ({st.source} -> {st.target}, beam {st.beam}, {batching}) "
            f"on {url}",
            file=sys.stderr,
            flush=True,
        )

    started = run(
        app,
        sock,
        log_level="warning" if args.quiet else "info",
        access_log=args.access_log,
        shutdown_timeout=args.shutdown_timeout,
        on_ready=ready,
    )
    if not started:
        print("qkv serve: error: the server did not start (see above)", file=sys.stderr)
        return 1
    print("qkv serve: stopped", file=sys.stderr, flush=True)
    return 0


# ---------------------------------------------------------------------------- demo
def _cmd_demo(args: argparse.Namespace) -> int:
    from . import demos

    registry = demos.load()
    if args.list:
        for d in sorted(registry.values(), key=lambda d: d.name):
            mark = " (default)" if d.name == demos.DEFAULT else ""
            print(f"{d.name:>20}  {d.help}{mark}")
        return 0
    name = args.name or demos.DEFAULT
    if name not in registry:
        print(
            f"qkv demo: unknown demo {name!r}; choose one of: {', '.join(sorted(registry))}",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    return int(registry[name].run(out, args.quick) or 0)


# ---------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv", description="Attention mechanisms and the Transformer on PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"qkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    tr = sub.add_parser(
        "train",
        help="train a translation model (also under torchrun for several processes)",
        description="Train a Transformer or Bahdanau translator. Settings: defaults < --config "
        "FILE < flags < --set KEY=VALUE. Under `torchrun --nproc_per_node N` it trains with "
        "DistributedDataParallel.",
    )
    S = argparse.SUPPRESS
    tr.add_argument("--config", metavar="FILE", help="a YAML or TOML file of settings")
    tr.add_argument("--out", default="runs/qkv", help="run folder (default: runs/qkv)")
    tr.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest intact checkpoint",
    )
    tr.add_argument(
        "--resume-from",
        metavar="PATH|STEP",
        help="continue the run in --out from this checkpoint (a folder of OUT/checkpoints, or "
        "its update number); implies --resume",
    )
    tr.add_argument(
        "--init-from",
        metavar="DIR",
        help="start a new run (update 0) from the weights of a saved model: a run folder, its "
        "final/, or a checkpoint folder; its architecture and tokenizers are kept (fine-tuning)",
    )
    for flag, (key, typ, text) in _TRAIN_FLAGS.items():
        kw: dict[str, Any] = {"type": typ, "default": S, "help": _train_help(key, text)}
        if flag == "--model":  # qkv.nn.seq2seq.MODEL_KINDS, without importing torch for --help
            kw["choices"] = _MODEL_KINDS
        tr.add_argument(flag, **kw)
    tr.add_argument(
        "--strict", action="store_true", help="refuse a data file with any unreadable line"
    )
    tr.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    tr.add_argument(
        "--tensorboard", action="store_true", help="TensorBoard logs in OUT/tensorboard"
    )
    tr.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any setting, e.g. --set model.num_hiddens=128 (repeatable)",
    )
    tr.add_argument("--quiet", action="store_true", help="no progress output")
    tr.set_defaults(func=_cmd_train)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model-dir",
            required=True,
            help="a qkv train --out folder (its final model, else its best checkpoint) or a "
            "checkpoint or model folder",
        )
        p.add_argument(
            "--beam",
            type=int,
            default=None,
            help="beam size (default: the model's, chosen on validation by qkv train; else 1)",
        )
        p.add_argument(
            "--length-penalty",
            type=float,
            default=None,
            help="beam length penalty (default: the model's, else 1.0)",
        )
        p.add_argument(
            "--no-repeat-ngram",
            type=int,
            default=None,
            metavar="N",
            help="never repeat an N-gram of pieces in a translation (0: off; default: the "
            "model's, 3 for a qkv train run, else 0)",
        )
        p.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, cuda:N")
        p.add_argument(
            "--quantize",
            choices=("int8",),
            default=None,
            help="int8: dynamic int8 linear layers (CPU only; faster, translations may differ "
            "slightly); with --engine ctranslate2: CTranslate2's int8 compute type",
        )
        p.add_argument(
            "--engine",
            choices=("qkv", "ctranslate2"),
            default="qkv",
            help="qkv (default), or ctranslate2: translate through the CTranslate2 model that "
            "qkv export --format ctranslate2 wrote in --model-dir (needs qkv[ct2])",
        )
        p.add_argument(
            "--batch-tokens",
            type=int,
            default=4096,
            metavar="N",
            help="source tokens per batch (times the beam), sentences sorted by length "
            "(default: 4096)",
        )

    t = sub.add_parser(
        "translate",
        help="translate TEXT arguments, a --src file, or stdin lines",
        description="Translate sentences: the arguments, the lines of --src FILE, or the lines "
        "of stdin (typed at a terminal: each line as it is entered; from a pipe or a file: "
        "batched by --batch-tokens). One output line per input line, in order; a sentence's "
        "translation never depends on the others.",
    )
    model_args(t)
    t.add_argument(
        "--n-best",
        type=int,
        default=1,
        metavar="K",
        help="print K lines per input: INDEX<TAB>SCORE<TAB>TRANSLATION, best first (a blank "
        "line: the empty translation scored 0, then K-1 scored -inf)",
    )
    t.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="most tokens per translation (default: 2 * the sentence's own length + 10)",
    )
    t.add_argument("--src", metavar="FILE", help="translate the lines of FILE (UTF-8)")
    t.add_argument(
        "--output",
        metavar="FILE",
        help="write the translations to FILE, replaced at once when all are done "
        "(default: stdout); never the --src file",
    )
    t.add_argument(
        "--attention",
        metavar="FILE",
        help="draw each sentence's attention to FILE (.png, .svg, .pdf or .html; "
        "several inputs or a terminal: FILE-1.png, FILE-2.png, ...); its folder must exist",
    )
    t.add_argument("--quiet", action="store_true", help="warnings only on stderr, no progress")
    t.add_argument("text", nargs="*", help="sentences (default: --src, else stdin lines)")
    t.set_defaults(func=_cmd_translate)

    e = sub.add_parser(
        "evaluate",
        help="sacreBLEU and chrF of a model on parallel text",
        description="Translate the sources and score the detokenised translations against "
        "the raw references with sacreBLEU's BLEU and chrF (signatures printed).",
    )
    model_args(e)
    e.add_argument("--data", help="parallel text (default: the run's own test split)")
    e.add_argument("--format", help="the data file's format (default: guessed)")
    e.add_argument(
        "--src-column",
        metavar="NAME",
        help="with --data: the source column of a tsv/csv header row, or a jsonl field "
        "(default: src or source)",
    )
    e.add_argument(
        "--tgt-column",
        metavar="NAME",
        help="with --data: the target column (default: tgt or target)",
    )
    e.add_argument(
        "--split",
        choices=("test", "valid", "train"),
        default="test",
        help="without --data: which part of the run's data (default: test)",
    )
    e.add_argument("--limit", type=int, default=None, help="score only the first N pairs")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    e.add_argument(
        "--normalized-refs",
        action="store_true",
        help="score against references normalised as the training data (lower-cased for "
        "the book's normaliser); labelled in every output. Default: raw references, "
        "sacreBLEU's convention",
    )
    e.set_defaults(func=_cmd_evaluate)

    av = sub.add_parser(
        "average",
        help="average the weights of a run's last checkpoints into a model folder",
        description="Checkpoint averaging (as fairseq's): the element-wise mean of the weights "
        "of the newest --last checkpoints of --model-dir, or of the checkpoint folders given, "
        "written to --out as a model folder that qkv translate and evaluate accept.",
    )
    av.add_argument("--model-dir", help="a qkv train --out folder (or its checkpoints/)")
    av.add_argument("--last", type=int, default=3, help="how many newest checkpoints (default 3)")
    av.add_argument("--out", required=True, help="the folder to write")
    av.add_argument("checkpoints", nargs="*", help="checkpoint folders (instead of --model-dir)")
    av.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    av.set_defaults(func=_cmd_average)

    ex = sub.add_parser(
        "export",
        help="write a trained model for deployment: inference-only, CTranslate2 or ONNX",
        description="Write a saved model (a qkv train --out folder: its final model, else its "
        "best checkpoint; or a checkpoint folder) to --out: weights, config, tokenizers, its "
        "decoding and a README.md model card, no training state (--format qkv; every qkv "
        "command reads it), plus a CTranslate2 model in OUT/ctranslate2 (--format "
        "ctranslate2, the ct2 extra), or ONNX graphs (--format onnx).",
    )
    ex.add_argument("--model-dir", required=True, help="a qkv train --out folder or a model folder")
    ex.add_argument("--out", required=True, help="the folder to write (new or empty)")
    ex.add_argument(
        "--format",
        choices=("qkv", "ctranslate2", "onnx"),
        default="qkv",
        help="qkv (default): an inference-only model folder; ctranslate2: also a CTranslate2 "
        "model; onnx: the encoder and one decoder step as ONNX graphs",
    )
    ex.add_argument(
        "--quantize",
        choices=("int8", "int8_float32", "float16"),
        default=None,
        help="with --format ctranslate2: the weight type of model.bin (default: float32)",
    )
    ex.add_argument(
        "--force", action="store_true", help="replace a model folder exported to --out before"
    )
    ex.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    ex.set_defaults(func=_cmd_export)

    sv = sub.add_parser(
        "serve",
        help="serve a model over HTTP: a LibreTranslate-compatible API, batching, a page",
        description="Serve a trained model over HTTP (needs qkv[serve]): POST /translate "
        "(LibreTranslate's request shape), POST /attention, GET /languages, /health, /metrics "
        "(Prometheus), /openapi.json, and a page at / that translates and draws the attention. "
        "Concurrent requests are decoded together (dynamic batching). SIGTERM or Ctrl-C "
        "finishes the requests in flight and exits 0. See docs/serve.md.",
    )
    sv.add_argument(
        "--model-dir",
        required=True,
        help="a qkv train --out folder (its final model, else its best checkpoint), a "
        "checkpoint folder, or a qkv export folder",
    )
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free one)")
    sv.add_argument(
        "--beam",
        type=int,
        default=None,
        help="default beam size of a request (default: the model's, chosen on validation by "
        "qkv train; else 1)",
    )
    sv.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="beam length penalty (default: the model's)",
    )
    sv.add_argument(
        "--no-repeat-ngram",
        type=int,
        default=None,
        metavar="N",
        help="never repeat an N-gram in a translation (default: the model's)",
    )
    sv.add_argument(
        "--api-key",
        default=None,
        help="require this key on /translate and /attention (the api_key field, or an "
        "Authorization: Bearer header); default: $QKV_SERVE_API_KEY, else none",
    )
    sv.add_argument(
        "--source-lang",
        default=None,
        metavar="CODE",
        help="the source language code (default: the model's when it records it, e.g. en for "
        "the bundled corpus)",
    )
    sv.add_argument(
        "--target-lang", default=None, metavar="CODE", help="the target language code (same)"
    )
    sv.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, cuda:N")
    sv.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="int8 dynamic quantization (CPU); with --engine ctranslate2: CTranslate2's int8",
    )
    sv.add_argument(
        "--engine",
        choices=("qkv", "ctranslate2"),
        default="qkv",
        help="qkv (default), or ctranslate2: serve the CTranslate2 model that qkv export "
        "--format ctranslate2 wrote in --model-dir (needs qkv[ct2]; no /attention)",
    )
    sv.add_argument(
        "--no-batching",
        action="store_true",
        help="decode each request alone, in arrival order (no dynamic batching)",
    )
    sv.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4096,
        metavar="N",
        help="a batch's budget: source tokens times the beam (default: 4096)",
    )
    sv.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        metavar="MS",
        help="how long a batch waits for more requests after its first (default: 5)",
    )
    sv.add_argument(
        "--max-body-bytes",
        type=int,
        default=1_000_000,
        metavar="N",
        help="largest request body (default: 1000000)",
    )
    sv.add_argument(
        "--max-sentences",
        type=int,
        default=128,
        metavar="N",
        help="most sentences per request (default: 128)",
    )
    sv.add_argument(
        "--max-chars",
        type=int,
        default=2000,
        metavar="N",
        help="most characters per sentence (default: 2000)",
    )
    sv.add_argument(
        "--max-alternatives",
        type=int,
        default=5,
        metavar="K",
        help="most alternatives per request (default: 5)",
    )
    sv.add_argument(
        "--max-beam",
        type=int,
        default=8,
        metavar="N",
        help="widest beam a request may ask (default: 8)",
    )
    sv.add_argument(
        "--max-queue",
        type=int,
        default=4096,
        metavar="N",
        help="most sentences waiting; beyond, requests get 503 (default: 4096)",
    )
    sv.add_argument(
        "--max-attention-cells",
        type=int,
        default=None,
        metavar="N",
        help="most attention weights one /attention answer holds (default: the viewer's cap, "
        "qkv.viz.MAX_CELLS)",
    )
    sv.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="on SIGTERM, how long to wait for requests in flight (default: 60)",
    )
    sv.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="CPU threads torch decodes with (0: torch's default, one per core)",
    )
    sv.add_argument("--access-log", action="store_true", help="log every request")
    sv.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    sv.set_defaults(func=_cmd_serve)

    demo = sub.add_parser("demo", help="run a demo (`qkv demo --list` shows them)")
    demo.add_argument("name", nargs="?", help="which demo (default: the main one)")
    demo.add_argument("--out", default="demo-out", help="folder for figures (default: demo-out)")
    demo.add_argument("--quick", action="store_true", help="a fast, smaller run (for tests)")
    demo.add_argument("--list", action="store_true", help="list the demos and exit")
    demo.add_argument("--quiet", action="store_true", help="warnings only on stderr")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _needs(args: argparse.Namespace) -> list[str]:
    """The optional modules ``args.command`` will import whatever its data (``qkv train``:
    what its flags name; the library checks the rest, e.g. sentencepiece for a new corpus)."""
    if args.command == "train":
        modules = ["safetensors", "sacrebleu"]
        config = str(getattr(args, "config", None) or "").lower()
        if config.endswith((".yaml", ".yml")):
            modules.append("yaml")
        elif config.endswith(".toml") and sys.version_info < (3, 11):
            modules.append("tomli")
        if getattr(args, "tensorboard", False):
            modules.append("tensorboard")
        return modules
    engine = ["ctranslate2"] if getattr(args, "engine", "qkv") == "ctranslate2" else ["safetensors"]
    if args.command == "translate":
        figure = Path(args.attention or "").suffix.lower() in _FIGURES
        return [*engine, *(["matplotlib"] if figure else [])]
    if args.command == "evaluate":
        return [*engine, "sacrebleu"]
    if args.command == "average":
        return ["safetensors"]
    if args.command == "export":
        return ["safetensors", *(["ctranslate2"] if args.format == "ctranslate2" else [])]
    if args.command == "serve":
        return [*engine, "starlette", "uvicorn"]
    return []  # demo: each demo checks its own (qkv.demos.register)


class _CliHandler(logging.StreamHandler):
    """``qkv: message`` on the stderr of the moment (tests swap sys.stderr between calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("qkv: %(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ sets it
        pass


@contextlib.contextmanager
def _logging_to_stderr(quiet: bool) -> Iterator[None]:
    """While ``main`` runs: the library's messages (the ``qkv`` loggers) on stderr, INFO and up
    (``--quiet``: WARNING); the logger is left as it was afterwards."""
    top = logging.getLogger("qkv")
    handler, level = _CliHandler(), top.level
    top.addHandler(handler)
    top.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        top.removeHandler(handler)
        top.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    # OpenMP's wait policy stays libgomp's (threads spin a while, then sleep): PASSIVE sped
    # small-model loops up beside a busy process but slowed decoding down as much when the
    # machine was not that busy (benchmarks/threads.py, docs/train.md); a user's
    # OMP_WAIT_POLICY applies because nothing imported before this point loads torch
    args = build_parser().parse_args(argv)
    with _logging_to_stderr(getattr(args, "quiet", False)):
        try:
            require(f"qkv {args.command}", _needs(args))
            return int(args.func(args) or 0)
        except MissingDependency as e:  # one line, before any work
            print(e, file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
