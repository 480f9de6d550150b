"""MERU's training-time caption augmentation on RedCaps: the word-segmented subreddit prefixed to a share of
the captions (``SubredditPrefix``, ``data.subreddit_prefix``), applied by the loader as it reads each sample
(the download is ``download.redcaps``)."""

from __future__ import annotations

import json
from functools import lru_cache


@lru_cache(maxsize=None)
def subreddit_words(name: str) -> str:
    """A subreddit's name as words, ``itookapicture`` -> ``i took a picture``: wordsegment's English
    unigram and bigram model, as MERU segments them (its corpus loads once per process, under a second)."""
    import wordsegment

    if not wordsegment.UNIGRAMS:
        wordsegment.load()
    return " ".join(wordsegment.segment(wordsegment.clean(name)))


class SubredditPrefix:
    """MERU's caption augmentation (its ``RedCapsTarMapper``): with ``probability``, ``"{subreddit words} :
    {caption}"``, drawn from torch's generator (which the loader seeds per batch); a sample whose json names
    no subreddit keeps its caption. Picklable, for the loader's worker processes."""

    def __init__(self, probability: float):
        self.probability = probability

    def __call__(self, sample: dict) -> str:
        import torch

        from euclip_cli.data.loader import stored_caption

        caption = stored_caption(sample)
        subreddit = json.loads(sample["json"]).get("subreddit") if "json" in sample else None
        if not subreddit or torch.rand(()).item() >= self.probability:
            return caption
        return f"{subreddit_words(subreddit)} : {caption}"
