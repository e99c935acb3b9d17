"""bf16 matrix products on this CPU, libtorch's native kernels against the f32 kernels over the
widened operands (what tessera's trainer/model/src/gemm.rs does on CPUs without bf16
arithmetic), each against the plain f32 product of the same shape in the same run. Shapes: the
Qwen2.5-0.5B MLP and SigLIP-so400m MLP products of a 1,489/1,458-token step, SDPA of one layer,
and the 151,936-row head at 1-64 rows (where widening the head stops paying: MIN_WIDENED_ROWS).
usage: data/hfvenv/bin/python scripts/bench/bf16_gemm_bench.py [--threads 2]
"""
import argparse, time, torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument('--threads', type=int, default=2)
torch.set_num_threads(ap.parse_args().threads)


def best(f, n=3):
    f()
    times = []
    for _ in range(n):
        s = time.perf_counter(); f(); times.append(time.perf_counter() - s)
    return min(times) * 1e3


bf = torch.bfloat16
for m, k, n in [(1489, 896, 4864), (1458, 1152, 4304), (1458, 4304, 1152)]:
    x, w, b = torch.randn(m, k).to(bf), torch.randn(n, k).to(bf), torch.randn(n).to(bf)
    native = best(lambda: F.linear(x, w, b))
    widened = best(lambda: F.linear(x.float(), w.float(), b.float()).to(bf))
    x32, w32, b32 = x.float(), w.float(), b.float()
    f32 = best(lambda: F.linear(x32, w32, b32))
    print(f'linear {m}x{k}->{n}: native bf16 {native:.1f} ms, widened {widened:.1f} ms, '
          f'f32 {f32:.1f} ms; native/f32 {native / f32:.2f}, widened/f32 {widened / f32:.2f}')
for h, L, d, causal in [(14, 1489, 64, True), (16, 729, 72, False)]:
    q, k, v = (torch.randn(1, h, L, d).to(bf) for _ in range(3))
    native = best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    widened = best(lambda: F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal).to(bf))
    print(f'sdpa heads {h} len {L} dim {d} causal {causal}: native {native:.1f} ms, widened {widened:.1f} ms')
head = torch.randn(151936, 896).to(bf)
widen = best(lambda: head.float())
head32 = head.float()
print(f'widening the 151,936 x 896 head: {widen:.1f} ms')
for rows in [1, 4, 8, 16, 31, 64]:
    h = torch.randn(rows, 896).to(bf)
    native = best(lambda: h @ head.t())
    product = best(lambda: (h.float() @ head32.t()).to(bf))
    print(f'head, {rows} rows: native {native:.1f} ms, widened product {product:.1f} ms '
          f'(+ {widen:.0f} ms to widen once)')
