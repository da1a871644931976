"""Write a tiny random-weight llama model as GGUF, for llama.cpp under the agent in the tests.

    python3 make_model.py OUT.gguf [--seed N] [--n-layer L] [--n-ff F] [--in-place]

The same arguments always give the same bytes (numpy's PCG64 seeded with --seed, no timestamps),
so a test can write "the same model" again, or another model of exactly the same size (another
--seed), or one of another size (another --n-layer / --n-ff). A few MB of f32 weights (about 3.6 MB
with the defaults): loads in llama.cpp in well under a second and answers in milliseconds.

The vocabulary is a SentencePiece-style ("llama") one: <unk>, <s>, </s>, the 256 byte-fallback
tokens and printable ASCII pieces, so any prompt tokenizes.

By default the file is written beside OUT and renamed over it (a new inode, as a deployment that
swaps a model file does); --in-place overwrites the existing file's bytes instead (same inode, same
path: a model changed in place on shared storage, which is what a memory-mapped engine sees).

Needs the PyPI packages gguf and numpy (requirements/engines.txt); the engine image has both.
"""

import argparse
import os
import sys

import numpy as np

import gguf

ARCH = "llama"


def vocabulary():
    tokens, scores, types = [], [], []

    def add(piece, score, kind):
        tokens.append(piece)
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for byte in range(256):
        add("<0x%02X>" % byte, 0.0, gguf.TokenType.BYTE)
    rank = 0
    # "\u2581" is SentencePiece's word boundary; "\u2581x" pieces make words start with one token
    for piece in ["\u2581"] + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"] + \
            [chr(c) for c in range(33, 127)]:
        rank += 1
        add(piece, -float(rank), gguf.TokenType.NORMAL)
    return tokens, scores, types


def build(path, seed=42, n_layer=4, n_embd=128, n_head=4, n_ff=352, n_ctx=512):
    rng = np.random.Generator(np.random.PCG64(seed))
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name("inferops-tiny-llama-seed%d" % seed)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def weight(*shape, scale=None):
        # numpy shape (rows, cols) is ggml's (cols, rows): (out_features, in_features)
        std = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        block = "blk.%d." % i
        writer.add_tensor(block + "attn_norm.weight", ones.copy())
        writer.add_tensor(block + "attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(block + "attn_k.weight", weight(n_embd, n_embd))
        writer.add_tensor(block + "attn_v.weight", weight(n_embd, n_embd))
        writer.add_tensor(block + "attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(block + "ffn_norm.weight", ones.copy())
        writer.add_tensor(block + "ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(block + "ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(block + "ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", ones.copy())
    # logits with a standard deviation of about 3: greedy answers depend on the prompt, and sampling at
    # temperature 1 still has many candidates (what the RNG continuity probe of the tests needs)
    writer.add_tensor("output.weight", weight(n_vocab, n_embd, scale=3.0 / np.sqrt(n_embd)))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-ff", type=int, default=352)
    parser.add_argument("--in-place", action="store_true",
                        help="overwrite the existing file's bytes (same inode) instead of renaming a new file over it")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    tmp = "%s.tmp-%d" % (out, os.getpid())
    try:
        build(tmp, seed=args.seed, n_layer=args.n_layer, n_ff=args.n_ff)
        os.chmod(tmp, 0o644)
        if args.in_place and os.path.exists(out):
            with open(tmp, "rb") as src, open(out, "r+b") as dst:
                data = src.read()
                dst.write(data)
                dst.truncate(len(data))
                dst.flush()
                os.fsync(dst.fileno())
            os.unlink(tmp)
        else:
            os.rename(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    st = os.stat(out)
    sys.stdout.write("%s %d bytes inode %d seed %d\n" % (out, st.st_size, st.st_ino, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
