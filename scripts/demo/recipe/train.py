"""The demo's recipe study, part 2 (docs/performance-notes.md, "Demo"): stage 1 (the projector)
and optionally stage 2 (projector + LM) in PyTorch on the features scripts/demo/recipe/features.py
cached, scored by scripts/demo/caption_score.py's rule on the first 64 held-out images; one JSON line
per run appended to WORK/results.jsonl. AdamW (weight decay 0), warmup + cosine, clip 1.0, 12
images a step, as the demo's stage 1. Seconds a run instead of the demo's minutes, so feature
layers, learning rates, seeds and a fixed per-channel standardisation of the features (`--norm
std`, statistics of the training features: not something tessera does) can be compared.
The LM: the demo's pretrained tiny Qwen2 run exactly through a compact vocabulary (its 262 used
rows; the 151,674 unused rows are exactly 0 and, when the LM trains, stay identical to each other,
so they are one shared trainable row whose logit carries + log(#unused)).

Usage: .deps/hfvenv/bin/python scripts/demo/recipe/train.py --run RUN --work WORK --layer 8 \
           --norm std --lr1 1e-2 --steps1 120 [--steps2 40] --seed 0
"""
import argparse, json, math, os, random, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2Model
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from caption_score import keys, background

p = argparse.ArgumentParser()
p.add_argument('--run', required=True, help='a `make demo` folder (model/lm)')
p.add_argument('--work', required=True, help='the folder features.py wrote')
p.add_argument('--layer', default='11', help='hidden-state index, or several joined by commas (their features concatenated, as transformers does for a list vision_feature_layer)')
p.add_argument('--norm', default='none', choices=['none', 'ln', 'lnaffine', 'std', 'tower', 'towerstd'])
p.add_argument('--lr1', type=float, default=3e-2)
p.add_argument('--steps1', type=int, default=120)
p.add_argument('--warmup', type=float, default=0.03)
p.add_argument('--wd', type=float, default=0.0)
p.add_argument('--batch', type=int, default=12)
p.add_argument('--steps2', type=int, default=0)
p.add_argument('--lr2proj', type=float, default=3e-3)
p.add_argument('--lr2lm', type=float, default=1e-3)
p.add_argument('--text2', type=int, default=1, help='stage 2 includes text-only batches')
p.add_argument('--seed', type=int, default=0)
p.add_argument('--std-images', type=int, default=0, help='standardisation statistics from the first N training images (0: all)')
p.add_argument('--clip', type=float, default=1.0)
p.add_argument('--eval_every', type=int, default=0)
p.add_argument('--tag', default='')
p.add_argument('--show', type=int, default=3)
a = p.parse_args()
torch.set_num_threads(1); torch.manual_seed(a.seed); random.seed(a.seed)
t0 = time.time()
EOS, IMG = 151643, 151655
tok = Tokenizer.from_file(f'{a.run}/model/lm/tokenizer.json')
cfgj = json.load(open(f'{a.run}/model/lm/config.json'))
W = load_file(f'{a.run}/model/lm/model.safetensors')
E = W['model.embed_tokens.weight']
used = (E.abs().sum(1) > 0).nonzero().squeeze(1)
N_UNUSED = E.shape[0] - used.numel()
to_c = {int(t): i for i, t in enumerate(used)}
cfg = Qwen2Config(vocab_size=used.numel(), hidden_size=128, intermediate_size=cfgj['intermediate_size'],
                  num_hidden_layers=cfgj['num_hidden_layers'], num_attention_heads=cfgj['num_attention_heads'],
                  num_key_value_heads=cfgj['num_key_value_heads'], hidden_act='silu', max_position_embeddings=4096,
                  rms_norm_eps=cfgj['rms_norm_eps'], rope_theta=cfgj['rope_theta'], tie_word_embeddings=True)
lm = Qwen2Model(cfg)
sd = {k[len('model.'):]: v for k, v in W.items() if k.startswith('model.')}
sd['embed_tokens.weight'] = E[used].clone()
missing = lm.load_state_dict(sd, strict=False)
assert not missing.unexpected_keys and all('rotary' in k for k in missing.missing_keys), missing
rest = nn.Parameter(torch.zeros(128))  # the shared unused row
LOGN = math.log(N_UNUSED)

def logits_of(h):
    return torch.cat([h @ lm.embed_tokens.weight.T, (h @ rest).unsqueeze(-1) + LOGN], -1)

def load(split):
    d = torch.load(f'{a.work}/{split}.pt')
    X = torch.cat([d['feats'][int(l)].float() for l in a.layer.split(',')], -1)
    out = []
    for s in d['samples']:
        if s['img'] >= 0:
            assert s['input_ids'][0] == IMG and s['input_ids'].count(IMG) == 1 and not s['mask'][0]
            ids = s['input_ids'][1:]; m = s['mask'][1:]
        else:
            ids = s['input_ids']; m = s['mask']
        out.append(dict(img=s['img'], ids=[to_c[i] for i in ids], mask=m, caption=s['caption']))
    return X, out
Xtr, Str = load('train'); Xva, Sva = load('val')
DIM = Xtr.shape[-1]
# optional feature normalisation (a model change: LayerNorm over the 384 features, per token)
class Proj(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm = nn.LayerNorm(DIM, elementwise_affine=(a.norm == 'lnaffine')) if a.norm in ('ln', 'lnaffine') else None
        s.l1 = nn.Linear(DIM, 128); s.l2 = nn.Linear(128, 128)
        if a.norm in ('tower', 'towerstd'):  # the tower's own final LayerNorm (DINOv2's get_intermediate_layers(norm=True))
            tw = load_file(f'{a.run}/model/vision/model.safetensors')
            s.tower_ln = nn.LayerNorm(DIM, eps=1e-6); s.tower_ln.weight.data = tw['layernorm.weight'].float(); s.tower_ln.bias.data = tw['layernorm.bias'].float()
            s.tower_ln.requires_grad_(False)
        if a.norm in ('std', 'towerstd'):  # fixed per-channel standardisation from train stats (foldable into l1)
            sub = Xtr[:a.std_images] if a.std_images else Xtr
            ref = s.tower_ln(sub.reshape(-1, DIM)).detach() if a.norm == 'towerstd' else sub.reshape(-1, DIM)
            mu = ref.mean(0); sd_ = ref.std(0)
            s.register_buffer('mu', mu); s.register_buffer('sd', sd_)
    def forward(s, x):
        if s.norm is not None: x = s.norm(x)
        if a.norm in ('tower', 'towerstd'): x = s.tower_ln(x)
        if a.norm in ('std', 'towerstd'): x = (x - s.mu) / s.sd
        return s.l2(F.gelu(s.l1(x)))
proj = Proj()

def batch_inputs(samples, X):
    """inputs_embeds, attention mask, targets (-100 = not supervised)."""
    has_img = samples[0]['img'] >= 0
    P = 64 if has_img else 0
    T = max(len(s['ids']) for s in samples)
    L = P + T if has_img else T
    emb = torch.zeros(len(samples), L, 128); att = torch.zeros(len(samples), L, dtype=torch.long)
    tgt = torch.full((len(samples), L), -100, dtype=torch.long)
    ids = torch.zeros(len(samples), T, dtype=torch.long)
    for r, s in enumerate(samples): ids[r, :len(s['ids'])] = torch.tensor(s['ids'])
    te = lm.embed_tokens(ids)
    if has_img:
        img = proj(X[[s['img'] for s in samples]])
        emb = torch.cat([img, te], 1)
    else:
        emb = te
    for r, s in enumerate(samples):
        n = len(s['ids']); att[r, :P + n] = 1
        for k, (i, m) in enumerate(zip(s['ids'], s['mask'])):
            if m and P + k - 1 >= 0: tgt[r, P + k - 1] = i
    return emb, att, tgt

def loss_on(samples, X):
    emb, att, tgt = batch_inputs(samples, X)
    h = lm(inputs_embeds=emb, attention_mask=att).last_hidden_state
    sel = tgt >= 0
    lg = logits_of(h[sel])
    return F.cross_entropy(lg, tgt[sel], reduction='sum'), int(sel.sum())

def sched(step, total, base):
    w = math.ceil(a.warmup * total)
    if step < w: return base * step / w
    return base * 0.5 * (1 + math.cos(math.pi * (step - w) / max(total - w, 1)))

def val_loss():
    lm.eval(); proj.eval()
    tot = n = 0
    with torch.no_grad():
        vs = [s for s in Sva if s['img'] >= 0]
        for i in range(0, len(vs), 32):
            l, k = loss_on(vs[i:i + 32], Xva); tot += l.item(); n += k
    return tot / n

def caption_score(n_img=64):
    lm.eval(); proj.eval()
    vs = [s for s in Sva if s['img'] >= 0][:n_img]
    with torch.no_grad():
        img = proj(Xva[[s['img'] for s in vs]])
        out = lm(inputs_embeds=img, use_cache=True)
        pkv = out.past_key_values; h = out.last_hidden_state[:, -1]
        gen = [[] for _ in vs]; done = [False] * len(vs)
        for _ in range(32):
            nxt = logits_of(h).argmax(-1)
            for r, t in enumerate(nxt.tolist()):
                if done[r]: continue
                if t == used.numel(): gen[r].append(-1)  # an unused id won (would be id 0)
                elif int(used[t]) == EOS: done[r] = True
                else: gen[r].append(int(used[t]))
            if all(done): break
            inp = lm.embed_tokens(nxt.clamp(max=used.numel() - 1)).unsqueeze(1)
            out = lm(inputs_embeds=inp, past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values; h = out.last_hidden_state[:, -1]
    hits = tot = 0; parts = dict(bg=0, col=0, shape=0); caps = []
    for s, g in zip(vs, gen):
        text = tok.decode([t if t >= 0 else 0 for t in g]).strip()
        caps.append((text, s['caption']))
        want = keys(s['caption'])
        if want is None: continue
        colour, shape, bg = want; said = set(text.split()); tot += 1
        hits += {colour, shape, bg} <= said
        parts['bg'] += background(text) == bg; parts['col'] += colour in said; parts['shape'] += shape in said
    return hits / tot, {k: v / tot for k, v in parts.items()}, caps

def run_stage(steps, groups, use_text, name):
    for pr in lm.parameters(): pr.requires_grad_(any(g['name'] == 'lm' for g in groups))
    rest.requires_grad_(any(g['name'] == 'lm' for g in groups))
    opt = torch.optim.AdamW([dict(params=g['params'], lr=g['lr']) for g in groups], weight_decay=a.wd, betas=(0.9, 0.999), eps=1e-8)
    imgs = [i for i, s in enumerate(Str) if s['img'] >= 0]
    txts = [i for i, s in enumerate(Str) if s['img'] < 0]
    def plan():
        random.shuffle(imgs); random.shuffle(txts)
        b = [('i', imgs[k:k + a.batch]) for k in range(0, len(imgs), a.batch)]
        if use_text: b += [('t', txts[k:k + a.batch]) for k in range(0, len(txts), a.batch)]
        random.shuffle(b); return b
    queue = []; losses = []; params = [q for g in groups for q in g['params']]
    n_img = 0
    for step in range(steps):
        if not queue: queue = plan()
        kind, idx = queue.pop(0)
        for g, pg in zip(groups, opt.param_groups): pg['lr'] = sched(step, steps, g['lr'])
        lm.train(); proj.train()
        l, k = loss_on([Str[i] for i in idx], Xtr)
        loss = l / k
        opt.zero_grad(); loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.clip); opt.step()
        if kind == 'i': losses.append(loss.item()); n_img += 1
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < steps:
            sc, pa, _ = caption_score()
            print(f'  {name} step {step+1}: loss(last10) {sum(losses[-10:])/len(losses[-10:]):.3f} val {val_loss():.3f} score {sc:.0%} {pa}', flush=True)
    fl = sum(losses[-max(1, len(losses) // 10):]) / max(1, len(losses[-max(1, len(losses) // 10):]))
    return fl, n_img

res = dict(args=vars(a))
sc, pa, _ = caption_score(); res['before'] = dict(score=sc, parts=pa, val=val_loss())
fl1, n1 = run_stage(a.steps1, [dict(name='proj', params=list(proj.parameters()), lr=a.lr1)], False, 's1')
sc, pa, caps = caption_score(); v = val_loss()
res['stage1'] = dict(final_loss=fl1, val=v, score=sc, parts=pa, steps=a.steps1)
print(f'[{a.tag}] stage1: final loss {fl1:.3f} val {v:.3f} score {sc:.0%} bg {pa["bg"]:.0%} col {pa["col"]:.0%} shape {pa["shape"]:.0%} ({time.time()-t0:.0f}s)', flush=True)
for c in caps[:a.show]: print('   ', c)
if a.steps2:
    fl2, n2 = run_stage(a.steps2, [dict(name='proj', params=list(proj.parameters()), lr=a.lr2proj),
                                   dict(name='lm', params=list(lm.parameters()) + [rest], lr=a.lr2lm)], bool(a.text2), 's2')
    sc, pa, caps = caption_score(); v = val_loss()
    res['stage2'] = dict(final_loss=fl2, val=v, score=sc, parts=pa, steps=a.steps2)
    print(f'[{a.tag}] stage2: final loss {fl2:.3f} val {v:.3f} score {sc:.0%} bg {pa["bg"]:.0%} col {pa["col"]:.0%} shape {pa["shape"]:.0%} ({time.time()-t0:.0f}s)', flush=True)
    for c in caps[:a.show]: print('   ', c)
with open(f'{a.work}/results.jsonl', 'a') as f: f.write(json.dumps(res) + '\n')
