"""Ranking tools by the words of a question: BM25F over three fields.

Pure logic, no threads: :class:`WordIndex` is built once from each tool's
words and then only read, so one index may serve many runs and threads.

A tool is three fields of words: its name, its argument names and its
descriptions (its own and its arguments'). A question's word matches a
field's word exactly, or, when it has at least three letters, as a prefix of
it (``cit`` finds ``cities``) or, from four letters, with the field's word a
prefix of it (``orders`` finds ``order``); those loose matches count half.
Each field's matches are weighted (a name most, descriptions least) and
normalised by the field's length against the average, and each question word
adds ``idf * tf * (k1 + 1) / (tf + k1)`` (Robertson's BM25F): a word that
every tool has (``in``, the service's name in every description) counts
for almost nothing, and a tool matching more of the question's words ranks
higher than one matching one word many times.

Bounded work
    A question is at most :data:`nous_sched.sdk.MAX_QUERY_WORDS` words, and
    each word follows at most :data:`MAX_LOOSE_WORDS` loose matches, so a
    question costs at most that many postings walks whatever the tool set.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence

__all__ = ["WordIndex", "MAX_LOOSE_WORDS", "KEPT_POSTINGS"]

#: Name, argument names, descriptions.
_WEIGHTS = (4.0, 2.0, 1.0)
# Long descriptions are normalised more than short names: a name's length
# says little about how much it is about a word.
_LENGTH_NORMS = (0.3, 0.5, 0.75)
_K1 = 1.2
_LOOSE = 0.5
#: Vocabulary words one question word may match loosely (the first in sorted order).
MAX_LOOSE_WORDS = 64
_MIN_PREFIX = 3
_MIN_STEM = 4
_MAX_STEM = 64
#: How many (term, document) scores one index keeps for the next questions, in all
#: (about 100 bytes each: at most about 4 MB an index; ``sdk.discovery`` keeps 8 indexes).
KEPT_POSTINGS = 40_000


class WordIndex:
    """Documents (each a tuple of three word lists) ranked against a question's words.

    ``documents[i]`` is document ``i``; :meth:`rank` returns indices. Read-only
    after construction, but for the scores of recent terms it keeps (bounded by
    :data:`KEPT_POSTINGS`, under a lock: one index serves many threads), which
    give the same ranking as scores made afresh.
    """

    def __init__(self, documents: Sequence[Sequence[Sequence[str]]]) -> None:
        self._count = len(documents)
        lengths = [[len(field) for field in fields] for fields in documents]
        averages = [
            max(1.0, sum(row[f] for row in lengths) / self._count) if self._count else 1.0 for f in range(len(_WEIGHTS))
        ]
        # word -> {document: weighted, length-normalised term frequency}
        postings: dict[str, dict[int, float]] = {}
        for doc, fields in enumerate(documents):
            for f, words in enumerate(fields):
                if not words:
                    continue
                norm = 1.0 - _LENGTH_NORMS[f] + _LENGTH_NORMS[f] * len(words) / averages[f]
                for word, tf in Counter(words).items():
                    bucket = postings.setdefault(word, {})
                    bucket[doc] = bucket.get(doc, 0.0) + _WEIGHTS[f] * tf / norm
        self._postings = postings
        self._vocabulary = sorted(postings)
        self._lock = threading.Lock()  # guards _terms and _kept
        self._terms: OrderedDict[str, dict[int, float]] = OrderedDict()
        self._kept = 0

    def rank(self, terms: Sequence[str], limit: int) -> list[int]:
        """The ``limit`` best documents for ``terms`` (distinct, lower-case words), best first.

        Documents matching no term are left out; ties go to the lower index
        (the caller orders its documents by name, so ties go to the name that
        sorts first).
        """
        scores: dict[int, float] = {}
        for term in terms:
            part = self._term(term)
            if not scores:
                scores = dict(part)
                continue
            get = scores.get
            for doc, score in part.items():
                scores[doc] = get(doc, 0.0) + score
        if not scores:
            return []
        # The limit-th best score (C, no key function), then only the documents at or above it
        # sorted: the same order as sorting them all, for a fraction of the work.
        floor = heapq.nlargest(limit, scores.values())[-1]
        best = sorted((-score, doc) for doc, score in scores.items() if score >= floor)
        return [doc for score, doc in best[:limit] if score < 0]

    def _term(self, term: str) -> dict[int, float]:
        """What ``term`` adds to each document's score (none: not there): the
        same for every question, so the last few terms' are kept (at most
        :data:`KEPT_POSTINGS` documents' in all)."""
        with self._lock:
            kept = self._terms.get(term)
            if kept is not None:
                self._terms.move_to_end(term)
                return kept
        weights: dict[int, float] = {}
        for word, share in self._matches(term):
            for doc, tf in self._postings[word].items():
                weights[doc] = weights.get(doc, 0.0) + share * tf
        df = len(weights)
        idf = math.log(1.0 + (self._count - df + 0.5) / (df + 0.5))
        part = {doc: idf * tf * (_K1 + 1.0) / (tf + _K1) for doc, tf in weights.items()}
        with self._lock:
            if term not in self._terms and len(part) <= KEPT_POSTINGS:
                self._terms[term] = part
                self._kept += len(part)
                while self._kept > KEPT_POSTINGS:
                    _, gone = self._terms.popitem(last=False)
                    self._kept -= len(gone)
        return part

    def _matches(self, term: str) -> list[tuple[str, float]]:
        found = [(term, 1.0)] if term in self._postings else []
        if len(term) >= _MIN_PREFIX:
            start = bisect.bisect_right(self._vocabulary, term)
            for word in self._vocabulary[start : start + MAX_LOOSE_WORDS]:
                if not word.startswith(term):
                    break
                found.append((word, _LOOSE))
        # Stems past the cap are not tried: an over-long question word would
        # otherwise cost its length squared.
        for end in range(_MIN_STEM, min(len(term), _MAX_STEM)):
            if term[:end] in self._postings:
                found.append((term[:end], _LOOSE))
        return found
