#!/usr/bin/env python3
"""Python tiktoken's side of the GPT-2 tokenizer test (core/tests/gpt2_tokenizer.rs).

Encodes testdata/gpt2-tokenizer/text.txt with tiktoken's `gpt2` encoding (`encode_ordinary`, as
nanoGPT's prepare.py does) and writes the ids to testdata/gpt2-tokenizer/ids.json.

tiktoken downloads GPT-2's files from the internet; this builds the encoding offline instead,
from the copies inside the tiktoken-rs crate's source (cargo fetches it with the workspace):
GPT-2's own vocab.bpe and encoder.json, checked against the hashes tiktoken_ext/openai_public.py
pins, with the splitting pattern and special token from that module. It also checks that the
r50k_base ranks the Rust crate embeds are the same ranks, so the ids below are GPT-2's.

Run: pip install --target /tmp/pytik tiktoken
     PYTHONPATH=/tmp/pytik python3 scripts/gpt2_tokenizer_fixture.py [TIKTOKEN_RS_ASSETS_DIR]
"""

import glob
import json
import os
import sys
from pathlib import Path

# No download cache: every file is read from the local paths below.
os.environ["TIKTOKEN_CACHE_DIR"] = ""

import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe  # noqa: E402
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "testdata" / "gpt2-tokenizer"
# The hashes tiktoken_ext/openai_public.py pins for gpt2() and r50k_base().
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
R50K_BASE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def assets_dir() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    found = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/src/*/tiktoken-rs-*/assets")))
    if not found:
        sys.exit("tiktoken-rs's source is not in ~/.cargo/registry: run `cargo fetch`, or give its assets/ folder")
    return Path(found[-1])


def main():
    assets = assets_dir()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(assets / "vocab.bpe"),
        encoder_json_file=str(assets / "encoder.json"),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    r50k = load_tiktoken_bpe(str(assets / "r50k_base.tiktoken"), expected_hash=R50K_BASE_SHA256)
    assert ranks == r50k, "r50k_base's ranks differ from GPT-2's"
    enc = tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=50257,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: 50256},
    )
    text = (FIXTURE / "text.txt").read_bytes().decode("utf-8")
    ids = enc.encode_ordinary(text)
    assert enc.decode(ids) == text
    out = {
        "encoding": "gpt2",
        "method": "encode_ordinary",
        "tiktoken": tiktoken.__version__,
        "text": "text.txt",
        "ids": ids,
    }
    (FIXTURE / "ids.json").write_text(json.dumps(out) + "\n")
    print(f"{len(text)} characters, {len(ids)} ids -> {FIXTURE / 'ids.json'}")


if __name__ == "__main__":
    main()
