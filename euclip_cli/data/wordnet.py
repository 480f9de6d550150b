"""WordNet 3.0, whose noun synsets name ImageNet's classes (``n01440764`` is the synset at byte offset
1440764 of WordNet 3.0's ``data.noun``): fetched by nltk's downloader into a folder of the project's,
read by nltk's corpus reader, and turned into the hypernym graph above a task's classes.

nltk does both halves (its index, checksums and unpacking; the WordNet database format), so neither is
written here; what is ours is where the data lives and which classes each ImageNet task has. HyCoCLIP
reads the same corpus through nltk but takes its edges from ImageNet's own ``is_a`` file; here they are
WordNet's hypernyms (instance hypernyms included), which that file was made from.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

from euclip_cli.errors import Failure, UsageError

WORDNET_DIR = Path("data/nltk_data")
# nltk's package id for Princeton WordNet 3.0 (``wordnet31`` and ``english_wordnet`` renumber the synsets).
PACKAGE = "wordnet"
INDEX_URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/index.xml"


def fetch(folder: Path, index_url: str = INDEX_URL) -> str:
    """Install nltk's WordNet package under ``folder`` (nltk_data layout: ``folder/corpora/wordnet``),
    unpacked; returns what nltk said of it (installed, or already up to date). A server that cannot be
    reached, an index without the package or a file failing its checksum is a ``Failure`` naming it.
    nltk writes its archive and unpacks it in place; here it does so in a staging folder, moved into ``folder``
    whole once unpacked, so that a stop never leaves a half-written ``data.noun`` for ``reader`` to read."""
    from nltk.downloader import Downloader, ErrorMessage

    from euclip_cli.rundir import files_together

    folder.mkdir(parents=True, exist_ok=True)
    downloader = Downloader(server_index_url=index_url)
    try:
        with warnings.catch_warnings():  # nltk's advice on its own index format, not the user's to act on
            warnings.simplefilter("ignore")
            # nltk's own test: the archive's size and checksum against its index, and the unpacked files' size.
            if downloader.status(PACKAGE, str(folder)) == Downloader.INSTALLED:
                return "already up to date"
            with files_together(folder) as staging:
                for message in downloader.incr_download(PACKAGE, str(staging), extract=True):
                    if isinstance(message, ErrorMessage):
                        raise Failure(f"could not fetch WordNet from {index_url}: {message.message}")
    except (OSError, ValueError) as err:  # what nltk raises rather than reports: a malformed index, a full disk
        raise Failure(f"could not fetch WordNet from {index_url}: {err}") from None
    return "installed"


def reader(folder: Path):
    """nltk's ``WordNetCorpusReader`` over the copy in ``folder`` (nothing else on nltk's search path)."""
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader
    from nltk.data import FileSystemPathPointer

    corpus = folder / "corpora" / PACKAGE
    if not (corpus / "data.noun").is_file():
        raise UsageError(f"no WordNet in {folder}: run 'euclip download wordnet --out {folder}'")
    # nltk reads corpora only under the folders on its data path (its guard against reading files planted
    # elsewhere): the folder the user named is one.
    if str(folder.resolve()) not in nltk.data.path:
        nltk.data.path.insert(0, str(folder.resolve()))
    with warnings.catch_warnings():  # nltk warns that the multilingual (OMW) functions are absent: unused
        warnings.simplefilter("ignore")
        return WordNetCorpusReader(FileSystemPathPointer(str(corpus)), None)


def hypernym_graph(wnids: list[str], folder: Path) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """``(parents, names)`` over ``wnids`` and every synset above them: each node's hypernyms (a synset
    may have several: WordNet is a graph, not a tree), and each node's synset name (``tench.n.01``).
    Nodes are named by wnid. A wnid that is not a WordNet 3.0 noun synset is a ``UsageError``."""
    wn = reader(folder)
    parents: dict[str, tuple[str, ...]] = {}
    names: dict[str, str] = {}
    todo = list(wnids)
    while todo:
        wnid = todo.pop()
        if wnid in names:
            continue
        synset = _synset(wn, wnid, folder)
        names[wnid] = synset.name()
        above = [f"n{s.offset():08d}" for s in synset.hypernyms() + synset.instance_hypernyms()]
        if above:
            parents[wnid] = tuple(sorted(above))
        todo.extend(above)
    return parents, names


def _synset(wn, wnid: str, folder: Path):
    found = None
    if len(wnid) == 9 and wnid[0] == "n" and wnid[1:].isdigit():
        with warnings.catch_warnings():  # nltk warns, then returns None, for an offset with no synset
            warnings.simplefilter("ignore")
            found = wn.synset_from_pos_and_offset("n", int(wnid[1:]))
    if found is None:
        raise UsageError(f"{wnid} is not a noun synset of the WordNet in {folder} (is it WordNet 3.0, nltk's "
                         f"'{PACKAGE}' package?)")
    return found


def imagenet_wnids(task_key: str) -> Optional[list[str]]:
    """The wnid of each class of an ImageNet task, in its label order, or None for any other task: the
    1,000 classes, and ImageNet-A's and -R's 200 among them in the same order (the lists timm ships)."""
    from importlib.resources import files

    lists = {"imagenet1k": "imagenet_synsets.txt", "imagenetv2": "imagenet_synsets.txt",
             "imagenet_sketch": "imagenet_synsets.txt", "imagenet-a": "imagenet_a_synsets.txt",
             "imagenet-r": "imagenet_r_synsets.txt"}
    if task_key not in lists:
        return None
    every = (files("timm.data") / "_info" / lists["imagenet1k"]).read_text().split()
    kept = set((files("timm.data") / "_info" / lists[task_key]).read_text().split())
    return [w for w in every if w in kept]


# The ImageNet tasks ``imagenet_wnids`` knows, in the order a report lists them.
IMAGENET_TASKS = ("imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-a", "imagenet-r")


# The synset HyCoCLIP's ImageNet tree is rooted at: every class of ImageNet is a physical entity except
# where WordNet files it under an abstraction too (a street sign is also a communication).
PHYSICAL_ENTITY = "n00001930"


def read_isa(path: Path) -> dict[str, str]:
    """A class tree in HyCoCLIP's ``imagenet_isa.txt`` form (a line ``PARENT CHILD`` per edge, wnids) as each
    node's parent. A malformed line, a node with two parents or a tree with other than one root is a
    ``UsageError`` naming the file and line."""
    parent: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read the tree {path}: {err}") from None
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise UsageError(f"{path}:{number}: expected 'PARENT CHILD' (two wnids), found {line.strip()!r}")
        above, node = fields
        if node in parent and parent[node] != above:
            raise UsageError(f"{path}:{number}: {node} has a second parent ({parent[node]}, {above}): the file "
                             f"is a graph, not a tree")
        parent[node] = above
    roots = set(parent.values()) - set(parent)
    if len(roots) != 1:
        raise UsageError(f"{path}: a tree has one root, this file has {len(roots)}" +
                         (f" ({', '.join(sorted(roots)[:5])})" if roots else " (a cycle)"))
    return parent


def write_isa(parent: dict[str, str], path: Path) -> None:
    """``parent`` in ``read_isa``'s form, parents in order and each one's children in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{above} {node}\n" for node, above in sorted(parent.items(), key=lambda e: (e[1], e[0]))))
