#!/usr/bin/env python3
"""The same samples in three input layouts, from real photo crops, for tests/layouts.rs.

Usage: .deps/venv/bin/python tests/support/layouts.py PHOTOS_DIR OUT_DIR [--rows N]

PHOTOS_DIR holds JPEGs (searched recursively, sorted by path; `tessera synth --photos` crops of
real photographs); the first 12 are used. OUT_DIR gets:
  cauldron/train.parquet   the_cauldron's layout, written by pyarrow as `datasets` does:
                           images: list<struct<bytes: binary, path: string>>,
                           texts: list<struct<user, assistant, source: string>>; row groups of 3
  messages/train.parquet   TRL's layout: messages: list<struct<role, content: list<struct<type,
                           text>>>>, images: list<struct<path, bytes>> (the other field order)
  onevision/train.json     LLaVA-OneVision's json, `image` a path or a list; images/ beside it

Rows (ids `train:N` in the parquet layouts, the same ids in the json):
  0  1 image, one turn                        kept
  1  2 images, one turn                       kept
  2  3 images, one turn                       kept
  3  1 image, three turns                     kept
  4  no image, two turns                      kept
  5  2 images, the second truncated           rejected corrupt_image
  6  2 images but 1 placeholder (cauldron: an extra <image> in the text, so 3 for 2)
                                              rejected image_placeholder_mismatch
  7  2 images, two turns                      kept
  8  a video (json and messages only)         rejected video_unsupported
Images stand before the first user turn, one <image> each (nanoVLM's rule, which ingest applies
to the_cauldron): the json and the messages parts say the same thing explicitly.
  pair/a.png, pair/b.png   two 64x64 crops of photos 0 and 1 (the tiny preset's image size, so
                           no resize stands between tessera's pixels and transformers')
With --rows N: only big/train.parquet, N cauldron rows of 1 to 3 images (cycling over the
photos), row groups of 16 (a larger input to interrupt and resume).
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

ROWS = [
    ([0], [("What is in this photo?", "A landscape under a wide sky.")]),
    ([1, 2], [("Compare the two photos.", "The first one is brighter.")]),
    ([3, 4, 5], [("Which of the three photos is darkest?", "The second one.")]),
    ([6], [("Describe the photo.", "Trees by the water."),
           ("What season is it?", "Autumn, by the colours."),
           ("Is it sunny?", "No, the light is soft.")]),
    ([], [("Name a colour.", "Blue."), ("Another one?", "Green.")]),
    ([7, "corrupt"], [("Compare these two.", "They differ.")]),
    ([8, 9], [("How many photos?", "Two.")]),
    ([10, 11], [("What do the photos share?", "Both show the sky."),
                ("Which is wider?", "The first.")]),
]
CORRUPT_ROW, MISMATCH_ROW = 5, 6


def photos(directory):
    found = []
    for root, _, files in os.walk(directory):
        found += [os.path.join(root, f) for f in files if f.lower().endswith((".jpg", ".jpeg"))]
    found.sort()
    if len(found) < 12:
        sys.exit(f"{directory}: {len(found)} JPEGs, 12 needed")
    return [open(p, "rb").read() for p in found[:12]]


def image_bytes(jpegs, ref):
    if ref == "corrupt":
        whole = jpegs[0]
        return whole[: len(whole) // 2]
    return jpegs[ref]


def image_name(ref):
    return "corrupt.jpg" if ref == "corrupt" else f"p{ref}.jpg"


def cauldron(jpegs, out):
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    turn_type = pa.struct([("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])
    images, texts = [], []
    for n, (refs, turns) in enumerate(ROWS):
        images.append([{"bytes": image_bytes(jpegs, r), "path": image_name(r)} for r in refs])
        rows = [{"user": u, "assistant": a, "source": "tessera-test"} for u, a in turns]
        if n == MISMATCH_ROW:
            rows[0]["user"] = "<image>" + rows[0]["user"]
        texts.append(rows)
    table = pa.table({"images": pa.array(images, pa.list_(image_type)),
                      "texts": pa.array(texts, pa.list_(turn_type))})
    os.makedirs(os.path.join(out, "cauldron"), exist_ok=True)
    pq.write_table(table, os.path.join(out, "cauldron", "train.parquet"), row_group_size=3)


def message_turns(refs, turns, row):
    placed = 1 if row == MISMATCH_ROW else len(refs)
    out = []
    for t, (user, answer) in enumerate(turns):
        parts = [{"type": "image", "text": None}] * (placed if t == 0 else 0)
        parts = parts + [{"type": "text", "text": user}]
        out.append({"role": "user", "content": parts})
        out.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return out


def messages(jpegs, out):
    part = pa.struct([("type", pa.string()), ("text", pa.string())])
    message = pa.struct([("role", pa.string()), ("content", pa.list_(part))])
    image_type = pa.struct([("path", pa.string()), ("bytes", pa.binary())])
    all_messages, images = [], []
    for n, (refs, turns) in enumerate(ROWS):
        all_messages.append(message_turns(refs, turns, n))
        images.append([{"path": image_name(r), "bytes": image_bytes(jpegs, r)} for r in refs])
    all_messages.append([
        {"role": "user", "content": [{"type": "video", "text": None},
                                     {"type": "text", "text": "What happens?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A bird lands."}]},
    ])
    images.append([])
    table = pa.table({"messages": pa.array(all_messages, pa.list_(message)),
                      "images": pa.array(images, pa.list_(image_type))})
    os.makedirs(os.path.join(out, "messages"), exist_ok=True)
    pq.write_table(table, os.path.join(out, "messages", "train.parquet"))


def onevision(jpegs, out):
    folder = os.path.join(out, "onevision")
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    records = []
    for n, (refs, turns) in enumerate(ROWS):
        for r in refs:
            with open(os.path.join(folder, "images", image_name(r)), "wb") as f:
                f.write(image_bytes(jpegs, r))
        placed = 1 if n == MISMATCH_ROW else len(refs)
        conversations = []
        for t, (user, answer) in enumerate(turns):
            tags = "<image>" * placed if t == 0 else ""
            conversations.append({"from": "human", "value": tags + user})
            conversations.append({"from": "gpt", "value": answer})
        record = {"id": f"train:{n}", "conversations": conversations}
        names = [image_name(r) for r in refs]
        if len(names) == 1:
            record["image"] = names[0]
        elif names:
            record["image"] = names
        records.append(record)
    records.append({"id": f"train:{len(ROWS)}", "video": "clip.mp4", "conversations": [
        {"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "A bird lands."}]})
    with open(os.path.join(folder, "train.json"), "w") as f:
        json.dump(records, f, indent=1)


def pair(photo_dir, out):
    from PIL import Image

    found = sorted(os.path.join(root, f) for root, _, files in os.walk(photo_dir)
                   for f in files if f.lower().endswith((".jpg", ".jpeg")))
    os.makedirs(os.path.join(out, "pair"), exist_ok=True)
    for name, path in zip(("a", "b"), found[:2]):
        with Image.open(path) as image:
            side = min(image.size)
            square = image.convert("RGB").crop((0, 0, side, side)).resize((64, 64), Image.BICUBIC)
            square.save(os.path.join(out, "pair", f"{name}.png"))


def big(jpegs, out, rows):
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    turn_type = pa.struct([("user", pa.string()), ("assistant", pa.string()), ("source", pa.string())])
    images, texts = [], []
    for n in range(rows):
        count = 1 + n % 3
        refs = [(n + k) % len(jpegs) for k in range(count)]
        images.append([{"bytes": jpegs[r], "path": f"p{r}.jpg"} for r in refs])
        texts.append([{"user": f"Describe photo set {n}.", "assistant": f"Set {n} holds {count} photos.",
                       "source": "tessera-test"}])
    table = pa.table({"images": pa.array(images, pa.list_(image_type)),
                      "texts": pa.array(texts, pa.list_(turn_type))})
    os.makedirs(os.path.join(out, "big"), exist_ok=True)
    pq.write_table(table, os.path.join(out, "big", "train.parquet"), row_group_size=16)


def main():
    args = sys.argv[1:]
    if len(args) == 4 and args[2] == "--rows":
        big(photos(args[0]), args[1], int(args[3]))
        return
    if len(args) != 2:
        sys.exit(__doc__)
    jpegs = photos(args[0])
    cauldron(jpegs, args[1])
    messages(jpegs, args[1])
    onevision(jpegs, args[1])
    pair(args[0], args[1])


if __name__ == "__main__":
    main()
