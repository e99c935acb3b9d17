#!/usr/bin/env python3
"""Oracle for shards/src/image_layout.rs: the tokens transformers' LlavaOnevisionProcessor
counts for images of given sizes under anyres_max_N (pinpoints 384·{1..6}², so400m-384: 729
tokens a tile), through the processor's own `_get_number_of_features`.

Run: python tests/oracles/anyres_tokens.py N HxW [HxW ...]   (a Python with transformers)
Prints one JSON list: [[height, width, tokens, best_height, best_width], ...].
"""
import json
import sys
import types

from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

max_tiles = int(sys.argv[1])
pinpoints = [[h * 384, w * 384] for h in range(1, 7) for w in range(1, 7)]
# The processor's counting methods need only these attributes of it.
proc = types.SimpleNamespace(
    image_processor=types.SimpleNamespace(image_grid_pinpoints=pinpoints),
    num_image_tokens=729,
    vision_aspect_ratio=f"anyres_max_{max_tiles}",
)
proc._get_unpadded_features = types.MethodType(LlavaOnevisionProcessor._get_unpadded_features, proc)
out = []
for size in sys.argv[2:]:
    h, w = (int(v) for v in size.split("x"))
    tokens = LlavaOnevisionProcessor._get_number_of_features(proc, h, w, 384, 384)
    bh, bw = select_best_resolution([h, w], pinpoints)
    out.append([h, w, tokens, bh, bw])
print(json.dumps(out))
