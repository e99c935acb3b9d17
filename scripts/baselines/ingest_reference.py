#!/usr/bin/env python3
"""The ingest a user would write in Python, as the baseline of `tessera ingest`.

LLaVA json + images folder -> parquet shards, with tessera's checks and outputs per record:
duplicate ids, the plain template's turn checks (one human turn holding one <image>, one
non-empty gpt turn), a safe relative image path, the format from the magic bytes, width and
height from the header, the 40 MP limit, a decode of the whole file (JPEG in PIL's draft mode:
libjpeg-turbo's 1/8 DCT scaling, every entropy-coded bit read, as tessera's check), the Qwen
tokenizer (HF `tokenizers`, the same tokenizer.json), the label mask of the caption, checksums
of image bytes and ids (zlib's crc32 standing in for crc32c: both are table or
instruction-driven C), shards of about --shard-size bytes written by pyarrow (snappy, images
stored as is, 256-row groups) under a temporary name, hashed (sha256) and renamed, then
index.json. Work is spread over --workers processes (multiprocessing), each writing whole
shards; the main process reads the json and checks ids.

    python ingest_reference.py --json J --images DIR --tokenizer tokenizer.json --out OUT \
        [--workers 2] [--shard-size 268435456]

Prints one JSON line: records, kept, rejected by reason, shards, seconds, records_per_s.
"""
import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import sys
import time
import zlib

IMAGE_TAG = "<image>"
IMAGE_PAD = "<|image_pad|>"
END_OF_TEXT = "<|endoftext|>"
MAX_PIXELS = 40_000_000
ROW_GROUP = 256

_state = {}


def _init(tokenizer_path, images):
    from tokenizers import Tokenizer

    _state["tok"] = Tokenizer.from_file(tokenizer_path)
    _state["pad"] = _state["tok"].token_to_id(IMAGE_PAD)
    _state["images"] = images


def _format(head):
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if len(head) >= 12 and head[0:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def _check_image(data):
    """(format, width, height) or a rejection reason."""
    from PIL import Image

    fmt = _format(data[:16])
    if fmt is None:
        return "not_an_image"
    try:
        im = Image.open(io.BytesIO(data))
        width, height = im.size
        if width == 0 or height == 0:
            return "corrupt_image"
        if width * height > MAX_PIXELS:
            return "decompression_bomb"
        if fmt == "jpeg":
            im.draft("RGB", (max(1, width // 8), max(1, height // 8)))
        im.load()
    except Exception:  # PIL raises OSError, SyntaxError, ValueError... for bad data
        return "corrupt_image"
    return fmt, width, height


def _process(record):
    """A kept row (dict) or a rejection reason (str)."""
    turns = record.get("conversations") or []
    rel = record.get("image")
    if rel is None or len(turns) != 2:
        return "bad_conversation"
    human, gpt = turns
    if human.get("from") != "human" or gpt.get("from") != "gpt":
        return "bad_conversation"
    caption = gpt.get("value", "")
    if IMAGE_TAG in caption:
        return "bad_conversation"
    if not caption.strip():
        return "empty_caption"
    tags = human.get("value", "").count(IMAGE_TAG)
    if tags != 1:
        return "missing_image_placeholder" if tags == 0 else "multiple_image_placeholders"
    if os.path.isabs(rel) or ".." in rel.split("/"):
        return "unsafe_path"
    try:
        with open(os.path.join(_state["images"], rel), "rb") as f:
            data = f.read()
    except OSError:
        return "missing_image"
    checked = _check_image(data)
    if isinstance(checked, str):
        return checked
    fmt, width, height = checked
    text = IMAGE_PAD + caption + "\n" + END_OF_TEXT
    enc = _state["tok"].encode(text, add_special_tokens=False)
    ids = enc.ids
    if ids.count(_state["pad"]) != 1:
        return "multiple_image_placeholders"
    first = len(IMAGE_PAD)
    mask = [start >= first for start, _ in enc.offsets]
    return {
        "id": str(record["id"]),
        "kind": 1,
        "image": data,
        "image_format": fmt,
        "width": width,
        "height": height,
        "conversation": [
            {"role": t["from"], "text": t["value"]} for t in turns
        ],
        "input_ids": ids,
        "label_mask": mask,
        "num_text_tokens": len(ids),
        "num_supervised_tokens": sum(mask[1:]),
        "image_crc32c": zlib.crc32(data),
        "input_ids_crc32c": zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids)),
    }


def _write_shard(job):
    """Processes one slice of records into shard `index`; returns its index entry."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    index, records, out = job
    rows, rejected = [], {}
    for record in records:
        row = _process(record)
        if isinstance(row, str):
            rejected[row] = rejected.get(row, 0) + 1
        else:
            rows.append(row)
    name = f"shard-{index:05d}.parquet"
    path, tmp = os.path.join(out, name), os.path.join(out, f".{name}.tmp")
    if rows:
        table = pa.Table.from_pylist(rows, schema=_schema())
        pq.write_table(
            table,
            tmp,
            row_group_size=ROW_GROUP,
            compression={c: ("NONE" if c == "image" else "SNAPPY") for c in table.column_names},
            use_dictionary=[c for c in table.column_names if c != "image"],
            write_statistics=[c for c in table.column_names if c != "image"],
        )
        sha = hashlib.sha256()
        with open(tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                sha.update(block)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.rename(tmp, path)
        entry = {"file": name, "rows": len(rows), "bytes": os.path.getsize(path), "sha256": sha.hexdigest()}
    else:
        entry = None
    return entry, rejected, len(rows)


def _schema():
    import pyarrow as pa

    turn = pa.struct([("role", pa.string()), ("text", pa.string())])
    return pa.schema(
        [
            ("id", pa.string()),
            ("kind", pa.uint8()),
            ("image", pa.binary()),
            ("image_format", pa.string()),
            ("width", pa.uint32()),
            ("height", pa.uint32()),
            ("conversation", pa.list_(turn)),
            ("input_ids", pa.list_(pa.uint32())),
            ("label_mask", pa.list_(pa.bool_())),
            ("num_text_tokens", pa.uint32()),
            ("num_supervised_tokens", pa.uint32()),
            ("image_crc32c", pa.uint32()),
            ("input_ids_crc32c", pa.uint32()),
        ]
    )


def _slices(records, shard_size):
    """Consecutive slices of about `shard_size` bytes of images (file sizes from stat)."""
    images = _state["images"]
    current, size = [], 0
    for record in records:
        current.append(record)
        rel = record.get("image")
        if rel is not None:
            try:
                size += os.stat(os.path.join(images, rel)).st_size
            except OSError:
                pass
        if size >= shard_size:
            yield current
            current, size = [], 0
    if current:
        yield current


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shard-size", type=int, default=256 << 20)
    args = ap.parse_args()
    started = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    with open(args.json, "rb") as f:
        records = json.load(f)
    seen, unique, duplicates = set(), [], 0
    for r in records:
        key = str(r.get("id"))
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        unique.append(r)
    _state["images"] = args.images
    jobs = ((i, part, args.out) for i, part in enumerate(_slices(unique, args.shard_size)))
    shards, rejected, kept = [], {}, 0
    if duplicates:
        rejected["duplicate_id"] = duplicates
    ctx = mp.get_context("fork")
    with ctx.Pool(args.workers, initializer=_init, initargs=(args.tokenizer, args.images)) as pool:
        for entry, rej, n in pool.imap(_write_shard, jobs):
            if entry:
                shards.append(entry)
            for k, v in rej.items():
                rejected[k] = rejected.get(k, 0) + v
            kept += n
    index = {"shards": shards, "num_samples": kept, "rejected": rejected}
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "records": len(records),
                "kept": kept,
                "rejected": rejected,
                "shards": len(shards),
                "seconds": round(seconds, 2),
                "records_per_s": round(len(records) / seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
