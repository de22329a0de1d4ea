"""Near-miss guards: the decisive tokens two queries must share before one answers the other.

Sentence embeddings place "Which sins are forgiven?" and "Which sins are not
forgiven?" close together (0.9 and above with MiniLM), and the same for queries
that differ only in a number, a date, a name or a scope word. So a semantic hit
also needs these tokens to agree: negation, numbers (digits, number words, roman
numerals, months), named entities and scope words. Rewordings keep them, so they
still hit; the near misses that would serve a wrong answer do not.

The signature is plain JSON, stored with each entry, so the rule can be checked
on a candidate without re-reading the text it came from.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any


def _words(text: str) -> list[str]:
    return text.split()


_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*|[.!?;:]", re.UNICODE)
_CLITIC = re.compile(r"'(s|re|ve|ll|d|m)$")
_SENTENCE_END = frozenset(".!?;:")

NEGATIONS = frozenset(
    _words("""not no never without nor neither none nobody nothing nowhere cannot
    tidak bukan tanpa jangan belum tak""")
)
SCOPE = frozenset(
    _words("""all any some only every each first last most least few many both either
    always sometimes majority minority entire whole single sole except
    semua setiap hanya beberapa pertama terakhir seluruh sebagian kecuali""")
)
# Where or when, relative to something: "jumping onto the wall" and "off the wall",
# "before the flood" and "after" it. Not "in", "on", "at": rewordings move them about.
RELATIONS = frozenset(
    _words("""off out into onto inside outside under over above below beneath behind front
    top bottom up down near far away toward towards through past across along around
    beside before after sebelum sesudah setelah atas bawah luar depan belakang""")
)
MONTHS = {
    name: n
    for n, names in enumerate(
        [
            "january jan januari",
            "february feb februari",
            "march mar maret",
            "april apr",
            "may mei",
            "june jun juni",
            "july jul juli",
            "august aug agustus",
            "september sep sept",
            "october oct oktober okt",
            "november nov",
            "december dec desember des",
        ],
        start=1,
    )
    for name in names.split()
}
_UNITS = _words("""zero one two three four five six seven eight nine ten eleven twelve thirteen
fourteen fifteen sixteen seventeen eighteen nineteen""")
_TENS = _words("twenty thirty forty fifty sixty seventy eighty ninety")
NUMBER_WORDS: dict[str, int] = {w: i for i, w in enumerate(_UNITS)}
NUMBER_WORDS.update({w: 20 + 10 * i for i, w in enumerate(_TENS)})
NUMBER_WORDS.update({"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9})
NUMBER_WORDS.update(
    {
        w: i
        for i, w in enumerate(
            _words("nol satu dua tiga empat lima enam tujuh delapan sembilan sepuluh sebelas")
        )
    }
)
NUMBER_WORDS.update(
    {
        w: i
        for i, w in enumerate(
            _words("zeroth _ second third fourth fifth sixth seventh eighth ninth tenth")
        )
        if w != "_"
    }
)
NUMBER_WORDS.update({"kedua": 2, "ketiga": 3, "keempat": 4, "kelima": 5, "seratus": 100})
_ONE_BEFORE = frozenset(_words("the this that which any every each no another some"))
_ROMAN = re.compile(r"^(?=[MDCLXVI]{2,}$)M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")
_ROMAN_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
# Words that open questions and requests in capitals without naming anything.
COMMON = frozenset(
    _words("""a an the this that these those what which who whom whose when where why how
    is are was were be been do does did done can could will would shall should may might
    must has have had i you he she it we they my your his her its our their me him us them
    in on at of for to from by with about into over under after before during between
    and or but if then so as there here please tell show give list explain describe define
    summarize summarise compare find name say said according quote is let lets let's
    apa siapa bagaimana berapa kapan dimana di mana mengapa kenapa apakah adakah yang dan
    atau dalam pada untuk dari ke ini itu jelaskan sebutkan tolong menurut""")
)

# Not content for the order check: what a rewording adds, drops or moves freely.
_FUNCTION = COMMON | SCOPE | NEGATIONS | RELATIONS | frozenset(_words("being one ones"))


@dataclass(frozen=True)
class Signature:
    """The decisive tokens of a query: what a cached answer must agree on."""

    negations: int
    numbers: tuple[str, ...]
    entities: tuple[str, ...]
    scope: tuple[str, ...]
    words: tuple[str, ...]  # every lowercased word, so an entity may match in lower case
    relations: tuple[str, ...] | None = None  # sorted, repeats kept; None: an older entry's
    content: tuple[str, ...] | None = None  # the other words, in order (who did what to whom)

    def to_json(self) -> dict[str, Any]:
        return {
            "neg": self.negations,
            "num": list(self.numbers),
            "ent": list(self.entities),
            "scope": list(self.scope),
            "words": list(self.words),
            "rel": None if self.relations is None else list(self.relations),
            "seq": None if self.content is None else list(self.content),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Signature:
        return cls(
            int(doc["neg"]),
            tuple(doc["num"]),
            tuple(doc["ent"]),
            tuple(doc["scope"]),
            tuple(doc["words"]),
            None if doc.get("rel") is None else tuple(doc["rel"]),
            None if doc.get("seq") is None else tuple(doc["seq"]),
        )

    def agrees(self, other: Signature) -> bool:
        """Whether an answer to one query may answer the other."""
        if self.negations != other.negations:
            return False
        if self.numbers != other.numbers or self.scope != other.scope:
            return False
        # A name must appear in the other query, capitalised or not: "what did god
        # say" and "What did God say" are one question, "Moses" and "Aaron" are not.
        mine, theirs = set(self.words), set(other.words)
        if not (all(e in theirs for e in self.entities) and all(e in mine for e in other.entities)):
            return False
        if None not in (self.relations, other.relations) and self.relations != other.relations:
            return False
        if self.content is not None and other.content is not None:
            return not _swapped(self.content, other.content)
        return True


def _swapped(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same words in an order that exchanges roles: "the dog is teasing the monkey"
    and "the monkey is teasing the dog". Moving one phrase ("In Jakarta, what is the
    minimum wage?") keeps the roles, so that is no swap."""
    if a == b or sorted(a) != sorted(b) or len(a) > 40:
        return False
    n = len(a)
    for i in range(n):
        for j in range(i + 1, n + 1):
            rest = a[:i] + a[j:]
            for k in range(len(rest) + 1):
                if rest[:k] + a[i:j] + rest[k:] == b:
                    return False
    return True


def _roman(token: str) -> int | None:
    if not _ROMAN.match(token):
        return None
    total = 0
    for i, ch in enumerate(token):
        v = _ROMAN_VALUES[ch]
        total += -v if i + 1 < len(token) and _ROMAN_VALUES[token[i + 1]] > v else v
    return total


def signature(query: str) -> Signature:
    text = unicodedata.normalize("NFKC", query)
    negations = 0
    numbers: set[str] = set()
    entities: set[str] = set()
    scope: set[str] = set()
    words: set[str] = set()
    relations: list[str] = []
    content: list[str] = []
    start = True  # at the start of a sentence
    tokens = _TOKEN.findall(text)
    for i, token in enumerate(tokens):
        if token in _SENTENCE_END:
            start = True
            continue
        low = token.lower().replace("’", "'")
        if low.endswith("n't"):  # don't, isn't, can't
            negations += 1
            low = low[:-3]
        low = _CLITIC.sub("", low)  # what's, they're, Moses's: the word itself
        if low in NEGATIONS:
            negations += 1
        if low in SCOPE:
            scope.add(low)
        if low in RELATIONS:
            relations.append(low)
        words.add(low)
        pronoun = _pronoun_one(tokens, i, low)
        number = None if pronoun else _number(token, low, start)
        if number is None and not pronoun and low not in _FUNCTION:
            content.append(low)
        if number is not None:
            numbers.add(number)
        elif token[:1].isupper() and low not in COMMON | SCOPE | NEGATIONS:
            # A capital that opens a sentence may name nothing; agrees() forgives
            # that as long as the other query has the word too.
            entities.add(low)
        start = False
    return Signature(
        negations,
        tuple(sorted(numbers)),
        tuple(sorted(entities)),
        tuple(sorted(scope)),
        tuple(sorted(words)),
        tuple(sorted(relations)),
        tuple(content),
    )


def _pronoun_one(tokens: list[str], i: int, low: str) -> bool:
    """ "the one who", "which one", "one of": a pronoun, not a count."""
    if low != "one":
        return False
    before = tokens[i - 1].lower() if i else ""
    after = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
    return before in _ONE_BEFORE or after in ("who", "that", "which", "whom", "whose")


def _number(token: str, low: str, start: bool) -> str | None:
    if token.isdigit():
        return str(int(token))
    digits = low.replace(",", "")
    if digits.isdigit():
        return str(int(digits))
    if any(c.isdigit() for c in low):  # 3rd, 1990s, 5b
        return re.sub(r"(?<!\d)0+(?=\d)", "", low)
    if low in NUMBER_WORDS:
        return str(NUMBER_WORDS[low])
    if low in MONTHS and (
        low not in ("may", "mar", "jan", "des") or token[0].isupper() and not start
    ):
        return f"month:{MONTHS[low]}"
    roman = _roman(token)
    if roman is not None:
        return str(roman)
    return None


def agree(a: str, b: str) -> bool:
    """Whether the guards let an answer to query ``a`` answer query ``b``."""
    return signature(a).agrees(signature(b))
