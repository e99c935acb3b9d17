#!/usr/bin/env python3
"""Reads every shard of a tessera shard directory with pyarrow.parquet and checks it against
index.json: row counts, row groups, schema columns, token totals, and per-row invariants
(input_ids / label_mask lengths, image magic bytes vs each image's format, one placeholder
per image). Exit 0 when all agree.

usage: check_pyarrow.py SHARD_DIR
"""
import json
import os
import sys

import pyarrow.parquet as pq

COLUMNS_V1 = ["id", "kind", "image", "image_format", "width", "height", "conversation",
              "input_ids", "label_mask", "num_text_tokens", "num_supervised_tokens", "image_crc32c"]
# Format 2 added the crc32c of the token ids' little-endian bytes; format 3 holds a list of
# images per sample ({bytes, format, width, height, crc32c}) and their count.
COLUMNS_V3 = ["id", "kind", "images", "num_images", "conversation", "input_ids", "label_mask",
              "num_text_tokens", "num_supervised_tokens", "input_ids_crc32c"]
COLUMNS = {1: COLUMNS_V1, 2: COLUMNS_V1 + ["input_ids_crc32c"], 3: COLUMNS_V3}
MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG", "webp": b"RIFF"}


def check(directory):
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    total = 0
    for shard in index["shards"]:
        name = shard["file"]
        parquet = pq.ParquetFile(os.path.join(directory, name))
        meta = parquet.metadata
        assert meta.num_rows == shard["rows"], f"{name}: {meta.num_rows} rows, index says {shard['rows']}"
        assert meta.num_row_groups == len(shard["row_groups"]), f"{name}: row group count differs"
        for g, info in enumerate(shard["row_groups"]):
            assert meta.row_group(g).num_rows == info["rows"], f"{name}: row group {g} rows differ"
        table = parquet.read()
        columns = COLUMNS[index["format_version"]]
        assert table.column_names == columns, f"{name}: columns {table.column_names}"
        rows = table.to_pylist()
        assert sum(r["num_text_tokens"] for r in rows) == shard["num_text_tokens"], f"{name}: token total"
        assert sum(r["num_supervised_tokens"] for r in rows) == shard["num_supervised_tokens"]
        for i, r in enumerate(rows):
            where = f"{name} row {i} ({r['id']})"
            assert r["kind"] in (0, 1), where
            assert len(r["input_ids"]) == r["num_text_tokens"] == len(r["label_mask"]), where
            assert sum(r["label_mask"][1:]) == r["num_supervised_tokens"], where
            if index["format_version"] >= 3:
                images = [(i["bytes"], i["format"]) for i in r["images"]]
                assert len(images) == r["num_images"], where
            else:
                images = [] if r["image"] is None else [(r["image"], r["image_format"])]
            assert (r["kind"] == 1) == (len(images) > 0), where
            for data, fmt in images:
                assert data[:4].startswith(MAGIC[fmt]), where
            assert r["input_ids"].count(index["image_placeholder_id"]) == len(images), where
            assert all(isinstance(t["role"], str) and isinstance(t["text"], str) for t in r["conversation"]), where
        total += meta.num_rows
    assert total == index["num_samples"], f"{total} rows, index says {index['num_samples']}"
    print(f"pyarrow ok: {len(index['shards'])} shards, {total} rows")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        check(sys.argv[1])
    except AssertionError as e:
        sys.exit(f"pyarrow check failed: {e}")
