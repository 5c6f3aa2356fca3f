"""The SentencePiece models of a Hugging Face Marian (OPUS-MT) directory as Hugging Face
`tokenizer.json` files, by transformers' own converter.

    python3 marian_tokenizers.py HF_DIR OUT_DIR [--check TEXTS]

Marian has two SentencePiece models (`source.spm`, `target.spm`) over one vocabulary
(`vocab.json`, piece -> model id): a text is cut into pieces by the source model and each piece
is looked up in `vocab.json` (`MarianTokenizer`). Each model becomes a tokenizer whose ids are
`vocab.json`'s: `SpmConverter.build_tokenizer_from_spm_proto` (transformers) writes the
normalizer, pre-tokenizer, Unigram model and decoder from the model's own settings, given the
pieces in `vocab.json`'s order. A piece of `vocab.json` that this model lacks (the other
side's pieces, the special tokens) stays in the vocabulary, so that every model id decodes,
but scores -10,000 per character: SentencePiece never produces it, and the Unigram model here
takes it only where a character is unknown to this model and `MarianTokenizer` would find
that character in `vocab.json` too. `</s>`, `<unk>` and `<pad>` are special added tokens.

Writes OUT_DIR/tokenizer.json (source) and OUT_DIR/target_tokenizer.json (target). With
--check (one text a line), each line is encoded both ways (SentencePiece + vocab.json, as
`MarianTokenizer` does, against the converted source tokenizer) and decoded both ways
(SentencePiece's `decode_pieces`, as `MarianTokenizer.decode` does, against the converted
target tokenizer); the mismatches are reported. Prints a JSON report on stdout.

`nmt-export import-marian` runs this: the binary carries this file (include_str!) and runs it
with `python3 -c`, so it imports nothing but the standard library, transformers (no torch
needed), tokenizers, sentencepiece and protobuf. Checked with the tools/ package's ruff and
mypy rules (tools/check.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

try:
    import sentencepiece
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import Unigram
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
except ImportError as error:
    sys.stderr.write(
        "converting Marian's SentencePiece models runs transformers' converter: install "
        f"transformers, tokenizers, sentencepiece and protobuf ({error})\n"
    )
    sys.exit(3)

# A sentencepiece.SentencePieceProcessor (the package has no type information).
Processor = Any

SPECIAL = ["</s>", "<unk>", "<pad>"]
# Score per character of a piece the SentencePiece model lacks: far below any real path.
FOREIGN_PIECE_SCORE = -10_000.0
UNIGRAM = 1  # TrainerSpec.ModelType
NORMAL = 1  # ModelProto.SentencePiece.Type


def fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(2)


def read_vocab(path: Path) -> list[str]:
    """`vocab.json` as a list indexed by id; refuses gaps and duplicates."""
    vocab: dict[str, int] = json.loads(path.read_text(encoding="utf-8"))
    pieces: dict[int, str] = {}
    for piece, index in vocab.items():
        if index in pieces:
            fail(f"{path}: id {index} is given to both {pieces[index]!r} and {piece!r}")
        pieces[index] = piece
    if sorted(pieces) != list(range(len(pieces))):
        fail(f"{path}: ids are not 0..{len(pieces) - 1} without gaps")
    for token in SPECIAL:
        if token not in vocab:
            fail(f"{path}: no {token} token")
    return [pieces[i] for i in range(len(pieces))]


def convert(spm_path: Path, vocab: list[str]) -> Tokenizer:
    model_pb2: Any = import_protobuf()
    proto = model_pb2.ModelProto()
    proto.ParseFromString(spm_path.read_bytes())
    if proto.trainer_spec.model_type != UNIGRAM:
        fail(f"{spm_path}: model_type {proto.trainer_spec.model_type} is not Unigram (1): not converted")
    if proto.trainer_spec.byte_fallback:
        fail(f"{spm_path}: byte_fallback is set, which MarianTokenizer does not use: not converted")
    scores = {p.piece: p.score for p in proto.pieces if p.type == NORMAL}
    scored = [(piece, scores.get(piece, FOREIGN_PIECE_SCORE * max(len(piece), 1))) for piece in vocab]
    tokenizer: Tokenizer | None = SpmConverter.build_tokenizer_from_spm_proto(proto, scored)
    if tokenizer is None:
        fail(f"{spm_path}: transformers could not convert it")
    tokenizer.model = Unigram(scored, unk_id=vocab.index("<unk>"), byte_fallback=False)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL])
    return tokenizer


def marian_encode(spm: Processor, vocab: dict[str, int], text: str) -> list[int]:
    """`MarianTokenizer` without its EOS: pieces of the source model, looked up in vocab.json."""
    unk = vocab["<unk>"]
    return [vocab.get(piece, unk) for piece in spm.encode(text, out_type=str)]


def marian_decode(spm: Processor, vocab: list[str], ids: list[int]) -> str:
    """`MarianTokenizer.decode(ids, skip_special_tokens=True)`."""
    pieces = [vocab[i] for i in ids if vocab[i] not in SPECIAL]
    text: str = spm.decode_pieces(pieces)
    return text.replace("\u2581", " ").strip()


def check(hf_dir: Path, vocab: list[str], source: Tokenizer, target: Tokenizer, texts: list[str]) -> dict[str, Any]:
    source_spm = sentencepiece.SentencePieceProcessor(model_file=str(hf_dir / "source.spm"))
    decode_spm = sentencepiece.SentencePieceProcessor(model_file=str(hf_dir / "source.spm"))
    ids_of = {piece: i for i, piece in enumerate(vocab)}
    # As the server encodes: special tokens written in a text are not matched as such.
    source.encode_special_tokens = True
    encode_mismatches: list[dict[str, Any]] = []
    decode_mismatches: list[dict[str, Any]] = []
    for text in texts:
        expected = marian_encode(source_spm, ids_of, text)
        got = source.encode(text, add_special_tokens=False).ids
        if got != expected:
            encode_mismatches.append({"text": text, "marian": expected, "converted": got})
        decoded = target.decode(expected, skip_special_tokens=True)
        reference = marian_decode(decode_spm, vocab, expected)
        if decoded != reference:
            decode_mismatches.append({"text": text, "marian": reference, "converted": decoded})
    return {
        "texts": len(texts),
        "encode_mismatches": encode_mismatches,
        "decode_mismatches": decode_mismatches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--check", type=Path, help="texts, one a line, to compare both ways")
    args = parser.parse_args()
    hf_dir: Path = args.hf_dir
    for name in ["source.spm", "target.spm", "vocab.json"]:
        if not (hf_dir / name).is_file():
            fail(f"{hf_dir / name}: missing (a Marian directory has source.spm, target.spm and vocab.json)")
    vocab = read_vocab(hf_dir / "vocab.json")
    source = convert(hf_dir / "source.spm", vocab)
    target = convert(hf_dir / "target.spm", vocab)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    source.save(str(out_dir / "tokenizer.json"))
    target.save(str(out_dir / "target_tokenizer.json"))
    import tokenizers
    import transformers

    report: dict[str, Any] = {
        "tool": f"transformers {transformers.__version__} SpmConverter, tokenizers {tokenizers.__version__}",
        "vocab_size": len(vocab),
        "special": {token: vocab.index(token) for token in SPECIAL},
    }
    if args.check is not None:
        texts = [line for line in args.check.read_text(encoding="utf-8").splitlines() if line.strip()]
        report["check"] = check(hf_dir, vocab, source, target, texts)
    print(json.dumps(report, ensure_ascii=False))


if __name__ == "__main__":
    main()
