"""Did the run learn? The model's validation translations against trivial baselines.

Every run ends with a :class:`Verdict` (``qkv train`` and ``qkv demo translate`` read the same
one): the final model's validation BLEU is compared with what needs no model at all (copying the
source; one sentence, the most frequent reference, for every input) and its translations are
checked for degenerate output (a token repeated :data:`RUN` or more times in a row; one
translation for most inputs). A model that is no better than the baselines, degenerate, or under
:data:`MIN_BLEU` is *not usable*: the run says so in one line, with the updates it made, the
updates its plan needed, and the fix; ``qkv train`` then exits with :data:`EXIT_NOT_LEARNED`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..inference import corpus_scores
from .interrupt import resume_command
from .presets import TIERS, speed_factor

__all__ = [
    "EXIT_NOT_LEARNED",
    "MIN_BLEU",
    "RUN",
    "Verdict",
    "degenerate",
    "fix_for",
    "judge",
    "stopped_early",
]

#: ``qkv train``'s exit status when the model learned nothing or too little to use (0: it did;
#: 1: an error; 2: bad settings; 130/143: stopped by a signal)
EXIT_NOT_LEARNED = 3
#: a token repeated this many times in a row is degenerate output (``Die Die Die Die``)
RUN = 4
#: under this validation BLEU a model is too weak to use, whatever the baselines score
MIN_BLEU = 1.0
#: the share of translations that may be degenerate (repeating, or one same translation)
DEGENERATE_SHARE = 0.5
#: the BLEU a model must gain over the better baseline
MARGIN = 1.0
#: the smallest preset, which makes the most updates: the first CPU tier of
#: :data:`qkv.train.presets.TIERS` (ordered smallest first)
SMALLEST = next(name for name, (device, *_rest) in TIERS.items() if device == "cpu")
#: a measured speed under this share of the reference machine's: the fix names the machine too
SLOW = 0.5


@dataclass(frozen=True)
class Verdict:
    """What the end of a run found.

    Attributes:
        usable: False when the model learned nothing or too little to use.
        bleu: the final model's validation BLEU (None: the run never validated).
        copy_bleu: BLEU of the sources copied as translations.
        frequent_bleu: BLEU of the most frequent reference given for every input.
        repeating: share of translations holding a token repeated :data:`RUN` times in a row.
        identical: share of translations equal to the most common translation.
        steps: the updates the run made; ``planned`` those its plan needed (None: unknown).
        reason: why it is not usable (None when it is).
    """

    usable: bool
    bleu: float | None
    copy_bleu: float
    frequent_bleu: float
    repeating: float
    identical: float
    steps: int
    planned: int | None
    reason: str | None = None

    def line(self, fix: str) -> str:
        """The run's one line: what was found, and (not usable) why and ``fix``."""
        if self.usable:
            return (
                f"the model learned: valid BLEU {self.bleu:.2f} against {self.copy_bleu:.2f} for "
                f"copying the source and {self.frequent_bleu:.2f} for one frequent sentence"
            )
        return f"the model is not usable: {self.reason}. {fix}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def degenerate(translations: Sequence[str]) -> tuple[float, float]:
    """``(repeating, identical)``: the share of ``translations`` with a whitespace token
    repeated :data:`RUN` times in a row, and the share equal to the most common one (an empty
    translation counts as repeating nothing but as identical to the other empty ones)."""
    if not translations:
        return 0.0, 0.0
    repeating = 0
    for text in translations:
        words, run = text.split(), 1
        for a, b in itertools.pairwise(words):
            run = run + 1 if a == b else 1
            if run >= RUN:
                repeating += 1
                break
    most = Counter(t.strip() for t in translations).most_common(1)[0][1]
    n = len(translations)
    return repeating / n, (most / n if n >= 4 else 0.0)


def _updates(steps: int, planned: int | None) -> str:
    if planned is not None and planned > steps:
        return f"{steps} updates of the {planned} its plan needed"
    return f"{steps} updates"


def judge(
    translations: Sequence[str],
    sources: Sequence[str],
    references: Sequence[str],
    *,
    bleu: float,
    steps: int,
    planned: int | None = None,
    tokenize: str | None = None,
) -> Verdict:
    """The verdict on a model whose validation ``translations`` of ``sources`` scored ``bleu``
    against ``references`` (all three the same length), after ``steps`` updates of the
    ``planned`` ones."""
    if not (len(translations) == len(sources) == len(references)):
        raise ValueError(
            f"translations, sources, references: expected one each per sentence, got "
            f"{len(translations)}, {len(sources)}, {len(references)}"
        )
    copy = corpus_scores(list(sources), list(references), tokenize=tokenize).bleu
    frequent = Counter(references).most_common(1)[0][0] if references else ""
    freq = corpus_scores([frequent] * len(references), list(references), tokenize=tokenize).bleu
    repeating, identical = degenerate(translations)
    why = []
    if repeating > DEGENERATE_SHARE:
        why.append(f"{repeating:.0%} of its translations repeat a word {RUN}+ times")
    if identical > DEGENERATE_SHARE:
        why.append(f"{identical:.0%} of its translations are one same sentence")
    if bleu < max(copy, freq) + MARGIN:
        why.append(
            f"valid BLEU {bleu:.2f} is no better than copying the source ({copy:.2f}) or one "
            f"frequent sentence ({freq:.2f})"
        )
    elif bleu < MIN_BLEU:
        why.append(f"valid BLEU {bleu:.2f} is under {MIN_BLEU:g}")
    reason = None
    if why:
        reason = "; ".join(why) + f", after {_updates(steps, planned)}"
    return Verdict(
        usable=not why,
        bleu=bleu,
        copy_bleu=copy,
        frequent_bleu=freq,
        repeating=repeating,
        identical=identical,
        steps=steps,
        planned=planned,
        reason=reason,
    )


def stopped_early(steps: int, planned: int | None) -> Verdict:
    """The verdict on a run that ended before its first validation."""
    return Verdict(
        usable=False,
        bleu=None,
        copy_bleu=0.0,
        frequent_bleu=0.0,
        repeating=0.0,
        identical=0.0,
        steps=steps,
        planned=planned,
        reason=f"the run ended before its first validation, after {_updates(steps, planned)}",
    )


def fix_for(
    out: Any,
    minutes: float | None,
    steps: int,
    planned: int | None,
    tier: str | None = None,
    speed: float | None = None,
    capped: bool = False,
    used_minutes: float | None = None,
) -> str:
    """What to do about a model that is not usable: train the run in ``out`` on (a larger
    budget: at least twice this one, or as much more as the plan needed), or start smaller
    (unless its preset ``tier`` is the smallest already); and, when the speed measured at the
    start (``speed``, target tokens/s) was under :data:`SLOW` of the reference machine's, on
    a machine with fewer other processes. A run that the user's ``max_steps`` ended
    (``capped``) is told more updates, and, when it had a clock too, the minutes those take
    when they are more than its ``minutes`` (a resume keeps the run's ``max_minutes``, counted
    over all its invocations): by its plan's pace (``planned`` updates in ``minutes``), else
    by the pace of its ``used_minutes``."""
    go_on = resume_command(out)
    if minutes is not None and not capped:
        more = max(2.0, (planned or 0) / max(steps, 1))
        go_on += f" --max-minutes {math.ceil(minutes * more):d}"
    else:
        target = max(2 * steps, planned or 0, 100)
        go_on += f" --max-steps {target}"
        pace = minutes / planned if minutes and planned else (used_minutes or 0.0) / max(steps, 1)
        need = pace * target
        if minutes is not None and need > minutes:
            go_on += f" --max-minutes {math.ceil(need):d}"
    smaller = "" if tier == SMALLEST else f", or start a smaller model (--preset {SMALLEST})"
    busy = speed is not None and speed_factor(speed) < SLOW
    return f"Fix: train it longer ({go_on}){smaller}" + (
        ", on a machine with fewer other processes" if busy else ""
    )
