"""Training-throughput anchor: PyTorch on this CPU, same shape as the shipped model
(run by compare.sh beside candle's step_profile).

d_model 256, 4 heads, ffn 1024, 3+3 layers, pre-norm, vocab 8000 shared and tied,
label smoothing 0.1, Adam. Batches of B sentences x T tokens (source and target).
Prints target tokens/s for each (dtype, threads) after warm-up.
"""
import argparse, math, time
import torch, torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=96)
p.add_argument("--len", type=int, default=32)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--bf16", action="store_true")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
V, D = 8000, 256

class M(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D)
        s.t = nn.Transformer(D, 4, 3, 3, 1024, 0.1, batch_first=True, norm_first=True)
        pe = torch.zeros(512, D); pos = torch.arange(512).unsqueeze(1)
        div = torch.exp(torch.arange(0, D, 2) * (-math.log(10000.0) / D))
        pe[:, 0::2] = torch.sin(pos * div); pe[:, 1::2] = torch.cos(pos * div)
        s.register_buffer("pe", pe)
    def forward(s, src, tgt):
        e = lambda x: s.emb(x) * math.sqrt(D) + s.pe[: x.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = s.t(e(src), e(tgt), tgt_mask=mask, tgt_is_causal=True)
        return h @ s.emb.weight.t()

m = M(); opt = torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98))
loss_f = nn.CrossEntropyLoss(label_smoothing=0.1)
src = torch.randint(4, V, (a.batch, a.len)); tgt = torch.randint(4, V, (a.batch, a.len + 1))
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        logits = m(src, tgt[:, :-1])
        loss = loss_f(logits.float().reshape(-1, V), tgt[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
for _ in range(2): step()
t = time.perf_counter()
for _ in range(a.steps): step()
dt = time.perf_counter() - t
print(f"torch {torch.__version__} threads={a.threads} bf16={a.bf16} batch={a.batch}x{a.len}: "
      f"{a.batch * a.len * a.steps / dt:.0f} target tok/s ({dt / a.steps * 1000:.0f} ms/step)")
