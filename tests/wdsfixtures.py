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
