"""Words that are the same word in the lexical half: spelling variants and archaic forms.

A stemmer joins ``love``, ``loves`` and ``loved``, but not ``neighbor`` and ``neighbour``,
nor ``believes`` and ``believeth``: a modern query against the King James text loses
exactly its rarest words that way, and BM25 ranks on rare words. Each language may have
a normalising dictionary here (``DICTIONARIES``, by text-search configuration); English
has one: US and UK spellings (``-or``/``-our``, ``-ize``/``-ise``, ``-er``/``-re``,
``-eled``/``-elled``, a few pairs), the archaic verb endings (``-eth``, ``-est``) and
archaic words (``thee``, ``hath``, ``saith``, ``spake``, ``brethren``...).

It is applied when a query is matched, not when a chunk is indexed: ``lexical_query``
gives the query with each word in its canonical form (so ``thee`` drops out as
``you`` does, a stopword) and, for each canonical word, every form the indexed text may
have. BM25 then counts a group of forms as one term (``herd/rag/sql/queries.sql``'s
``bm25``). Since the index keeps the lexemes of the text as written, matching by group
is the same as normalising both sides, and a generation built before this module works
with it unchanged: nothing to re-index. Forms no chunk has cost nothing (BM25 skips
terms no chunk holds), so the rules may generate a few that are not words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[^\W\d_]+")
_VOWELS = set("aeiou")


@dataclass(frozen=True)
class LexicalQuery:
    """The query as BM25 reads it: ``text`` with each word canonical, and (canonical
    word, form) pairs, every form that counts as that word."""

    text: str
    words: list[str]
    forms: list[str]


class Dictionary:
    """No variants: each word is only itself."""

    def canonical(self, word: str) -> str:
        return word

    def forms(self, word: str) -> set[str]:
        return set()


# US spelling first. A UK stem also covers its inflections (honoured, neighbours).
_OUR = [
    "ardor", "armor", "behavior", "candor", "clamor", "color", "demeanor", "endeavor",
    "favor", "fervor", "flavor", "harbor", "honor", "humor", "labor", "neighbor", "odor",
    "parlor", "rancor", "rigor", "rumor", "savior", "savor", "splendor", "succor", "tumor",
    "valor", "vapor", "vigor",
]  # fmt: skip
_RE = [
    "center", "fiber", "liter", "luster", "meager", "meter", "miter", "ocher", "saber",
    "scepter", "sepulcher", "somber", "specter", "theater",
]  # fmt: skip
_PAIRS = {
    "gray": "grey", "defense": "defence", "offense": "offence", "license": "licence",
    "plow": "plough", "mold": "mould", "jewelry": "jewellery", "judgment": "judgement",
    "worshiped": "worshipped", "worshiping": "worshipping", "worshiper": "worshipper",
    "kidnaped": "kidnapped", "program": "programme", "catalog": "catalogue",
    "dialog": "dialogue", "analog": "analogue", "skeptic": "sceptic", "pajamas": "pyjamas",
    "aluminum": "aluminium", "tire": "tyre", "curb": "kerb", "draft": "draught",
    "mustache": "moustache", "maneuver": "manoeuvre", "fetus": "foetus",
    "anemia": "anaemia", "esthetic": "aesthetic", "ax": "axe", "whiskey": "whisky",
}  # fmt: skip
# Archaic word -> modern word. The modern word is what the query is matched as, so an
# archaic pronoun is a stopword as its modern one is.
_ARCHAIC = {
    "thee": "you", "thou": "you", "ye": "you", "thy": "your", "thine": "your",
    "hath": "has", "hast": "have", "hadst": "had", "doth": "does",
    "dost": "do", "didst": "did", "shalt": "shall", "wilt": "will", "canst": "can",
    "couldest": "could", "wouldest": "would", "shouldest": "should", "mayest": "may",
    "mightest": "might", "saith": "says", "sayest": "say", "spake": "spoke", "unto": "to",
    "verily": "truly", "yea": "yes", "nay": "no", "wherefore": "why", "shew": "show",
    "shewed": "showed", "sheweth": "shows", "shewing": "showing", "brethren": "brothers",
    "hungred": "hungry", "sware": "swore", "holpen": "helped", "wist": "knew", "wot": "know",
    "twain": "two", "ere": "before", "whither": "where", "thither": "there",
    "hither": "here", "peradventure": "perhaps", "goeth": "goes", "doeth": "does",
}  # fmt: skip


# Modern word -> archaic word, where the modern one is a stopword and the archaic one is
# not: "as yourself" would say nothing to BM25, and the KJV's "as thyself" names the verse.
_STOPWORD_MODERN = {"yourself": "thyself"}


class English(Dictionary):
    """Archaic words are matched as their modern ones; spellings match each other."""

    def __init__(self) -> None:
        spelled: dict[str, str] = {}  # a stem in one spelling -> the other spelling
        for us in _OUR:
            spelled[us] = us[:-2] + "our"
        for us in _RE:
            spelled[us] = us[:-2] + "re"
        spelled.update(_PAIRS)
        self._uk = {uk: us for us, uk in spelled.items()}
        self._us = spelled
        self._modern = dict(_ARCHAIC) | _STOPWORD_MODERN
        self._old: dict[str, set[str]] = {}
        for old, new in _ARCHAIC.items():
            self._old.setdefault(new, set()).add(old)
        for new, old in _STOPWORD_MODERN.items():
            self._old.setdefault(old, set()).add(new)

    def canonical(self, word: str) -> str:
        return self._modern.get(word, word)

    def forms(self, word: str) -> set[str]:
        """The forms of a canonical word: other spellings, archaic words and endings."""
        out = {word} | self._old.get(word, set())
        for table in (self._us, self._uk):
            other = self._respell(word, table)
            if other is not None:
                out.add(other)
        if re.search(r"i[sz](e|es|ed|ing|ation|ations)$", word):  # realize / realise
            out |= {_swap_last(word, "iz", "is"), _swap_last(word, "is", "iz")}
        m = re.search(r"(el)(ed|ing|er|ers)$", word)
        if m and len(word) > 6:  # traveled / travelled
            out.add(word[: m.start(2)] + "l" + m.group(2))
        m = re.search(r"(ell)(ed|ing|er|ers)$", word)
        if m and len(word) > 7:
            out.add(word[: m.start(2) - 1] + m.group(2))
        # The KJV's ligatures: Zacchæus, Cæsar, Phœbe.
        for plain, joined in (("ae", "æ"), ("oe", "œ")):
            if plain in word:
                out.add(word.replace(plain, joined))
            if joined in word:
                out.add(word.replace(joined, plain))
        for base in {*out, *_bases(word)}:
            out.add(base)
            out |= _archaic_endings(base)
        return out - {""}

    @staticmethod
    def _respell(word: str, table: dict[str, str]) -> str | None:
        for stem, other in table.items():
            if word.startswith(stem) and len(word) - len(stem) <= 4:
                return other + word[len(stem) :]
        return None


def _swap_last(word: str, old: str, new: str) -> str:
    at = word.rfind(old)
    if at < 0:
        return word
    return word[:at] + new + word[at + len(old) :]


def _bases(word: str) -> set[str]:
    """What a word may be an inflection of: ``believes`` -> ``believe``, ``loveth`` ->
    ``love``, ``crieth`` -> ``cry``, ``sinneth`` -> ``sin``."""
    out: set[str] = set()
    if len(word) == 4 and word.endswith("s") and not word.endswith("ss"):
        out.add(word[:-1])  # sins
    if len(word) < 5:
        return out
    if word.endswith(("eth", "est")):
        stem = word[:-3]
        out.add(stem)
        if stem.endswith("i"):
            out.add(stem[:-1] + "y")
        if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in _VOWELS:
            out.add(stem[:-1])
    if word.endswith(("th", "st")) and word[-3] == "e":
        out.add(word[:-2])
    if word.endswith("ies"):
        out.add(word[:-3] + "y")
    elif word.endswith("es"):
        out |= {word[:-1], word[:-2]}
    elif word.endswith("s") and not word.endswith("ss"):
        out.add(word[:-1])
    return {b for b in out if len(b) >= 3}


def _archaic_endings(base: str) -> set[str]:
    """``love`` -> ``loveth``, ``lovest``; ``cry`` -> ``crieth``; ``sin`` -> ``sinneth``."""
    if len(base) < 3 or not base.isalpha() or base.endswith(_NOT_VERBS):
        return set()
    if base.endswith("s") and not base.endswith("ss"):
        return set()
    if base.endswith("e"):
        return {base + "th", base + "st"}
    if base.endswith("y") and base[-2] not in _VOWELS:
        return {base[:-1] + "ieth", base[:-1] + "iest"}
    out = {base + "eth", base + "est"}
    # A short word's one vowel before one consonant doubles it: sinneth, setteth.
    short = len(base) <= 4 and base[-1] not in _VOWELS | {"w", "x", "y"}
    if short and base[-2] in _VOWELS and base[-3] not in _VOWELS:
        out |= {base + base[-1] + "eth", base + base[-1] + "est"}
    return out


_NOT_VERBS = ("eth", "est", "ed", "ing", "ly", "self", "selves", "ness", "our", "or")


DICTIONARIES: dict[str, Dictionary] = {"english": English()}
"""By text-search configuration (a generation's ``language``); others have none."""
_NONE = Dictionary()


def lexical_query(language: str, text: str) -> LexicalQuery:
    """The query as the lexical half matches it in ``language``."""
    dictionary = DICTIONARIES.get(language, _NONE)
    if dictionary is _NONE:
        return LexicalQuery(text, [], [])
    words: list[str] = []
    forms: list[str] = []
    seen: set[str] = set()

    def canonical(m: re.Match[str]) -> str:
        word = m.group(0).lower()
        c = dictionary.canonical(word)
        if c not in seen:
            seen.add(c)
            for form in sorted(dictionary.forms(c) | {word} | dictionary.forms(word)):
                words.append(c)
                forms.append(form)
        return c

    return LexicalQuery(_WORD.sub(canonical, text), words, forms)
