"""Why the verifier's graph walk saw only float32 on CUDA (bench/RESULTS.md, "On CUDA"): the
autograd graph of the mlp fixture's step walked two ways, remembering bare `id()`s of the nodes
(the tracer before its fix) and keeping the nodes themselves (after), three iterations.

    python bench/gpu_graph_walk.py      # on a machine with CUDA (else the CPU, where both agree)
"""
import torch
import torch.nn.functional as F
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
layers = [torch.nn.Linear(256, 512), torch.nn.ReLU()]
for _ in range(2):
    layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
layers += [torch.nn.Linear(512, 10)]
m = torch.nn.Sequential(*layers).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(128, 256, device=dev); y = torch.randint(0, 10, (128,), device=dev)
scaler = torch.amp.GradScaler(dev, enabled=True)

def walk(root, keep, log):
    fn = root.grad_fn; seen = {}; stack = [fn]; names = []; dts = {}; errs = []; coll = 0
    while stack:
        node = stack.pop()
        if node is None:
            continue
        if id(node) in seen:
            if keep and seen[id(node)] is not node:
                coll += 1
            continue
        seen[id(node)] = node if keep else type(node).__name__
        names.append(type(node).__name__)
        try:
            attrs = [a for a in dir(node) if a.startswith("_saved_")]
        except Exception as e:
            errs.append("dir: %r" % e); attrs = []
        for a in attrs:
            try:
                v = getattr(node, a)
            except Exception as e:
                errs.append("%s.%s: %s" % (type(node).__name__, a, str(e)[:120])); continue
            for t in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    dts[str(t.dtype)] = dts.get(str(t.dtype), 0) + 1
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    print(log, "nodes", len(names), "dtypes", dts, "errors", len(errs), errs[:4], "collisions", coll, flush=True)
    if log.endswith("it0-ids"):
        print("   order:", " ".join(names), flush=True)

for it in range(3):
    with torch.autocast(dev, dtype=torch.float16):
        loss = F.cross_entropy(m(x), y)
    s = scaler.scale(loss)
    walk(s, False, "it%d-ids" % it)
    walk(s, True, "it%d-kept" % it)
    s.backward(); scaler.step(opt); scaler.update(); opt.zero_grad()
