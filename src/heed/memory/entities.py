"""Entity extraction without an LLM: capitalized phrases and given entities.

Heuristics, in order:

- entities the caller gave (``item.entities``) are kept as written;
- runs of capitalized words ("Caroline", "New York", "LGBTQ support group" is
  not one) that are not sentence-initial common words, pronouns, weekdays,
  months or interjections;
- a speaker label at the start of a dialogue turn ("Melanie: ...");
- an abbreviation's full stop ("St. Mary's", "Mt. Fuji", "Dr. Lee") ends neither the
  sentence nor the phrase: "St" alone is not an entity.

Names are canonicalized by case-folding and collapsing whitespace, which is
what entity links and the entity arm of recall match on.

Given entities belong to an item, not to each of its units: :func:`assign_given` links
each to the units that name it, and one no unit names to the item's first unit only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from heed.memory.models import EntityRef

__all__ = ["assign_given", "canonical", "extract_entities", "query_entity_names"]

_WORD = re.compile(r"[A-Z][\w'\u2019&.-]*[\w]|[A-Z]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_TOKEN = re.compile(r"\S+")
#: Words written with a full stop that does not end a sentence (lower case, no stop).
_ABBREVIATIONS = frozenset(
    [
        "st",
        "mt",
        "ft",
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "gen",
        "col",
        "capt",
        "lt",
        "sgt",
        "rev",
        "hon",
        "vs",
        "etc",
    ]
)


def _is_abbreviation(token: str) -> bool:
    return token.endswith(".") and token[:-1].lower() in _ABBREVIATIONS


def _sentences(text: str) -> Iterable[str]:
    """*text* split into sentences, except after an abbreviation ("St. Mary's")."""
    start = 0
    for m in _SENTENCE_END.finditer(text):
        before = text[start : m.start()].rsplit(None, 1)
        if "\n" not in m.group() and before and _is_abbreviation(before[-1]):
            continue
        yield text[start : m.start()]
        start = m.end()
    yield text[start:]


_STOP_TEXT = """
    I I'm I've I'd I'll Me My Mine We We're We've Our Us You You're You've Your Yours He She It They
    Them Their His Her Hers Its This That These Those There Here What When Where Why How Who Whom
    Which Whose The A An And But Or So If Then Than Yes No Not Oh Ah Hey Hi Hello Wow Thanks Thank
    Ok Okay Well Sure Yeah Yep Nope Also Just Really Very Great Good Nice Cool Awesome Love Congrats
    Congratulations Sounds Glad Sorry Haha Lol Omg Wow Aw Aww Absolutely Definitely Totally Monday
    Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
    August September October November December Today Tomorrow Yesterday Tonight Last Next In On At
    For With From By To Of As Is Are Was Were Be Been Being Do Does Did Have Has Had Can Could Will
    Would Should Shall Must Might Let Lets Let's Please Maybe Perhaps Anyway Btw Plus After Before
    During Since Until While Because Although Though Even Still Yet Every Each All Some Any Both
    Either Neither One Two Three First Second Mr Mrs Ms Dr It's That's There's What's Here's Don't
    Didn't Can't Won't Isn't Wasn't Aren't Haven't Hasn't Doesn't
    Honestly Actually Basically Seriously Finally Hopefully Luckily Unfortunately Fortunately
    Apparently Obviously Recently Lately Usually Normally Probably Certainly Clearly Personally
    Literally Suddenly Eventually Currently Especially Generally Sometimes Often However
    Meanwhile Besides Otherwise Instead Anyways Alright Right Exactly Indeed Interesting Amazing
    Wonderful Speaking Talking Thinking Looking Having Being Getting Feeling Now Soon Later Once
    Again Never Always Almost Only Another Other Such Much Many More Most Few Lots Something
    Nothing Everything Anything Someone Everyone Anyone Nobody Everybody
"""
_STOP = {word.lower() for word in _STOP_TEXT.split()}


def canonical(name: str) -> str:
    """The matching key of an entity name: case-folded, single-spaced, trimmed."""
    return " ".join(name.casefold().split()).strip(" .,'\u2019\"")


def _sentence_phrases(sentence: str) -> Iterable[str]:
    tokens = _TOKEN.findall(sentence)
    run: list[str] = []
    for index, raw in enumerate(tokens):
        word = raw.strip("\"'\u201c\u201d\u2018\u2019()[]{},;:!?.")
        is_cap = bool(word) and word[0].isupper() and _WORD.fullmatch(word) is not None
        stop = word.lower() in _STOP or word.lower().rstrip("'s\u2019") in _STOP
        if is_cap and not (stop and (index == 0 or not run)):
            if index == 0 and len(word) <= 2 and not word.isupper():
                continue
            run.append(word)
        else:
            if run:
                yield " ".join(run)
            run = []
        if run and _is_abbreviation(raw):
            run[-1] = raw  # "St." keeps its stop and goes on: "St. Mary"
            continue
        if raw[-1:] in ",;:!?." and run:
            yield " ".join(run)
            run = []
    if run:
        yield " ".join(run)


def _clean(phrase: str) -> str:
    phrase = re.sub(r"(?:'s|\u2019s)$", "", phrase)
    return phrase.strip(" -.'\u2019")


def extract_entities(
    text: str, given: Iterable[EntityRef] = (), speaker: str | None = None
) -> list[EntityRef]:
    """Entities of *text*: the given ones, the speaker, then capitalized phrases (deduplicated)."""
    seen: set[str] = set()
    out: list[EntityRef] = []

    def add(name: str, type_: str | None) -> None:
        key = canonical(name)
        if len(key) < 2 or key in seen or key in _STOP:
            return
        seen.add(key)
        out.append(EntityRef(name=name.strip(), type=type_))

    for entity in given:
        add(entity.name, entity.type)
    if speaker:
        add(speaker, "person")
    for sentence in _sentences(text):
        for phrase in _sentence_phrases(sentence):
            cleaned = _clean(phrase)
            if cleaned:
                add(cleaned, None)
    return out


_NAME_WORD = re.compile(r"\w+")


def _name_words(text: str) -> tuple[str, ...]:
    return tuple(_NAME_WORD.findall(text.casefold()))


def assign_given(texts: Sequence[str], given: Sequence[EntityRef]) -> list[list[EntityRef]]:
    """The given entities of an item for each of its units (*texts*, in order).

    An entity the caller gives for an item is a fact about the item, not about each of its
    sentences: linked to every unit, an item of 2,800 sentences with 5,000 entities made
    14 million entity rows, each unit "about" everything. So an entity goes to the units
    whose text names it (its words, case-folded, in order: "St. Mary's" names "St Mary"),
    and one no unit names goes to the item's first unit alone, where the entity arm of
    recall finds the item's start. A one-unit item (a chat message, a note) gets all of
    them, as before. Linear in the item's words times the distinct word counts of the
    names, never units times entities; each unit keeps the given order.
    """
    chosen: list[set[int]] = [set() for _ in texts]
    if not texts or not given:
        return [[] for _ in texts]
    by_words: dict[tuple[str, ...], list[int]] = {}
    for i, entity in enumerate(given):
        words = _name_words(entity.name)
        if words:
            by_words.setdefault(words, []).append(i)
    lengths = sorted({len(words) for words in by_words})
    named: set[int] = set()
    for unit, text in enumerate(texts):
        words = _name_words(text)
        for n in lengths:
            for start in range(len(words) - n + 1):
                hit = by_words.get(words[start : start + n])
                if hit:
                    chosen[unit].update(hit)
        named |= chosen[unit]
    chosen[0].update(i for i in range(len(given)) if i not in named)
    return [[given[i] for i in sorted(indices)] for indices in chosen]


def query_entity_names(query: str) -> list[str]:
    """Canonical entity names mentioned in a query (capitalized phrases, any position)."""
    names: dict[str, None] = {}  # ordered and linear: a long query has many phrases
    for sentence in _sentences(query):
        for phrase in _sentence_phrases(sentence):
            key = canonical(_clean(phrase))
            if key and key not in _STOP:
                names[key] = None
    return list(names)
