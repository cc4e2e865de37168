"""Fine-tuning an imported model on a new domain, against the import as it is and against a
from-scratch ``qkv train`` of the same budget (issue 38, item 3).

* **Data**: :mod:`benchmarks.real_corpus`'s English→French gettext catalogs, cut by where they
  come from: domain **A** is the desktop (LibreOffice's and Cinnamon's interfaces, about 19k
  pairs), domain **B** the Python web packages (Django, django-allauth, Wagtail, Sphinx and
  JupyterLab's interface, about 4.7k pairs). B is split by near-duplicate groups (as the
  corpus's own split): 800 test pairs, the rest to train on; A keeps 1,000 test pairs.
* **The foreign model**: a ``MarianMTModel`` trained here on A's training pairs by
  ``transformers``' own code (the Hub is out of reach, so no real OPUS-MT weights): OPUS-MT's
  layout and recipe in small (two SentencePiece unigram models, one ``vocab.json`` with
  ``</s>``=0 and ``<pad>`` last, swish, scaled and tied embeddings, width 128, 3+3 layers,
  label smoothing 0.1, AdamW with Marian's inverse-square-root schedule, the ``<pad>`` row
  kept at zero), saved with ``save_pretrained`` and MarianTokenizer's files, an OPUS-MT
  ``generation_config.json`` (beam 4, ``max_length`` 512, ``<pad>`` a bad word, forced EOS) and
  a card with its licence. Kept in ``WORK/foreign`` with its recipe; reused while that holds.
* **The three systems**, scored on B's test set with sacreBLEU (cased, 13a) by ``qkv
  evaluate`` with each model's own decoding:
  ``import``: ``qkv import WORK/foreign`` as it is (its generation settings: beam 4,
  transformers' end of search); ``fine-tuned``: ``qkv train --init-from IMPORTED --data
  B_train --max-minutes M``; ``scratch``: ``qkv train --data B_train --max-minutes M`` (its
  automatic preset). The budget covers the whole ``qkv train`` of either (validation, the final
  averaging and decoding choice included).

Run the timed part under the quiet lock: ``flock /tmp/quiet.lock python -m benchmarks.finetune
[--pretrain-minutes 15] [--minutes 5] [--threads 2] [--work DIR] [--json P]``. Needs
``transformers`` (``qkv[hf]``) for the foreign model only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import gemm_rate
from benchmarks.real_corpus import pairs_by_source, split_by_groups

A_SOURCES = ("libreoffice-l10n-fr", "cinnamon-l10n")
B_TEST, A_TEST = 800, 1000
SEED = 0
#: the foreign model: OPUS-MT's recipe in small
FOREIGN = {
    "d_model": 128,
    "encoder_layers": 3,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 512,
    "decoder_ffn_dim": 512,
    "activation_function": "swish",
    "scale_embedding": True,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}
SPM_SIZE = 2000  # each side's SentencePiece model
BATCH = 32  # sentences per update
PEAK_LR, WARMUP = 1e-3, 200


# ---------------------------------------------------------------------------- data
def _write_tsv(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")


def domains(work: Path) -> dict[str, Path]:
    """``a_train``, ``a_test``, ``b_train``, ``b_test`` TSV files in ``work``."""
    by_source = pairs_by_source(verbose=False)
    a = [p for name in A_SOURCES for p in by_source[name]]
    b = [p for name, pairs in sorted(by_source.items()) if name not in A_SOURCES for p in pairs]
    a_train, a_test = split_by_groups(a, A_TEST)
    b_train, b_test = split_by_groups(b, B_TEST)
    files = {}
    for name, pairs in (
        ("a_train", a_train),
        ("a_test", a_test),
        ("b_train", b_train),
        ("b_test", b_test),
    ):
        files[name] = work / f"{name}.tsv"
        _write_tsv(files[name], pairs)
    return files


def _read_tsv(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------- the foreign model
def _spm(texts: list[str]) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=SPM_SIZE,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=2,
        minloglevel=2,
    )  # SentencePiece's own nmt_nfkc normalisation, as OPUS-MT's models
    return buf.getvalue()


def _vocab(*models: bytes) -> dict[str, int]:
    """OPUS-MT's ``vocab.json``: ``</s>``=0, ``<unk>``=1, both models' pieces, ``<pad>`` last."""
    import sentencepiece as spm

    vocab = {"</s>": 0, "<unk>": 1}
    for model in models:
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if piece not in ("<s>", "</s>", "<unk>"):
                vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def _batches(tok: Any, pairs: list[tuple[str, str]], rng: random.Random) -> list[list[int]]:
    """Batches of :data:`BATCH` pairs of similar length (sorted within pools of 50 batches)."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    pool = 50 * BATCH
    out = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: len(pairs[i][0]))
        out += [chunk[j : j + BATCH] for j in range(0, len(chunk), BATCH)]
    rng.shuffle(out)
    return out


def train_foreign(files: dict[str, Path], out: Path, minutes: float, threads: int) -> dict:
    """A MarianMTModel trained by transformers on domain A for ``minutes``, saved in
    OPUS-MT's layout in ``out``; returns its recipe and training record."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    torch.manual_seed(SEED)
    torch.set_num_threads(threads)
    pairs = _read_tsv(files["a_train"])
    out.mkdir(parents=True, exist_ok=True)
    src_model, tgt_model = _spm([s for s, _ in pairs]), _spm([t for _, t in pairs])
    (out / "source.spm").write_bytes(src_model)
    (out / "target.spm").write_bytes(tgt_model)
    vocab = _vocab(src_model, tgt_model)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tok = MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
        source_lang="en", target_lang="fr",
    )  # fmt: skip
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=0, **FOREIGN,
    )  # fmt: skip
    model = MarianMTModel(config)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[pad].zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(SEED)
    t0, step, epoch, losses = time.monotonic(), 0, 0, []
    model.train()
    while time.monotonic() - t0 < minutes * 60:
        for batch in _batches(tok, pairs, rng):
            if time.monotonic() - t0 >= minutes * 60:
                break
            enc = tok(
                [pairs[i][0] for i in batch],
                text_target=[pairs[i][1] for i in batch],
                padding=True,
                truncation=True,
                max_length=128,
                return_tensors="pt",
            )
            labels = enc["labels"].masked_fill(enc["labels"] == pad, -100)
            logits = model(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels
            ).logits
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1
            )
            step += 1
            for group in opt.param_groups:  # Marian's schedule: warm-up, then 1/sqrt(step)
                group["lr"] = PEAK_LR * min(step / WARMUP, math.sqrt(WARMUP / step))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():  # Marian has no <pad> embedding: its row stays zero
                emb[pad].zero_()
            losses.append(loss.item())
        epoch += 1
    model.eval()
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=0, max_length=512, num_beams=4, pad_token_id=pad,
    )  # fmt: skip  # OPUS-MT's generation_config.json
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "README.md").write_text(
        "---\nlanguage:\n- en\n- fr\nlicense: other\ntags:\n- translation\n---\n\n"
        "# A small English-French Marian model (qkv's fine-tuning benchmark)\n\n"
        "Trained by transformers on the French translations of LibreOffice (MPL-2.0) and "
        "Cinnamon (GPL-2.0+) interface messages.\n",
        encoding="utf-8",
    )
    import transformers

    return {
        "minutes": minutes,
        "updates": step,
        "epochs": epoch,
        "final_loss": round(sum(losses[-100:]) / max(len(losses[-100:]), 1), 3),
        "pairs": len(pairs),
        "vocab": len(vocab),
        "params": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": FOREIGN,
    }


# ---------------------------------------------------------------------------- the systems
def _qkv(*args: str, threads: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "qkv.cli", *args], capture_output=True,
                          text=True, env=env)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"qkv {args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def evaluate(model: Path, test: Path, threads: int) -> dict:
    """``qkv evaluate --json`` of ``model`` on ``test`` (its own decoding)."""
    t0 = time.monotonic()
    proc = _qkv("evaluate", "--model-dir", str(model), "--data", str(test), "--json",
                threads=threads)  # fmt: skip
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    scores["seconds"] = round(time.monotonic() - t0, 1)
    return scores


def train_run(out: Path, data: Path, minutes: float, threads: int, *extra: str) -> dict:
    """``qkv train`` for ``minutes``: its wall time, updates and log's first and last lines."""
    t0 = time.monotonic()
    proc = _qkv("train", "--data", str(data), "--out", str(out), "--max-minutes", f"{minutes:g}",
                "--threads", str(threads), *extra, threads=threads)  # fmt: skip
    log = [ln for ln in proc.stderr.splitlines() if not ln.startswith("[")]
    m = re.findall(r"stopped \((\w+)\) at update (\d+)", proc.stderr)
    return {
        "wall_minutes": round((time.monotonic() - t0) / 60, 2),
        "updates": int(m[-1][1]) if m else None,
        "log": log[:6] + log[-4:],
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain-minutes", type=float, default=15.0)
    ap.add_argument("--minutes", type=float, default=5.0, help="qkv train's budget, each run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qkv-bench-finetune"))
    ap.add_argument("--json", default="benchmarks/results/finetune.json")
    args = ap.parse_args(argv)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    results["gemm_gflops"] = round(gemm_rate(args.threads), 1)  # fp32, on the run's threads
    files = domains(work)
    results["data"] = {k: len(_read_tsv(v)) for k, v in files.items()}
    foreign = work / "foreign"
    recipe = work / "foreign.json"
    want = {
        "pretrain_minutes": args.pretrain_minutes,
        "a_train": _sha(files["a_train"]),
        "recipe": [FOREIGN, SPM_SIZE, BATCH, PEAK_LR, WARMUP],
    }
    have = json.loads(recipe.read_text()) if recipe.is_file() else {}
    if {k: have.get(k) for k in want} != want or not (foreign / "config.json").is_file():
        print(f"training the foreign Marian model for {args.pretrain_minutes:g} min", flush=True)
        record = train_foreign(files, foreign, args.pretrain_minutes, args.threads)
        recipe.write_text(json.dumps({**want, "record": record}, indent=1) + "\n")
        have = json.loads(recipe.read_text())
    results["foreign"] = have["record"]
    imported = work / "imported"
    t0 = time.monotonic()
    _qkv("import", str(foreign), "--out", str(imported), "--force", threads=args.threads)
    results["import_s"] = round(time.monotonic() - t0, 1)
    systems: dict[str, Any] = {}
    systems["import"] = {"b_test": evaluate(imported, files["b_test"], args.threads)}
    systems["import"]["a_test"] = evaluate(imported, files["a_test"], args.threads)
    print(f"import: B BLEU {systems['import']['b_test']['bleu']}, "
          f"A BLEU {systems['import']['a_test']['bleu']}", flush=True)  # fmt: skip
    for name, extra in (("fine-tuned", ("--init-from", str(imported))), ("scratch", ())):
        out = work / name
        shutil.rmtree(out, ignore_errors=True)  # this benchmark's own run of a previous time
        run = train_run(out, files["b_train"], args.minutes, args.threads, *extra)
        run["b_test"] = evaluate(out, files["b_test"], args.threads)
        systems[name] = run
        print(f"{name}: B BLEU {run['b_test']['bleu']} ({run['updates']} updates)", flush=True)
    results.update(
        systems=systems,
        minutes=args.minutes,
        threads=args.threads,
        load_average_at_end=[round(x, 2) for x in os.getloadavg()],
        command=f"flock /tmp/quiet.lock python -m benchmarks.finetune --pretrain-minutes "
        f"{args.pretrain_minutes:g} --minutes {args.minutes:g} --threads {args.threads}",
    )
    Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    print(f"\nB test ({results['data']['b_test']} pairs), sacreBLEU:")
    for name, r in systems.items():
        print(f"  {name:<11} BLEU {r['b_test']['bleu']:6.2f}  chrF {r['b_test']['chrf']:6.2f}")


if __name__ == "__main__":
    main()
