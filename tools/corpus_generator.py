"""Generator of the bundled English-French corpus (run by a developer, never at install time).

    python tools/corpus_generator.py --seed 0 --size 30000 --out src/qkv/data/corpus/en-fr.tsv.gz

run from the repository root (or ``python -m tools.corpus_generator ...``). It is a developer
tool, not part of the installed package: it imports nothing of qkv, and writes the file that
``qkv.data.bundled_pairs()`` reads.

It needs ``num2words`` (a dev extra). Every pair is built from a small lexicon by grammar rules,
so the French is right by construction and each English sentence has exactly one French
rendering (the generator refuses to write an English sentence twice with two translations --
a translation model could not learn two answers to one question, and BLEU would be capped).

French grammar covered:

* articles (le/la/les, un/une/des, du/de la, ce/cet/cette/ces, mon/ma/mes ... with
  ``ma`` -> ``mon`` before a vowel) agreeing with the noun; ``des`` -> ``de`` before a
  plural adjective and after a negation (``pas de``), partitive ``du café``/``de l'eau``;
* elision (``l'``, ``j'``, ``n'``, ``d'``, ``qu'``) and contraction (``au``, ``aux``, ``du``,
  ``des``) as a final pass over the words;
* adjectives agreeing in gender and number, after the noun except ``beau bon grand jeune joli
  mauvais nouveau petit vieux``, which come before it, with ``bel``/``vieil``/``nouvel`` before
  a masculine singular noun starting with a vowel or a mute h;
* the present tense and the passé composé, with ``être`` for verbs of motion and the past
  participle agreeing with the subject (``elle est partie``, ``nous sommes allés``), ``avoir``
  otherwise;
* negation ``ne ... pas``; questions by inversion for ``être``/``avoir`` with a pronoun
  (``es-tu fatigué ?``, ``a-t-il un chat ?``) and by ``est-ce que`` otherwise, plus ``où``,
  ``qui`` and ``qu'est-ce que``; ``avoir`` idioms (``j'ai faim``); ``il y a``; ``chez moi``;
* numbers from ``num2words(n, lang="fr")`` (with ``et une``/``-une`` before a feminine noun).

The English ``you`` is always ``tu`` (so ``go .`` -> ``va !`` as in the book), ``they`` is
``ils`` and a pronoun whose gender English does not show (``i``, ``you``, ``we``, ``they``) is
masculine. Text is lower-case with a space before punctuation, as ``Normalizer.book()`` gives.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ADJ",
    "ADJECTIVES",
    "BOOK_PAIRS",
    "NOUN",
    "NOUNS",
    "VERB",
    "VERBS",
    "Adj",
    "Grammar",
    "Noun",
    "Verb",
    "finish_fr",
    "generate",
    "main",
]

BOOK_PAIRS = (
    ("go .", "va !"),
    ("i lost .", "j'ai perdu ."),
    ("he's calm .", "il est calme ."),
    ("i'm home .", "je suis chez moi ."),
)

VOWELS = set("aeiouyéèêëàâîïôûœh")  # the lexicon's h is mute (l'homme, l'hôtel) ...
ASPIRATED = {"huit", "onze", "hier"}  # ... but these block elision (le huit, le onze)


def starts_with_vowel(word: str) -> bool:
    """Whether elision and the ``bel``/``cet``/``mon`` forms apply before ``word``."""
    return bool(word) and word[0] in VOWELS and word not in ASPIRATED


def en_starts_with_vowel(word: str) -> bool:
    """Whether English takes ``an`` before ``word`` (the lexicon has no ``u``-as-``you``)."""
    return bool(word) and word[0] in "aeiou"


# --------------------------------------------------------------------------------------------
# Lexicon
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noun:
    """A noun: English singular/plural, French singular/plural, gender, semantic tags."""

    en: str
    en_pl: str
    fr: str
    fr_pl: str
    gender: str  # "m" or "f"
    tags: frozenset[str]


def _n(en: str, fr: str, gender: str, tags: str, en_pl: str = "", fr_pl: str = "") -> Noun:
    return Noun(en, en_pl or en + "s", fr, fr_pl or fr + "s", gender, frozenset(tags.split()))


NOUNS: tuple[Noun, ...] = (
    # people (person): their gender is the noun's
    _n("man", "homme", "m", "person adult grown looks noposs", en_pl="men"),
    _n("woman", "femme", "f", "person adult grown looks noposs", en_pl="women"),
    _n("boy", "garçon", "m", "person kid looks noposs"),
    _n("girl", "fille", "f", "person kid looks noposs"),
    _n("child", "enfant", "m", "person kid", en_pl="children"),
    _n("brother", "frère", "m", "person adult kin sibling"),
    _n("sister", "sœur", "f", "person adult kin sibling"),
    _n("father", "père", "m", "person adult kin unique"),
    _n("mother", "mère", "f", "person adult kin unique"),
    # animals
    _n("cat", "chat", "m", "animal pet coloured_animal"),
    _n("dog", "chien", "m", "animal pet coloured_animal"),
    _n("horse", "cheval", "m", "animal coloured_animal", fr_pl="chevaux"),
    _n("bird", "oiseau", "m", "animal", fr_pl="oiseaux"),
    _n("mouse", "souris", "f", "animal pet coloured_animal", en_pl="mice", fr_pl="souris"),
    _n("rabbit", "lapin", "m", "animal pet coloured_animal"),
    # food (countable)
    _n("apple", "pomme", "f", "food"),
    _n("orange", "orange", "f", "food"),
    _n("cake", "gâteau", "m", "food", fr_pl="gâteaux"),
    _n("egg", "œuf", "m", "food"),
    _n("banana", "banane", "f", "food"),
    # drinks (mass nouns: partitive du/de la/de l')
    _n("water", "eau", "f", "drink"),
    _n("milk", "lait", "m", "drink"),
    _n("coffee", "café", "m", "drink"),
    _n("tea", "thé", "m", "drink"),
    _n("juice", "jus", "m", "drink", fr_pl="jus"),
    # things
    _n("book", "livre", "m", "thing readable openable closable buyable"),
    _n("letter", "lettre", "f", "thing readable writable openable"),
    _n("newspaper", "journal", "m", "thing readable buyable", fr_pl="journaux"),
    _n("pen", "stylo", "m", "thing losable buyable"),
    _n("key", "clé", "f", "thing losable"),
    _n("bag", "sac", "m", "thing losable openable closable buyable coloured holder small"),
    _n("box", "boîte", "f", "thing openable closable holder small", en_pl="boxes"),
    _n("hat", "chapeau", "m", "thing clothing losable buyable coloured", fr_pl="chapeaux"),
    _n("dress", "robe", "f", "thing clothing buyable coloured washable", en_pl="dresses"),
    _n("shirt", "chemise", "f", "thing clothing buyable coloured washable"),
    _n("umbrella", "parapluie", "m", "thing losable buyable coloured openable closable"),
    _n("cup", "tasse", "f", "thing dish buyable coloured washable"),
    _n("plate", "assiette", "f", "thing dish buyable washable"),
    _n("chair", "chaise", "f", "thing furniture buyable coloured surface"),
    _n("table", "table", "f", "thing furniture buyable coloured surface"),
    _n("bed", "lit", "m", "thing furniture buyable surface"),
    _n("car", "voiture", "f", "thing vehicle buyable coloured washable holder"),
    _n("bike", "vélo", "m", "thing vehicle buyable coloured washable losable"),
    _n("door", "porte", "f", "thing openable closable coloured landmark"),
    _n("window", "fenêtre", "f", "thing openable closable landmark"),
    _n("computer", "ordinateur", "m", "thing buyable"),
    _n("radio", "radio", "f", "thing audible buyable"),
    _n("music", "musique", "f", "audible mass"),
    _n("train", "train", "m", "thing awaited"),
    _n("bus", "bus", "m", "thing awaited", en_pl="buses", fr_pl="bus"),
    # places
    _n("house", "maison", "f", "place building holder landmark buyable coloured"),
    _n("garden", "jardin", "m", "place holder"),
    _n("school", "école", "f", "place building landmark public"),
    _n("park", "parc", "m", "place holder destination public"),
    _n("market", "marché", "m", "place destination public"),
    _n("museum", "musée", "m", "place building destination shop public"),
    _n("station", "gare", "f", "place building destination landmark public"),
    _n("beach", "plage", "f", "place destination public", en_pl="beaches"),
    _n("bank", "banque", "f", "place building destination shop landmark public"),
    _n("library", "bibliothèque", "f", "place building destination shop public", en_pl="libraries"),
    _n("hotel", "hôtel", "m", "place building destination landmark public"),
    _n("shop", "magasin", "m", "place building destination shop public"),
    _n("airport", "aéroport", "m", "place building destination public"),
    _n("city", "ville", "f", "place destination public", en_pl="cities"),
)
NOUN = {n.en: n for n in NOUNS}


@dataclass(frozen=True)
class Adj:
    """An adjective: French forms, position, and the noun tags it goes with.

    ``mv`` is the masculine singular form before a vowel (``bel``), when it differs. ``attr``
    are the tags of nouns it may qualify inside a noun phrase, ``pred`` those of subjects it may
    be said of with ``être``.
    """

    en: str
    ms: str
    fs: str
    mp: str
    fp: str
    before: bool = False
    mv: str = ""
    attr: frozenset[str] = field(default_factory=frozenset)
    pred: frozenset[str] = field(default_factory=frozenset)

    def form(self, gender: str, plural: bool, before_vowel: bool = False) -> str:
        """The form agreeing with a noun of ``gender``/number (``before_vowel``: ``bel``)."""
        if plural:
            return self.fp if gender == "f" else self.mp
        if gender == "f":
            return self.fs
        return self.mv if (before_vowel and self.mv) else self.ms


def _a(en, ms, fs="", mp="", fp="", *, before=False, mv="", attr="", pred="") -> Adj:
    fs = fs or (ms if ms.endswith("e") else ms + "e")
    mp = mp or (ms if ms.endswith(("s", "x")) else ms + "s")
    fp = fp or fs + "s"
    return Adj(en, ms, fs, mp, fp, before, mv, frozenset(attr.split()), frozenset(pred.split()))


ANIMATE = "person animal"
OBJECTS = "food thing place"
ADJECTIVES: tuple[Adj, ...] = (
    # before the noun
    _a("big", "grand", before=True, attr="animal food thing place", pred="animal food thing place"),
    _a(
        "small",
        "petit",
        before=True,
        attr=f"kid sibling animal {OBJECTS}",
        pred=f"{ANIMATE} {OBJECTS}",
    ),
    _a("good", "bon", "bonne", before=True, attr="food readable kid", pred="food"),
    _a("bad", "mauvais", before=True, attr="food readable", pred="food"),
    _a(
        "beautiful",
        "beau",
        "belle",
        "beaux",
        before=True,
        mv="bel",
        attr="looks animal thing place",
        pred=f"{ANIMATE} thing place",
    ),
    _a("pretty", "joli", before=True, attr="thing place", pred="thing place"),
    _a("young", "jeune", before=True, attr="grown sibling animal", pred=ANIMATE),
    _a(
        "old",
        "vieux",
        "vieille",
        "vieux",
        before=True,
        mv="vieil",
        attr="grown animal thing place",
        pred=f"{ANIMATE} thing place",
    ),
    _a("new", "nouveau", "nouvelle", "nouveaux", before=True, mv="nouvel", attr="thing place"),
    # after the noun: colours
    _a("red", "rouge", attr="coloured", pred="coloured"),
    _a("black", "noir", attr="coloured coloured_animal", pred="coloured coloured_animal"),
    _a(
        "white",
        "blanc",
        "blanche",
        attr="coloured coloured_animal",
        pred="coloured coloured_animal",
    ),
    _a("gray", "gris", "grise", attr="coloured coloured_animal", pred="coloured coloured_animal"),
    _a("green", "vert", attr="coloured", pred="coloured"),
    _a("blue", "bleu", attr="coloured", pred="coloured"),
    _a("yellow", "jaune", attr="coloured", pred="coloured"),
    # after the noun: others
    _a("expensive", "cher", "chère", attr="buyable", pred="buyable"),
    _a("delicious", "délicieux", "délicieuse", attr="food", pred="food"),
    _a("dirty", "sale", attr="clothing vehicle dish", pred="clothing vehicle dish"),
    _a("open", "ouvert", pred="openable shop"),
    _a("closed", "fermé", pred="openable shop"),
    # said of people and animals
    _a("calm", "calme", pred=ANIMATE),
    _a("tired", "fatigué", pred=ANIMATE),
    _a("happy", "heureux", "heureuse", pred=ANIMATE),
    _a("sad", "triste", pred=ANIMATE),
    _a("sick", "malade", pred=ANIMATE),
    _a("tall", "grand", pred="person"),
    _a("ready", "prêt", pred="person"),
    _a("busy", "occupé", pred="person"),
    _a("kind", "gentil", "gentille", pred=ANIMATE),
    _a("rich", "riche", pred="person"),
    _a("strong", "fort", pred=ANIMATE),
    _a("shy", "timide", pred=ANIMATE),
    _a("late", "en retard", "en retard", "en retard", "en retard", pred=ANIMATE),
    _a("angry", "en colère", "en colère", "en colère", "en colère", pred=ANIMATE),
)

ADJ = {a.en: a for a in ADJECTIVES}

# "i'm hungry ." -> "j'ai faim ." : English be + adjective, French avoir + noun.
AVOIR_IDIOMS = {
    "hungry": "faim",
    "thirsty": "soif",
    "cold": "froid",
    "hot": "chaud",
    "afraid": "peur",
    "right": "raison",
    "wrong": "tort",
}


def _er(stem: str) -> tuple[str, ...]:
    """Present tense of a regular -er verb from its stem (``mang`` -> mange ... mangeons)."""
    nous = stem + ("eons" if stem.endswith("g") else "ons")
    return (stem + "e", stem + "es", stem + "e", nous, stem + "ez", stem + "ent")


@dataclass(frozen=True)
class Verb:
    """A verb: French present (je tu il nous vous ils), participle, auxiliary; English forms.

    ``obj``: tags of possible direct objects (empty: no transitive use); ``intrans``: may be
    used without object; ``subj``: tags of possible subjects; ``past``: the passé composé is
    generated (False where English past and present look alike or the sense shifts);
    ``imp``: the ``tu`` imperative, or "" for none.
    """

    fr: str
    present: tuple[str, ...]
    pp: str
    aux: str
    en: str
    en3: str
    en_past: str
    obj: frozenset[str] = frozenset()
    intrans: bool = False
    subj: frozenset[str] = frozenset({"person"})
    past: bool = True
    imp: str = ""
    generic: bool = False  # bare plural object means "in general": j'aime les chats


# One verb a line: infinitive | present je tu il nous vous ils ("-er": regular) | participle |
# auxiliary | English base/3rd person/past ("-": no past) | tags of possible objects | flags
# (intrans: also without object; nopast: no passé composé; generic: a bare plural object is
# generic, "i like cats" -> "j'aime les chats"; imp=: the tu imperative; subj=: subject tags).
_VERB_TABLE = """
aller | vais vas va allons allez vont | allé | être | go/goes/went | - | imp=va
venir | viens viens vient venons venez viennent | venu | être | come/comes/came | - | intrans imp=viens
revenir | reviens reviens revient revenons revenez reviennent | revenu | être | come back/comes back/came back | - | intrans imp=reviens
partir | pars pars part partons partez partent | parti | être | leave/leaves/left | - | intrans imp=pars
sortir | sors sors sort sortons sortez sortent | sorti | être | go out/goes out/went out | - | intrans imp=sors
arriver | -er | arrivé | être | arrive/arrives/arrived | - | intrans subj=animal,person
tomber | -er | tombé | être | fall/falls/fell | - | intrans subj=animal,person
rester | -er | resté | être | stay/stays/stayed | - | intrans imp=reste
entrer | -er | entré | être | come in/comes in/came in | - | intrans imp=entre
rentrer | -er | rentré | être | go home/goes home/went home | - | -
dormir | dors dors dort dormons dormez dorment | dormi | avoir | sleep/sleeps/slept | - | intrans imp=dors subj=animal,person
courir | cours cours court courons courez courent | couru | avoir | run/runs/ran | - | intrans imp=cours subj=animal,person
nager | -er | nagé | avoir | swim/swims/swam | - | intrans imp=nage subj=animal,person
gagner | -er | gagné | avoir | win/wins/won | - | intrans
rire | ris ris rit rions riez rient | ri | avoir | laugh/laughs/laughed | - | intrans
pleurer | -er | pleuré | avoir | cry/cries/cried | - | intrans
travailler | -er | travaillé | avoir | work/works/worked | - | intrans imp=travaille
chanter | -er | chanté | avoir | sing/sings/sang | - | intrans imp=chante
danser | -er | dansé | avoir | dance/dances/danced | - | intrans imp=danse
perdre | perds perds perd perdons perdez perdent | perdu | avoir | lose/loses/lost | losable | intrans
manger | -er | mangé | avoir | eat/eats/ate | food | intrans imp=mange subj=animal,person
attendre | attends attends attend attendons attendez attendent | attendu | avoir | wait for/waits for/waited for | awaited person | imp=attends
attendre | attends attends attend attendons attendez attendent | attendu | avoir | wait/waits/waited | - | intrans imp=attends
boire | bois bois boit buvons buvez boivent | bu | avoir | drink/drinks/drank | drink | imp=bois subj=animal,person
voir | vois vois voit voyons voyez voient | vu | avoir | see/sees/saw | animal food person place thing | -
regarder | -er | regardé | avoir | watch/watches/watched | animal person | imp=regarde
acheter | achète achètes achète achetons achetez achètent | acheté | avoir | buy/buys/bought | buyable drink food | imp=achète
vendre | vends vends vend vendons vendez vendent | vendu | avoir | sell/sells/sold | buyable | imp=vends
trouver | -er | trouvé | avoir | find/finds/found | animal losable | -
chercher | -er | cherché | avoir | look for/looks for/looked for | animal losable person | -
aimer | -er | aimé | avoir | like/likes/liked | animal audible drink food person place thing | generic
vouloir | veux veux veut voulons voulez veulent | voulu | avoir | want/wants/- | buyable drink food pet | nopast
avoir | ai as a avons avez ont | eu | avoir | have/has/- | buyable kin losable pet | nopast
prendre | prends prends prend prenons prenez prennent | pris | avoir | take/takes/took | awaited dish food losable | imp=prends
ouvrir | ouvre ouvres ouvre ouvrons ouvrez ouvrent | ouvert | avoir | open/opens/opened | openable | imp=ouvre
fermer | -er | fermé | avoir | close/closes/closed | closable | imp=ferme
lire | lis lis lit lisons lisez lisent | lu | avoir | read/reads/read | readable | nopast imp=lis
écrire | écris écris écrit écrivons écrivez écrivent | écrit | avoir | write/writes/wrote | writable | imp=écris
aider | -er | aidé | avoir | help/helps/helped | person | imp=aide
appeler | appelle appelles appelle appelons appelez appellent | appelé | avoir | call/calls/called | person pet | imp=appelle
laver | -er | lavé | avoir | wash/washes/washed | pet washable | imp=lave
porter | -er | porté | avoir | wear/wears/wore | clothing | -
écouter | -er | écouté | avoir | listen to/listens to/listened to | audible person | imp=écoute
"""


def _parse_verbs(table: str) -> tuple[Verb, ...]:
    verbs = []
    for line in table.strip().splitlines():
        fr, present, pp, aux, en, obj, flags = (c.strip() for c in line.split("|"))
        base, third, past = en.split("/")
        opts = dict(f.split("=") if "=" in f else (f, "1") for f in flags.split() if f != "-")
        verbs.append(
            Verb(
                fr=fr,
                present=_er(fr[:-2]) if present == "-er" else tuple(present.split()),
                pp=pp,
                aux=aux,
                en=base,
                en3=third,
                en_past="" if past == "-" else past,
                obj=frozenset(obj.split()) - {"-"},
                intrans="intrans" in opts,
                subj=frozenset(opts.get("subj", "person").split(",")),
                past="nopast" not in opts,
                imp=opts.get("imp", ""),
                generic="generic" in opts,
            )
        )
    return tuple(verbs)


VERBS: tuple[Verb, ...] = _parse_verbs(_VERB_TABLE)
VERB = {v.en: v for v in VERBS}


# --------------------------------------------------------------------------------------------
# Words to sentences
# --------------------------------------------------------------------------------------------

_ELIDE = {"je": "j'", "ne": "n'", "le": "l'", "la": "l'", "de": "d'", "que": "qu'"}
_CONTRACT = {("à", "le"): "au", ("à", "les"): "aux", ("de", "le"): "du", ("de", "les"): "des"}


def finish_fr(words: Sequence[str]) -> str:
    """Apply elision then contraction to French words and join them.

    ``je ai`` -> ``j'ai``, ``le arbre`` -> ``l'arbre``, ``que il`` -> ``qu'il``;
    ``à le`` -> ``au``, ``de les`` -> ``des`` (``à l'`` and ``de l'`` stay).
    """
    words = [w for w in words if w]
    elided = []
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        elided.append(_ELIDE[w] if w in _ELIDE and starts_with_vowel(nxt) else w)
    out: list[str] = []
    for w in elided:
        if out and (out[-1], w) in _CONTRACT:
            out[-1] = _CONTRACT[(out[-1], w)]
        else:
            out.append(w)
    text = " ".join(out)
    return text.replace("' ", "'")


@dataclass
class NP:
    """A rendered noun phrase: words in each language and what agreement needs."""

    en: list[str]
    fr: list[str]
    gender: str
    plural: bool
    noun: Noun | None = None


@dataclass
class Subj:
    """A rendered subject; ``pronoun`` is the English pronoun or "" for a noun phrase."""

    en: list[str]
    fr: list[str]
    person: int  # 0-5: je tu il nous vous ils
    gender: str
    plural: bool
    pronoun: str = ""
    noun: Noun | None = None

    @property
    def tags(self) -> frozenset[str]:
        return self.noun.tags if self.noun is not None else frozenset({"person"})

    @property
    def stress(self) -> str:
        """The stressed pronoun for ``chez ...``: moi, toi, lui, elle, nous, eux, elles."""
        if self.pronoun:
            return PRONOUNS[self.pronoun]["stress"]
        return (
            {"m": "eux", "f": "elles"}[self.gender]
            if self.plural
            else ("lui" if self.gender == "m" else "elle")
        )


# (person index 0-5: je tu il nous vous ils), gender, plural; English forms
PRONOUNS = {
    "i": dict(fr="je", p=0, g="m", pl=False, be="am", bec="i'm", neg="i'm not", stress="moi"),
    "you": dict(
        fr="tu", p=1, g="m", pl=False, be="are", bec="you're", neg="you aren't", stress="toi"
    ),
    "he": dict(fr="il", p=2, g="m", pl=False, be="is", bec="he's", neg="he isn't", stress="lui"),
    "she": dict(
        fr="elle", p=2, g="f", pl=False, be="is", bec="she's", neg="she isn't", stress="elle"
    ),
    "we": dict(
        fr="nous", p=3, g="m", pl=True, be="are", bec="we're", neg="we aren't", stress="nous"
    ),
    "they": dict(
        fr="ils", p=5, g="m", pl=True, be="are", bec="they're", neg="they aren't", stress="eux"
    ),
}
POSSESSIVES = {  # English: (masc sg, fem sg, plural) in French
    "my": ("mon", "ma", "mes"),
    "your": ("ton", "ta", "tes"),
    "his": ("son", "sa", "ses"),
    "her": ("son", "sa", "ses"),
    "our": ("notre", "notre", "nos"),
    "their": ("leur", "leur", "leurs"),
}
NUMBERS = (*range(2, 21), 21, 22, 30, 31, 40, 50, 60, 70, 71, 80, 81, 90, 99, 100, 200)
LOCATIONS = {  # English preposition -> (French words, nouns it goes with)
    "on": (["sur"], "surface"),
    "under": (["sous"], "surface"),
    "in": (["dans"], "holder"),
    "near": (["près", "de"], "landmark surface holder"),
    "behind": (["derrière"], "landmark"),
    "in front of": (["devant"], "landmark"),
}
TIME_PRESENT = (("today", "aujourd'hui"), ("now", "maintenant"), ("every day", "tous les jours"))
TIME_PAST = (("yesterday", "hier"), ("today", "aujourd'hui"))
FIXED = (
    ("hello .", "bonjour !"),
    ("thank you .", "merci !"),
    ("goodbye .", "au revoir !"),
    ("good night .", "bonne nuit !"),
    ("see you tomorrow .", "à demain !"),
    ("welcome .", "bienvenue !"),
    ("of course .", "bien sûr !"),
    ("help !", "à l'aide !"),
)


class Grammar:
    """Random sentence builders over the lexicon; one ``random.Random`` drives all choices."""

    def __init__(self, seed: int) -> None:
        from num2words import num2words  # dev extra: only the generator needs it

        self.rng = random.Random(seed)
        self._num2words = num2words
        self._numbers: dict[int, tuple[str, str]] = {}

    # -- small helpers ---------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def number(self, n: int, gender: str) -> tuple[str, str]:
        """English and French words of ``n`` before a noun of ``gender``."""
        if n not in self._numbers:
            self._numbers[n] = (self._num2words(n), self._num2words(n, lang="fr"))
        en, fr = self._numbers[n]
        if gender == "f" and (fr == "un" or fr.endswith((" un", "-un"))):
            fr += "e"  # vingt et une pommes, quatre-vingt-une pommes
        return en, fr

    @staticmethod
    @functools.cache
    def _nouns(tags: frozenset[str]) -> tuple[Noun, ...]:
        return tuple(n for n in NOUNS if n.tags & tags)

    def nouns(self, tags: frozenset[str] | set[str]) -> tuple[Noun, ...]:
        """Nouns having at least one of ``tags``, in lexicon order."""
        return self._nouns(frozenset(tags))

    @staticmethod
    @functools.cache
    def adjectives_for(noun: Noun, before: bool | None = None) -> tuple[Adj, ...]:
        """Adjectives that may qualify ``noun`` inside a noun phrase (``before``: position)."""
        return tuple(
            a for a in ADJECTIVES if a.attr & noun.tags and (before is None or a.before == before)
        )

    # -- noun phrases ----------------------------------------------------------------------

    def np(
        self,
        noun: Noun,
        det: str,
        plural: bool,
        *,
        count: int = 0,
        adj_p: float = 0.3,
        negated: bool = False,
        adjs: Sequence[Adj] | None = None,
    ) -> NP:
        """Render ``noun`` with determiner ``det`` in both languages.

        ``det``: ``the``, ``a`` (an indefinite: ``a cat``/``cats``/``water``), ``this``, a
        possessive (``my`` ...), or ``num`` (``count`` of them). ``negated``: the phrase is the
        object of a negated verb, so indefinite and partitive articles become ``de``. ``adjs``
        chooses the adjectives (at most one of each position) instead of drawing them.
        """
        g = noun.gender
        mass = "drink" in noun.tags or "mass" in noun.tags
        pre: Adj | None = None
        post: Adj | None = None
        if adjs is not None:
            pre = next((a for a in adjs if a.before), None)
            post = next((a for a in adjs if not a.before), None)
        elif not mass and self.chance(adj_p):
            cands = self.adjectives_for(noun)
            if cands:
                a = self.rng.choice(cands)
                if a.before:
                    pre = a
                    if self.chance(0.25):
                        posts = self.adjectives_for(noun, before=False)
                        post = self.rng.choice(posts) if posts else None
                else:
                    post = a
        # English: determiner, adjectives (opinion/size/age before colour), noun
        en_noun = noun.en_pl if plural else noun.en
        en_adjs = [a.en for a in (pre, post) if a is not None]
        en_det: list[str]
        if det == "the":
            en_det = ["the"]
        elif det == "a":
            if plural or mass:
                en_det = []
            else:
                first = ([*en_adjs, en_noun])[0]
                en_det = ["an" if en_starts_with_vowel(first) else "a"]
        elif det == "this":
            en_det = ["these" if plural else "this"]
        elif det == "num":
            en_det = [self.number(count, g)[0]]
        else:
            en_det = [det]
        en = [*en_det, *en_adjs, en_noun]
        # French: determiner, preposed adjective, noun, postposed adjective
        fr_noun = noun.fr_pl if plural else noun.fr
        pre_fr = pre.form(g, plural, before_vowel=starts_with_vowel(fr_noun)) if pre else ""
        post_fr = post.form(g, plural) if post else ""
        nxt = pre_fr or fr_noun
        v = starts_with_vowel(nxt)
        if det == "the":
            fr_det = ["les" if plural else ("le" if g == "m" else "la")]
        elif det == "a":
            if negated:
                fr_det = ["de"]
            elif mass:
                fr_det = ["de", "le" if g == "m" else "la"]
            elif plural:
                fr_det = ["de" if pre else "des"]
            else:
                fr_det = ["un" if g == "m" else "une"]
        elif det == "this":
            fr_det = ["ces" if plural else ("cette" if g == "f" else ("cet" if v else "ce"))]
        elif det == "num":
            fr_det = [self.number(count, g)[1]]
        else:
            ms, fs, pl = POSSESSIVES[det]
            fr_det = [pl if plural else (ms if (g == "m" or v) else fs)]
        fr = [*fr_det, pre_fr, fr_noun, post_fr]
        return NP(en, [w for w in fr if w], g, plural, noun)

    def random_np(
        self,
        tags: frozenset[str] | set[str],
        *,
        role: str,
        negated: bool = False,
        generic: bool = False,
        adj_p: float = 0.3,
    ) -> NP | None:
        """A noun phrase for a noun with one of ``tags``; ``role`` is ``subj`` or ``obj``."""
        cands = self.nouns(tags)
        if not cands:
            return None
        noun = self.rng.choice(cands)
        mass = "drink" in noun.tags or "mass" in noun.tags
        if mass:
            if role == "subj":
                return self.np(noun, "the", False)
            det = self.rng.choice(("the", "a", "a", "my")) if "drink" in noun.tags else "the"
            if det == "a" and generic:
                # "i like coffee" -> "j'aime le café": generic, definite article
                out = self.np(noun, "the", False)
                out.en = out.en[1:]
                return out
            return self.np(noun, det, False, negated=negated)
        plural = "unique" not in noun.tags and self.chance(0.35)
        dets = ["the", "the", "this"]
        if not noun.tags & {"noposs", "public"}:
            dets += ["my", "your", "his", "her", "our", "their"]
        if role == "obj":
            dets += ["a", "a", "a"]
            if not negated and "place" not in noun.tags:
                dets += ["num"]
        if generic and role == "obj":
            dets = [d for d in dets if d != "a"] + ["generic", "generic"]
        det = self.rng.choice(dets)
        if det == "generic":
            # "i like cats" -> "j'aime les chats"
            out = self.np(noun, "the", True, adj_p=adj_p)
            out.en = out.en[1:]
            return out
        if det == "num":
            count = self.rng.choice(NUMBERS)
            return self.np(noun, "num", True, count=count, adj_p=adj_p)
        if "kin" in noun.tags and det in ("the", "this"):
            det = "my"  # "the mother" is odd English; family nouns take a possessive
        return self.np(noun, det, plural, negated=negated and det == "a", adj_p=adj_p)

    def subject(self, tags: frozenset[str], adj_p: float = 0.3) -> Subj:
        """A subject pronoun (when ``tags`` allow people) or noun phrase."""
        if "person" in tags and self.chance(0.55):
            name = self.rng.choice(list(PRONOUNS))
            info = PRONOUNS[name]
            return Subj([name], [info["fr"]], info["p"], info["g"], info["pl"], name)
        np = self.random_np(tags - {"drink"}, role="subj", adj_p=adj_p)
        if np is None:
            return self.subject(frozenset({"person"}))
        return Subj(np.en, np.fr, 5 if np.plural else 2, np.gender, np.plural, "", np.noun)

    # -- clauses ---------------------------------------------------------------------------

    @staticmethod
    def en_verb(verb: Verb, person: int, tense: str, neg: bool, question: bool) -> list[str]:
        """English verb group for a declarative clause (the question moves ``do``)."""
        third = person == 2
        if tense == "past":
            if neg:
                return ["didn't", *verb.en.split()]
            if question:
                return verb.en.split()
            return verb.en_past.split()
        if neg:
            return ["doesn't" if third else "don't", *verb.en.split()]
        if question:
            return verb.en.split()
        return (verb.en3 if third else verb.en).split()

    @staticmethod
    def en_aux(person: int, tense: str) -> str:
        if tense == "past":
            return "did"
        return "does" if person == 2 else "do"

    @staticmethod
    def participle(verb: Verb, gender: str, plural: bool) -> str:
        if verb.aux != "être":
            return verb.pp  # no preceding direct object in this corpus: no agreement
        return verb.pp + ("e" if gender == "f" else "") + ("s" if plural else "")

    def fr_verb(
        self, verb: Verb, person: int, gender: str, plural: bool, tense: str, neg: bool
    ) -> list[str]:
        """French verb group (``ne ... pas`` included) for a declarative clause."""
        if tense == "past":
            aux = VERB_AVOIR if verb.aux == "avoir" else VERB_ETRE
            finite = aux.present[person]
            rest = [self.participle(verb, gender, plural)]
        else:
            finite, rest = verb.present[person], []
        if neg:
            return ["ne", finite, "pas", *rest]
        return [finite, *rest]

    def clause(self, verb: Verb, tense: str, neg: bool, question: bool) -> tuple[str, str] | None:
        """A full sentence with ``verb``: statement or yes/no question, maybe negative."""
        subj = self.subject(verb.subj)
        s_en, s_fr, p, g, pl = subj.en, subj.fr, subj.person, subj.gender, subj.plural
        obj: NP | None = None
        if verb.obj and (not verb.intrans or self.chance(0.7)):
            obj = self.random_np(verb.obj, role="obj", negated=neg, generic=verb.generic)
            if obj is None:
                return None
        elif not verb.intrans and verb.fr not in ("aller", "rentrer"):
            return None
        # complements of motion
        c_en: list[str] = []
        c_fr: list[str] = []
        if verb.fr == "rentrer":
            c_fr = ["chez", subj.stress]
        elif verb.fr in ("aller", "arriver", "revenir") and (
            verb.fr == "aller" or self.chance(0.6)
        ):
            place = self.rng.choice(self.nouns({"destination"}))
            prep_en = {"aller": "to", "arriver": "at", "revenir": "from"}[verb.fr]
            prep_fr = "de" if verb.fr == "revenir" else "à"
            place_np = self.np(place, "the", False, adj_p=0)
            c_en = [prep_en, *place_np.en]
            c_fr = [prep_fr, *place_np.fr]
        t_en: list[str] = []
        t_fr: list[str] = []
        if self.chance(0.2):
            te, tf = self.rng.choice(TIME_PAST if tense == "past" else TIME_PRESENT)
            t_en, t_fr = te.split(), tf.split()
        o_en, o_fr = (obj.en, obj.fr) if obj else ([], [])
        v_fr = self.fr_verb(verb, p, g, pl, tense, neg)
        if question:
            en = [self.en_aux(p, tense), *s_en, *self.en_verb(verb, p, tense, neg, True)]
            fr_decl = [*s_fr, *v_fr]
            if verb.fr == "avoir" and tense == "present" and subj.pronoun not in ("", "i"):
                fr = [invert(verb.present[p], s_fr[0])]
            else:
                fr = ["est-ce", "que", *fr_decl]
            en += [*o_en, *c_en, *t_en, "?"]
            fr += [*o_fr, *c_fr, *t_fr, "?"]
        else:
            en = [*s_en, *self.en_verb(verb, p, tense, neg, False), *o_en, *c_en, *t_en, "."]
            fr = [*s_fr, *v_fr, *o_fr, *c_fr, *t_fr, "."]
        return " ".join(en), finish_fr(fr)

    def be_clause(self, kind: str, neg: bool, question: bool) -> tuple[str, str] | None:
        """``être`` + adjective / location / ``chez``, or an ``avoir`` idiom (``hungry``)."""
        if kind == "idiom":
            tags = frozenset({"person", "animal"})
        elif kind == "home":
            tags = frozenset({"person"})
        else:
            tags = frozenset({"person", "animal", "food", "thing", "place"})
        subj = self.subject(tags, adj_p=0.0 if kind == "adj" else 0.3)
        s_en, s_fr, p, g, pl = subj.en, subj.fr, subj.person, subj.gender, subj.plural
        noun_tags = subj.tags
        # predicate
        if kind == "adj":
            cands = [a for a in ADJECTIVES if a.pred & noun_tags]
            if not cands:
                return None
            adj = self.rng.choice(cands)
            p_en, p_fr = adj.en.split(), adj.form(g, pl).split()
        elif kind == "loc":
            prep = self.rng.choice(list(LOCATIONS))
            fr_prep, where_tags = LOCATIONS[prep]
            if not (noun_tags & {"person", "animal", "thing", "food"}):
                return None
            places = [
                n
                for n in self.nouns(set(where_tags.split()))
                if n is not subj.noun and not (noun_tags & {"person"} and "small" in n.tags)
            ]
            place_np = self.np(self.rng.choice(places), "the", False, adj_p=0.15)
            p_en, p_fr = [*prep.split(), *place_np.en], [*fr_prep, *place_np.fr]
        elif kind == "home":
            p_en, p_fr = ["home"], ["chez", subj.stress]
        else:  # avoir idiom; being right or wrong is for people
            words = [
                w for w in AVOIR_IDIOMS if "person" in noun_tags or w not in ("right", "wrong")
            ]
            word = self.rng.choice(words)
            p_en, p_fr = [word], [AVOIR_IDIOMS[word]]
        verb = VERB_AVOIR if kind == "idiom" else VERB_ETRE
        fin = verb.present[p]
        pron = PRONOUNS.get(subj.pronoun, {})
        be = pron["be"] if pron else ("are" if pl else "is")
        if question:
            en = [be, *s_en, *p_en, "?"]
            if subj.pronoun not in ("", "i"):
                fr = [invert(fin, s_fr[0]), *p_fr, "?"]
            else:
                fr = ["est-ce", "que", *s_fr, fin, *p_fr, "?"]
        else:
            if pron:
                en_sv = (pron["neg"] if neg else pron["bec"]).split()
            else:
                en_sv = [*s_en, (be + "n't") if neg else be]
            en = [*en_sv, *p_en, "."]
            fr = [*s_fr, *(["ne", fin, "pas"] if neg else [fin]), *p_fr, "."]
        return " ".join(en), finish_fr(fr)

    def where_question(self) -> tuple[str, str]:
        """``where is the cat ?`` -> ``où est le chat ?``; ``where are you ?`` -> ``où es-tu ?``"""
        if self.chance(0.3):
            name = self.rng.choice([k for k in PRONOUNS if k != "i"])
            info = PRONOUNS[name]
            return f"where {info['be']} {name} ?", finish_fr(
                ["où", invert(VERB_ETRE.present[info["p"]], info["fr"]), "?"]
            )
        np = self.random_np(frozenset({"person", "animal", "losable", "pet"}), role="subj")
        assert np is not None
        be, fin = ("are", "sont") if np.plural else ("is", "est")
        return " ".join(["where", be, *np.en, "?"]), finish_fr(["où", fin, *np.fr, "?"])

    def what_question(self) -> tuple[str, str] | None:
        """``what did she buy ?`` -> ``qu'est-ce qu'elle a acheté ?``"""
        verbs = [v for v in VERBS if v.obj & {"food", "buyable", "readable", "losable", "drink"}]
        verb = self.rng.choice(verbs)
        tense = "past" if (verb.past and self.chance(0.5)) else "present"
        subj = self.subject(verb.subj)
        s_en, s_fr, p, g, pl = subj.en, subj.fr, subj.person, subj.gender, subj.plural
        en = ["what", self.en_aux(p, tense), *s_en, *verb.en.split(), "?"]
        fr = ["qu'est-ce", "que", *s_fr, *self.fr_verb(verb, p, g, pl, tense, False), "?"]
        return " ".join(en), finish_fr(fr)

    def who_question(self) -> tuple[str, str] | None:
        """``who saw the cat ?`` -> ``qui a vu le chat ?`` (``qui`` is masculine singular)."""
        verb = self.rng.choice([v for v in VERBS if v.fr not in ("aller", "rentrer")])
        tense = "past" if (verb.past and self.chance(0.6)) else "present"
        obj: NP | None = None
        if verb.obj and (not verb.intrans or self.chance(0.6)):
            obj = self.random_np(verb.obj, role="obj", generic=verb.generic)
        elif not verb.intrans:
            return None
        en_v = verb.en_past.split() if tense == "past" else verb.en3.split()
        o_en, o_fr = (obj.en, obj.fr) if obj else ([], [])
        en = ["who", *en_v, *o_en, "?"]
        fr = ["qui", *self.fr_verb(verb, 2, "m", False, tense, False), *o_fr, "?"]
        return " ".join(en), finish_fr(fr)

    def there_is(self, neg: bool) -> tuple[str, str] | None:
        """``there are three cats in the garden .`` -> ``il y a trois chats dans le jardin .``"""
        prep = self.rng.choice(list(LOCATIONS))
        fr_prep, where_tags = LOCATIONS[prep]
        place = self.rng.choice(self.nouns(set(where_tags.split())))
        thing_tags = frozenset({"animal", "food", "losable", "dish"})
        noun = self.rng.choice([n for n in self.nouns(thing_tags) if n is not place])
        if neg:
            plural = self.chance(0.3)
            obj = self.np(noun, "a", plural, negated=True)
            en_head = ["there", "aren't" if plural else "isn't"]
            if not plural:
                en_head.append(obj.en.pop(0) if obj.en[0] in ("a", "an") else "")
            en_head = [w for w in en_head if w]
            en_head += ["any"] if plural else []
            fr_head = ["il", "ne", "y", "a", "pas"]
        else:
            if self.chance(0.5):
                obj = self.np(noun, "num", True, count=self.rng.choice(NUMBERS))
            else:
                obj = self.np(noun, "a", self.chance(0.3))
            en_head = ["there", "are" if obj.plural else "is"]
            fr_head = ["il", "y", "a"]
        place_np = self.np(place, "the", False, adj_p=0.15)
        en = [*en_head, *obj.en, *prep.split(), *place_np.en, "."]
        fr = [*fr_head, *obj.fr, *fr_prep, *place_np.fr, "."]
        return " ".join(en), finish_fr(fr)

    def imperative(self, neg: bool) -> tuple[str, str] | None:
        """``open the door .`` -> ``ouvre la porte !`` ; ``don't run .`` -> ``ne cours pas !``"""
        verbs = [v for v in VERBS if v.imp and not (neg and v.fr in ("aller", "venir"))]
        verb = self.rng.choice(verbs)
        obj: NP | None = None
        if verb.obj and (not verb.intrans or self.chance(0.7)):
            obj = self.random_np(verb.obj, role="obj", negated=neg, generic=verb.generic)
        if obj is None and not verb.intrans and verb.fr != "aller":
            return None
        c_en: list[str] = []
        c_fr: list[str] = []
        if verb.fr == "aller" and self.chance(0.5):
            place = self.rng.choice(self.nouns({"destination"}))
            place_np = self.np(place, "the", False, adj_p=0)
            c_en, c_fr = ["to", *place_np.en], ["à", *place_np.fr]
        o_en, o_fr = (obj.en, obj.fr) if obj else ([], [])
        en = [*(["don't"] if neg else []), *verb.en.split(), *o_en, *c_en, "."]
        fr = [*(["ne", verb.imp, "pas"] if neg else [verb.imp]), *o_fr, *c_fr, "!"]
        return " ".join(en), finish_fr(fr)

    # -- one random sentence ---------------------------------------------------------------

    def sentence(self) -> tuple[str, str, str] | None:
        """One random ``(english, french, template)`` or None when a draw does not fit."""
        r = self.rng.random()
        neg = self.chance(0.25)
        if r < 0.40:
            verb = self.rng.choice(VERBS)
            tense = "past" if (verb.past and self.chance(0.5)) else "present"
            question = self.chance(0.2)
            if question and neg:
                neg = False
            out = self.clause(verb, tense, neg, question)
            kind = f"verb.{tense}" + (".neg" if neg else "") + (".q" if question else "")
        elif r < 0.62:
            kind_be = self.rng.choice(("adj", "adj", "adj", "loc", "loc", "home", "idiom"))
            question = self.chance(0.2)
            if question and neg:
                neg = False
            out = self.be_clause(kind_be, neg, question)
            kind = f"be.{kind_be}" + (".neg" if neg else "") + (".q" if question else "")
        elif r < 0.72:
            out = self.there_is(neg)
            kind = "there" + (".neg" if neg else "")
        elif r < 0.84:
            out = self.imperative(neg)
            kind = "imperative" + (".neg" if neg else "")
        elif r < 0.90:
            out, kind = self.where_question(), "where.q"
        elif r < 0.95:
            out, kind = self.what_question(), "what.q"
        else:
            out, kind = self.who_question(), "who.q"
        if out is None:
            return None
        return out[0], out[1], kind


def invert(finite: str, pronoun: str) -> str:
    """Subject-verb inversion: ``es`` + ``tu`` -> ``es-tu``, ``a`` + ``il`` -> ``a-t-il``."""
    if pronoun in ("il", "elle") and finite[-1] in "ae":
        return f"{finite}-t-{pronoun}"
    return f"{finite}-{pronoun}"


VERB_ETRE = Verb(
    "être", ("suis", "es", "est", "sommes", "êtes", "sont"), "été", "avoir", "be", "is", "was"
)
VERB_AVOIR = next(v for v in VERBS if v.fr == "avoir")


def generate(size: int = 30_000, seed: int = 0, max_words: int = 15) -> list[tuple[str, str, str]]:
    """Generate ``size`` distinct ``(english, french, template)`` triples, deterministically.

    The book's four test pairs and a few fixed expressions come first. Both sides have between
    2 and ``max_words`` words (punctuation counts as a word, as the book's tokenizer sees it).

    Raises:
        RuntimeError: one English sentence was generated with two French renderings (a bug
            in the grammar), or the lexicon cannot give ``size`` distinct sentences.
    """
    grammar = Grammar(seed)
    seen: dict[str, str] = {}
    out: list[tuple[str, str, str]] = []

    def add(en: str, fr: str, kind: str) -> None:
        if en in seen:
            if seen[en] != fr:
                raise RuntimeError(f"two translations of {en!r}: {seen[en]!r} and {fr!r}")
            return
        ne, nf = len(en.split(" ")), len(fr.split(" "))
        if not (2 <= ne <= max_words and 2 <= nf <= max_words):
            return
        seen[en] = fr
        out.append((en, fr, kind))

    for en, fr in BOOK_PAIRS:
        add(en, fr, "book")
    for en, fr in FIXED:
        add(en, fr, "fixed")
    attempts = 0
    while len(out) < size:
        attempts += 1
        if attempts > 50 * size:
            raise RuntimeError(f"only {len(out)} distinct sentences after {attempts} draws")
        s = grammar.sentence()
        if s is not None:
            add(*s)
    return out


def write_corpus(path: str | Path, triples: Sequence[tuple[str, str, str]]) -> None:
    """Write ``triples`` as the fra format (3 columns), gzip when the name ends in ``.gz``.

    The gzip header carries no time stamp or name, so the same corpus gives the same bytes.
    """
    text = "".join(f"{en}\t{fr}\tqkv-generated:{kind}\n" for en, fr, kind in triples)
    data = text.encode("utf-8")
    p = Path(path)
    if p.name.endswith(".gz"):
        with (
            p.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        ):
            gz.write(data)
    else:
        p.write_bytes(data)


def main(argv: Sequence[str] | None = None, emit: Callable[[str], object] = print) -> int:
    """Command line: ``python tools/corpus_generator.py --out PATH [--size N] [--seed S]``."""
    ap = argparse.ArgumentParser(
        prog="python tools/corpus_generator.py", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", required=True, help="output file (.tsv or .tsv.gz)")
    ap.add_argument("--size", type=int, default=30_000, help="number of pairs (default 30000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)
    triples = generate(args.size, args.seed)
    write_corpus(args.out, triples)
    en_words = {w for en, _, _ in triples for w in en.split(" ")}
    fr_words = {w for _, fr, _ in triples for w in fr.split(" ")}
    emit(
        f"wrote {len(triples)} pairs to {args.out} (seed {args.seed}); "
        f"{len(en_words)} English and {len(fr_words)} French word types"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
