"""The demo's recipe study, part 1 (docs/performance-notes.md, "Demo"): decodes the images of a
`make demo` run's shards, squashes them to 112x112 (bicubic), normalises them (ImageNet), runs the
frozen DINOv2-small and caches the patch features (CLS dropped) of several hidden states with the
samples' tokens, for scripts/demo/recipe/train.py.

Usage: .deps/hfvenv/bin/python scripts/demo/recipe/features.py RUN WORK   (about 2 minutes)
RUN: a `make demo` folder (shards/, val-shards/); WORK: where train.pt and val.pt go.
"""
import io, os, sys, torch, numpy as np, pyarrow.parquet as pq
from PIL import Image
from transformers import Dinov2Model
torch.set_num_threads(1)
LAYERS = [1, 2, 3, 4, 6, 8, 10, 11, 12]  # hidden_states index; 11 == [-2]
MEAN = np.array([0.485, 0.456, 0.406], np.float32); STD = np.array([0.229, 0.224, 0.225], np.float32)
if len(sys.argv) != 3:
    sys.exit(__doc__)
RUN, WORK = sys.argv[1:]
os.makedirs(WORK, exist_ok=True)
model = Dinov2Model.from_pretrained('.deps/dinov2-small').eval()
for split, path in [('val', f'{RUN}/val-shards/shard-00000.parquet'), ('train', f'{RUN}/shards/shard-00000.parquet')]:
    t = pq.read_table(path).to_pylist()
    samples, pix = [], []
    for r in t:
        s = dict(id=r['id'], input_ids=list(r['input_ids']), mask=list(r['label_mask']), img=-1,
                 caption=r['conversation'][-1]['text'] if r['conversation'] else '')
        if r['num_images'] == 1:
            im = Image.open(io.BytesIO(r['images'][0]['bytes'])).convert('RGB').resize((112, 112), Image.BICUBIC)
            a = (np.asarray(im, np.float32) / 255.0 - MEAN) / STD
            s['img'] = len(pix); pix.append(torch.from_numpy(a).permute(2, 0, 1))
        samples.append(s)
    pix = torch.stack(pix)
    feats = {l: [] for l in LAYERS}
    with torch.no_grad():
        for i in range(0, len(pix), 32):
            out = model(pixel_values=pix[i:i+32], output_hidden_states=True)
            hs = out.hidden_states
            for l in LAYERS:
                feats[l].append(hs[l][:, 1:].clone())
            print(split, i, flush=True)
    torch.save(dict(samples=samples, feats={l: torch.cat(v) for l, v in feats.items()}), f'{WORK}/{split}.pt')
    print(split, len(samples), pix.shape, flush=True)
