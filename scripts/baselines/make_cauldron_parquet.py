#!/usr/bin/env python3
"""the_cauldron-layout parquet with embedded images, for the ingest benchmark.

Usage: python scripts/baselines/make_cauldron_parquet.py PHOTOS_DIR OUT.parquet ROWS [--seed S]

Writes ROWS rows as Hugging Face `datasets` writes an image dataset: `images` a list of Image
structs {bytes, path}, `texts` a list of {user, assistant, source} turns, row groups of 100
rows (`datasets`' row-group size for image data). Each row holds 1 to 3 images and 1 to 3
turns. The images are JPEG (quality 90) crops of the photographs under PHOTOS_DIR at
LLaVA-like sizes (short side 224-448 px); a pool of 400 crops is made first and rows draw from
it, so writing 100,000 rows takes minutes, while ingest still decodes and checks every image
of every row. Streams with a ParquetWriter: memory stays one row group.
"""
import io
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROW_GROUP = 100
POOL = 400
QUESTIONS = ["What is shown in the image?", "Describe the scene.", "What colours stand out?",
             "Is this indoors or outdoors?", "What is in the foreground?"]
ANSWERS = ["A wide landscape under an open sky.", "Soft light over water and trees.",
           "Mostly blues and greens, with a warm band near the horizon.",
           "Outdoors, far from any building.", "Grass and a few rocks."]


def photos(directory):
    found = []
    for root, _, files in os.walk(directory):
        found += [os.path.join(root, f) for f in files if f.lower().endswith((".jpg", ".jpeg", ".png"))]
    return sorted(found)


def crop_pool(paths, rng):
    pool = []
    sources = [Image.open(p).convert("RGB") for p in paths]
    for _ in range(POOL):
        src = rng.choice(sources)
        short = rng.randint(224, 448)
        aspect = rng.uniform(0.75, 1.5)
        w, h = (int(short * aspect), short) if aspect >= 1 else (short, int(short / aspect))
        scale = min(src.width / w, src.height / h)
        cw, ch = int(w * scale * rng.uniform(0.5, 1.0)), int(h * scale * rng.uniform(0.5, 1.0))
        x, y = rng.randint(0, src.width - cw), rng.randint(0, src.height - ch)
        out = io.BytesIO()
        src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BICUBIC).save(out, "JPEG", quality=90)
        pool.append(out.getvalue())
    return pool


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    photo_dir, out, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
    rng = random.Random(seed)
    pool = crop_pool(photos(photo_dir), rng)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    turn_type = pa.struct([("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])
    schema = pa.schema([("images", pa.list_(image_type)), ("texts", pa.list_(turn_type))])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with pq.ParquetWriter(out, schema) as writer:
        for start in range(0, rows, ROW_GROUP):
            images, texts = [], []
            for n in range(start, min(rows, start + ROW_GROUP)):
                picks = [rng.randrange(POOL) for _ in range(rng.randint(1, 3))]
                images.append([{"bytes": pool[p], "path": f"crop{p}.jpg"} for p in picks])
                texts.append([{"user": rng.choice(QUESTIONS), "assistant": rng.choice(ANSWERS),
                               "source": "bench"} for _ in range(rng.randint(1, 3))])
            table = pa.table({"images": pa.array(images, pa.list_(image_type)),
                              "texts": pa.array(texts, pa.list_(turn_type))}, schema=schema)
            writer.write_table(table, row_group_size=ROW_GROUP)


if __name__ == "__main__":
    main()
