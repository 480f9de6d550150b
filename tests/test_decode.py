"""The loader's decoders: a training crop from stored bytes, against open_clip's own transform."""

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from euclip_cli.data.decode import CropDecoder, Normalization, crop_tensor, draft_reduction
from euclip_cli.data.photo_shards import encode, photo
from euclip_cli.towers import build_clip, transforms_for


@pytest.fixture(scope="module")
def vit_transform():
    return transforms_for(build_clip("ViT-B-32"))[0]


def jpegs(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [encode(photo(rng, w, h)) for w, h in sizes]


def reference(transform, data, seed):
    """open_clip's transform on PIL's whole decode: OpenCLIP's worker."""
    torch.manual_seed(seed)
    return transform(Image.open(io.BytesIO(data)).convert("RGB"))


def crop(decoder, data, seed):
    torch.manual_seed(seed)
    pixels = decoder(data)
    return decoder.normalization(pixels[None])[0] if decoder.normalization else pixels


def test_the_pil_decoder_hands_over_uint8_crops_that_normalise_bitwise_to_the_transforms_output(vit_transform):
    tiny = transforms_for(build_clip("tiny"))[0]
    for transform in (vit_transform, tiny):
        decoder = CropDecoder(transform, "pil")
        for seed, data in enumerate(jpegs([(512, 384), (300, 512), (512, 512)])):
            torch.manual_seed(seed)
            pixels = decoder(data)
            assert pixels.dtype == torch.uint8 and pixels.shape == (3, *transform.transforms[0].size)
            assert torch.equal(decoder.normalization(pixels[None])[0], reference(transform, data, seed))


def test_normalization_on_a_batch_equals_torchvisions_per_crop_steps():
    crops = torch.randint(0, 256, (4, 3, 6, 5), dtype=torch.uint8)
    mean, std = (0.48, 0.45, 0.40), (0.26, 0.26, 0.27)
    steps = T.Normalize(mean, std)
    per_crop = torch.stack([steps(T.functional.to_tensor(c.permute(1, 2, 0).numpy())) for c in crops])
    assert torch.equal(Normalization(mean, std)(crops), per_crop)


@pytest.mark.parametrize("crop_hw, out_hw, expected", [
    ((486, 500), (224, 224), 2),  # a square 512-px photo's crop: half its size still covers 224
    ((365, 480), (224, 224), 1),  # a 4:3 photo's short side at 0.9 of its area: no reduction
    ((1800, 1900), (224, 224), 8),
    ((900, 900), (224, 224), 4),
    ((64, 64), (64, 64), 1),  # the embedded world: never reduced
])
def test_the_draft_reduction_is_the_largest_that_never_makes_the_final_resize_enlarge(crop_hw, out_hw, expected):
    reduction = draft_reduction(*crop_hw, *out_hw)
    assert reduction == expected
    assert crop_hw[0] // reduction >= out_hw[0] and crop_hw[1] // reduction >= out_hw[1]
    if reduction < 8:  # the next reduction would have enlarged
        bigger = {1: 2, 2: 4, 4: 8}[reduction]
        assert crop_hw[0] // bigger < out_hw[0] or crop_hw[1] // bigger < out_hw[1]


def test_the_draft_decoder_draws_the_same_crops_and_equals_pil_where_it_cannot_reduce(vit_transform):
    pil, draft = CropDecoder(vit_transform, "pil"), CropDecoder(vit_transform, "pil-draft")
    for seed, data in enumerate(jpegs([(512, 384), (384, 512), (300, 200)], seed=1)):
        assert torch.equal(crop(draft, data, seed), crop(pil, data, seed))
        # The same draws: the generator stands where open_clip's transform leaves it.
        crop(draft, data, seed)
        after_draft = torch.get_rng_state()
        reference(vit_transform, data, seed)
        assert torch.equal(after_draft, torch.get_rng_state())


def test_where_it_reduces_the_draft_decoder_differs_from_pil_by_under_a_level_on_average(vit_transform):
    pil, draft = CropDecoder(vit_transform, "pil"), CropDecoder(vit_transform, "pil-draft")
    std = torch.tensor(pil.normalization.std).view(3, 1, 1)
    for seed, data in enumerate(jpegs([(512, 512), (1024, 1024)], seed=2)):
        reduced, full = crop(draft, data, seed), crop(pil, data, seed)
        assert not torch.equal(reduced, full)  # it did take the reduced decode
        difference = ((reduced - full).abs() * std * 255)
        assert difference.mean() < 1.0 and torch.quantile(difference.flatten(), 0.99) <= 6


def test_a_png_or_a_non_standard_transform_takes_the_whole_decode(vit_transform):
    png = io.BytesIO()
    photo(np.random.default_rng(3), 512, 512).save(png, format="PNG")
    draft = CropDecoder(vit_transform, "pil-draft")
    assert torch.equal(crop(draft, png.getvalue(), 0), reference(vit_transform, png.getvalue(), 0))
    custom = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])
    decoder = CropDecoder(custom, "pil-draft")
    assert decoder.normalization is None
    data = jpegs([(512, 512)])[0]
    assert torch.equal(decoder(data), custom(Image.open(io.BytesIO(data)).convert("RGB")))


def test_crop_tensor_is_to_tensors_layout_before_its_division():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    assert torch.equal(crop_tensor(image).float().div(255), T.functional.to_tensor(image))


def test_an_unknown_decoder_is_refused(vit_transform):
    with pytest.raises(ValueError, match="not one of pil, pil-draft"):
        CropDecoder(vit_transform, "turbo")


# ---- data.decode=device: the workers hand over JPEGs and crops; the feed decodes and crops on the device

@pytest.fixture(scope="module")
def photo_shards(tmp_path_factory):
    from euclip_cli.data.photo_shards import generate

    out = tmp_path_factory.mktemp("photos") / "shards"
    generate(out, samples=24, seed=5, workers=1)
    return out


def fed_batches(shards, transform, decode_on, count=3):
    from euclip_cli.data.feed import DeviceFeed
    from euclip_cli.data.loader import TrainBatches, list_shards
    from euclip_cli.towers import tokenizer_for

    stream = TrainBatches(list_shards(shards, "x"), 8, transform, tokenizer_for("ViT-B-32"), seed=0,
                          shuffle_buffer=10, segment_steps=100, workers=1, decode_on=decode_on)
    feed = DeviceFeed(torch.device("cpu"), normalization=stream.normalization, device_crops=stream.device_crops)
    try:
        return [tuple(t.clone() for t in feed(next(stream))[:2]) for _ in range(count)], stream.skipped
    finally:
        stream.close()


def test_decoding_on_the_device_gives_the_workers_crops_to_within_a_level(photo_shards, vit_transform):
    on_workers, _ = fed_batches(photo_shards, vit_transform, "workers")
    on_device, _ = fed_batches(photo_shards, vit_transform, "device")
    std = torch.tensor(CropDecoder(vit_transform).normalization.std).view(3, 1, 1)
    for (images, tokens), (device_images, device_tokens) in zip(on_workers, on_device):
        assert torch.equal(tokens, device_tokens)  # the same samples, in the same order
        difference = (images - device_images).abs() * std * 255
        # PIL's and torchvision's antialiased bicubic resizes, each rounded to whole levels.
        assert difference.mean() < 0.5 and difference.max() <= 3.01


def test_on_the_device_a_png_or_a_cut_jpeg_is_skipped_and_counted(tmp_path, vit_transform):
    import webdataset as wds

    rng = np.random.default_rng(4)
    png = io.BytesIO()
    photo(rng, 320, 240).save(png, format="PNG")
    good = [encode(photo(rng, 320, 240)) for _ in range(8)]
    with wds.TarWriter(str(tmp_path / "00000.tar")) as sink:
        for i, data in enumerate([png.getvalue(), good[0][:-2000], *good]):
            sink.write({"__key__": f"{i:04d}", "jpg": data, "txt": "a photo"})
    batches, skipped = fed_batches(tmp_path, vit_transform, "device", count=1)
    assert batches[0][0].shape == (8, 3, 224, 224) and skipped >= 2


def test_decoding_on_the_device_is_refused_with_openclips_pipeline():
    from euclip_cli import config as C

    with pytest.raises(C.ConfigError, match="data.decode: only euclip's loader"):
        C.load_config("tiny-clip", ["data.decode=device", "data.pipeline=openclip"])
