#!/usr/bin/env python3
"""Reference for `tessera ingest` of the_cauldron-layout parquet: the same work in Python with
pyarrow, PIL and Hugging Face `tokenizers`, timed on the same file.

Usage: .deps/hfvenv/bin/python scripts/baselines/cauldron_ingest.py IN.parquet TOKENIZER.json OUT_DIR [--workers N]

Per row, as tessera does it (ingest/src/layout/cauldron.rs, workers.rs, template.rs):
  1. read the row group (pyarrow, `images` and `texts` only);
  2. every image: PIL opens it, the format must be JPEG, PNG or WebP, the size is read from the
     header and checked against 40 M pixels, then it is decoded whole (JPEG through PIL's
     `draft` at 1/8 DCT scale, as tessera verifies at 1/8 scale; PNG and WebP fully);
  3. a row with an empty answer, or an <image> written in its texts, is rejected; the images go
     before the first user turn (one <image> each), the turns are rendered as
     ChatML (<image> framed by <|vision_start|>/<|vision_end|>) and tokenized once with
     offsets; a token is supervised when its first byte lies in an assistant turn or its
     <|im_end|>;
  4. the kept rows are written as parquet shards of about 256 MB (images stored as they came,
     token ids, label mask, a crc32 per image).
Rows are spread over WORKERS processes (default 2), a row group per task, in order.
Prints one line: rows=N images=M rejected=R seconds=S rows_per_s=X
"""
import argparse
import io
import os
import time
import zlib
from multiprocessing import Pool

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from tokenizers import Tokenizer

MAX_PIXELS = 40_000_000
SHARD_BYTES = 256 << 20
_tokenizer = None


def _init(path):
    global _tokenizer
    _tokenizer = Tokenizer.from_file(path)


def check_image(data):
    image = Image.open(io.BytesIO(data))
    if image.format not in ("JPEG", "PNG", "WEBP"):
        raise ValueError(f"format {image.format}")
    w, h = image.size
    if w * h > MAX_PIXELS:
        raise ValueError("decompression bomb")
    if image.format == "JPEG":
        image.draft("RGB", ((w + 7) // 8, (h + 7) // 8))
    image.load()
    return image.format.lower(), w, h


def render(n_images, turns):
    text, supervised = "", []
    for t, (user, answer) in enumerate(turns):
        if t == 0:
            user = "<image>" * n_images + user
        user = user.replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")
        text += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        start = len(text.encode())
        text += f"{answer}<|im_end|>"
        supervised.append((start, len(text.encode())))
        text += "\n"
    return text, supervised


def process(task):
    path, group = task
    table = pq.ParquetFile(path).read_row_group(group, columns=["images", "texts"])
    out, rejected = [], 0
    for images, texts in zip(table.column("images").to_pylist(), table.column("texts").to_pylist()):
        try:
            facts = [check_image(i["bytes"]) for i in images or []]
        except Exception:
            rejected += 1
            continue
        turns = [(t["user"], t["assistant"]) for t in texts or []]
        tags = sum(u.count("<image>") for u, _ in turns)
        if not turns or any(not a for _, a in turns) or tags != 0:
            # No answer, or an <image> in the texts: one more placeholder than images.
            rejected += 1
            continue
        text, supervised = render(len(images), turns)
        encoding = _tokenizer.encode(text, add_special_tokens=False)
        # tokenizers' offsets count characters; the supervised ranges count bytes.
        starts = [s for s, _ in encoding.offsets]
        if not text.isascii():
            char_to_byte = [len(text[:i].encode()) for i in range(len(text) + 1)]
            starts = [char_to_byte[s] for s in starts]
        mask = [any(a <= s < b for a, b in supervised) for s in starts]
        out.append({
            "images": [{"bytes": i["bytes"], "format": f, "width": w, "height": h,
                        "crc32": zlib.crc32(i["bytes"])} for i, (f, w, h) in zip(images, facts)],
            "input_ids": encoding.ids,
            "label_mask": mask,
        })
    return out, rejected


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("tokenizer")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    groups = pq.ParquetFile(args.input).metadata.num_row_groups
    tasks = [(args.input, g) for g in range(groups)]
    rows = images = rejected = shard = size = 0
    pending = []

    def flush():
        nonlocal shard, size, pending
        if pending:
            pq.write_table(pa.Table.from_pylist(pending), os.path.join(args.out, f"shard-{shard:05}.parquet"))
            shard, size, pending = shard + 1, 0, []

    with Pool(args.workers, initializer=_init, initargs=(args.tokenizer,)) as pool:
        for kept, bad in pool.imap(process, tasks):
            rejected += bad
            for row in kept:
                rows += 1
                images += len(row["images"])
                size += sum(len(i["bytes"]) for i in row["images"]) + 5 * len(row["input_ids"])
                pending.append(row)
                if size >= SHARD_BYTES:
                    flush()
    flush()
    seconds = time.perf_counter() - started
    print(f"rows={rows + rejected} images={images} rejected={rejected} seconds={seconds:.2f} "
          f"rows_per_s={(rows + rejected) / seconds:.1f}")


if __name__ == "__main__":
    main()
