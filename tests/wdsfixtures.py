"""Local evaluation sets for tests, made from the embedded world's tasks in DataComp's formats."""

import io
import shutil
import tarfile

import numpy as np


def with_metadata(source, dest, rows_for):
    """Copy a wds task folder, adding an ``npy`` metadata row ``rows_for(label)`` per sample (as
    DataComp's WILDS and fairness shards have)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("*.tar"))
    n = int((source / "test" / "nshards.txt").read_text())
    for i in range(n):
        with tarfile.open(source / "test" / f"{i}.tar") as src, tarfile.open(dest / "test" / f"{i}.tar", "w") as out:
            for member in src.getmembers():
                data = src.extractfile(member).read()
                out.addfile(member, io.BytesIO(data))
                if member.name.endswith(".cls"):
                    buf = io.BytesIO()
                    np.save(buf, np.array(rows_for(int(data.decode())), dtype=np.int64))
                    info = tarfile.TarInfo(member.name[:-4] + ".npy")
                    info.size = buf.getbuffer().nbytes
                    buf.seek(0)
                    out.addfile(info, buf)


def first_samples(source, dest, count: int, classes=None):
    """Copy a wds task folder keeping only its first ``count`` samples (a smaller set, where a test needs
    the format and the wiring rather than the numbers); with ``classes``, only samples whose label is one
    of theirs, and they are the set's class names."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("*.tar", "nshards.txt"))
    samples: dict[str, list] = {}
    with tarfile.open(source / "test" / "0.tar") as src:
        for member in src.getmembers():
            samples.setdefault(member.name.split(".", 1)[0], []).append((member, src.extractfile(member).read()))
    kept = [key for key, files in samples.items()
            if classes is None or all(int(data) < len(classes) for m, data in files if m.name.endswith(".cls"))]
    with tarfile.open(dest / "test" / "0.tar", "w") as out:
        for key in kept[:count]:
            for member, data in samples[key]:
                out.addfile(member, io.BytesIO(data))
    (dest / "test" / "nshards.txt").write_text("1\n")
    if classes is not None:
        (dest / "classnames.txt").write_text("".join(f"{name}\n" for name in classes))
