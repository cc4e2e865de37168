"""The ``qkv`` command: ``train``, ``translate``, ``evaluate`` and ``demo``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__

# flag -> (TrainConfig key, type, help): the flags of `qkv train` (all default to "not given");
# each help ends with the key's TrainConfig default, read from the dataclass by _train_help
_TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--data": ("data", str, "parallel text in any qkv.data format"),
    "--format": ("data_format", str, "the data file's format"),
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
    from .train import CheckpointError, RunLockedError, TrainingError, TrainingInterrupted, train

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
    except (
        ValueError,
        TypeError,
        FileNotFoundError,
        CheckpointError,
        ImportError,
        RunLockedError,
    ) as e:
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
        dec = result.decoding or {}
        how = (
            "greedy"
            if dec.get("beam_size", 1) == 1
            else f"beam {dec['beam_size']}, length penalty {dec['length_penalty']:g}"
        )
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


def _set_no_repeat(tr: Any, args: argparse.Namespace) -> None:
    if args.no_repeat_ngram is not None:
        if args.no_repeat_ngram < 0:
            raise ValueError(f"--no-repeat-ngram: expected >= 0, got {args.no_repeat_ngram}")
        tr.decoding["no_repeat_ngram"] = args.no_repeat_ngram


def _read_inputs(texts: Sequence[str]) -> list[str]:
    if texts:
        return list(texts)
    return [line.rstrip("\r\n") for line in sys.stdin]


def _attention_path(base: Path, i: int, n: int) -> Path:
    return base if n == 1 else base.with_name(f"{base.stem}-{i + 1}{base.suffix}")


def _cmd_translate(args: argparse.Namespace) -> int:
    from .inference import CheckpointError
    from .translate import Translator

    try:
        if args.attention is not None:
            suffix = Path(args.attention).suffix.lower()
            if suffix not in (".png", ".svg", ".pdf", ".html", ".htm"):
                raise ValueError(
                    f"--attention: expected a file ending in .png, .svg, .pdf or .html, got "
                    f"{args.attention!r}"
                )
        _check_positive(args, "beam", "n_best", "max_len")
        if args.beam is not None and args.n_best > args.beam:
            raise ValueError(f"--n-best: expected at most --beam ({args.beam}), got {args.n_best}")
        tr = Translator.load(args.model_dir, device=args.device)
        _set_no_repeat(tr, args)
        beam = args.beam
        if beam is None and args.n_best > tr.resolve_decoding(None, None)[0]:
            beam = args.n_best  # n-best needs a beam at least that wide
        texts = _read_inputs(args.text)
        if not texts:
            return 0
        res = tr.generate(
            texts,
            beam_size=beam,
            n_best=args.n_best,
            length_penalty=args.length_penalty,
            max_len=args.max_len,
        )
        dec = tr.tgt_tokenizer.decode
        for i, r in enumerate(res):
            if args.n_best == 1:
                print(dec(r))
            else:
                for ids, score in r:
                    print(f"{i}\t{float(score):.4f}\t{dec(ids)}")
        sys.stdout.flush()
        if args.attention is not None:
            base = Path(args.attention)
            for i, text in enumerate(texts):
                # the attention of the very translation printed above (best of the n-best)
                best = res[i] if args.n_best == 1 else res[i][0][0]
                att = tr.attention(text, ids=best)
                path = att.save(_attention_path(base, i, len(texts)))
                print(f"attention of {text!r} -> {path}", file=sys.stderr)
    except (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError) as e:
        return _fail("translate", e)
    return 0


# ---------------------------------------------------------------------------- evaluate
def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .data import read_pairs
    from .inference import CheckpointError
    from .train import saved_run_pairs
    from .translate import Translator

    try:
        _check_positive(args, "beam")
        tr = Translator.load(args.model_dir, device=args.device)
        _set_no_repeat(tr, args)
        if args.data is not None:
            pairs, report = read_pairs(args.data, args.format)
            if report.n_skipped:
                print(f"qkv evaluate: {report}", file=sys.stderr)
            what = args.data
        else:
            pairs, what = saved_run_pairs(tr.path, args.split)
            if not pairs:
                raise ValueError(f"--split: the run's {args.split} split is empty")
        if args.limit is not None:
            if args.limit < 1:
                raise ValueError(f"--limit: expected a number of pairs >= 1, got {args.limit}")
            pairs = pairs[: args.limit]
        ev = tr.evaluate(
            pairs,
            beam_size=args.beam,
            length_penalty=args.length_penalty,
            normalize_references=args.normalized_refs,
        )
        beam, lp = tr.resolve_decoding(args.beam, args.length_penalty)
    except (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError) as e:
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
        print(
            f"{ev.n} sentences from {what}, model {tr.path}, "
            + ("greedy" if beam == 1 else f"beam {beam}, length penalty {lp:g}")
        )
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
    except (ValueError, TypeError, FileNotFoundError, CheckpointError, ImportError) as e:
        return _fail("average", e)
    print(f"averaged {len(folders)} checkpoints ({', '.join(f.name for f in folders)}) -> {path}")
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

    t = sub.add_parser(
        "translate", help="translate TEXT arguments, or stdin lines", description="Translate."
    )
    model_args(t)
    t.add_argument("--n-best", type=int, default=1, help="print K translations per input")
    t.add_argument("--max-len", type=int, default=None, help="most tokens per translation")
    t.add_argument(
        "--attention",
        metavar="FILE",
        help="draw each sentence's attention to FILE (.png, .svg, .pdf or .html; "
        "several inputs: FILE-1.png, FILE-2.png, ...)",
    )
    t.add_argument("text", nargs="*", help="sentences (default: read lines from stdin)")
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
        "--split",
        choices=("test", "valid", "train"),
        default="test",
        help="without --data: which part of the run's data (default: test)",
    )
    e.add_argument("--limit", type=int, default=None, help="score only the first N pairs")
    e.add_argument("--json", action="store_true", help="print one JSON object")
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
    av.set_defaults(func=_cmd_average)

    demo = sub.add_parser("demo", help="run a demo (`qkv demo --list` shows them)")
    demo.add_argument("name", nargs="?", help="which demo (default: the main one)")
    demo.add_argument("--out", default="demo-out", help="folder for figures (default: demo-out)")
    demo.add_argument("--quick", action="store_true", help="a fast, smaller run (for tests)")
    demo.add_argument("--list", action="store_true", help="list the demos and exit")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # OpenMP threads that spin slow loops of small ops down several-fold when another process
    # holds a core; libgomp reads the policy when torch loads (nothing above imports it), and
    # the user's own OMP_WAIT_POLICY wins
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
