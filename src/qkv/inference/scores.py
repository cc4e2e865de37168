"""Scoring translations as sacreBLEU scores them: corpus BLEU and chrF, with signatures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._deps import require

__all__ = ["Evaluation", "corpus_scores"]


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
    """

    bleu: float
    chrf: float
    n: int
    signatures: dict[str, str]
    bleu_detail: str = ""
    hypotheses: list[str] = field(default_factory=list, repr=False)
    references: list[str] = field(default_factory=list, repr=False)
    references_normalized: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``bleu``, ``chrf``, ``n``, ``signatures`` and ``bleu_detail`` (JSON-ready)."""
        return {
            "bleu": round(self.bleu, 4),
            "chrf": round(self.chrf, 4),
            "n": self.n,
            "signatures": dict(self.signatures),
            "bleu_detail": self.bleu_detail,
            "references_normalized": self.references_normalized,
        }


def _sacrebleu() -> Any:
    require("scoring", ["sacrebleu"])
    import sacrebleu

    return sacrebleu


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Evaluation:
    """sacreBLEU's corpus BLEU and chrF of ``hypotheses`` against one reference each.

    Raises:
        ValueError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses: expected one per reference ({len(references)}), got {len(hypotheses)}"
        )
    if not hypotheses:
        raise ValueError("hypotheses: expected at least one sentence to score, got none")
    sb = _sacrebleu()
    # force: book-normalised text ends in " ." on purpose; sacreBLEU would warn about it
    bleu, chrf = sb.metrics.BLEU(force=True), sb.metrics.CHRF()
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
    )
