"""Tiny random Hugging Face Marian (OPUS-MT) models and transformers' own outputs on them: the
fixtures that `model-export/tests/marian.rs` holds `nmt-export import-marian` to.

For each configuration: SentencePiece models trained on the fly (`sentencepiece`, Unigram, one
on English lines, one on Spanish lines) and one shared `vocab.json` as OPUS-MT has them
(`</s>` 0, `<unk>` 1, the pieces, `<pad>` last), saved by `MarianTokenizer.save_pretrained`; a
`MarianMTModel` built from `MarianConfig` with random weights (every matrix, norm, bias and
`final_logits_bias` drawn, so that no trap hides behind a zero or a one), saved by
`save_pretrained` (safetensors); `bad_words_ids` [[pad]] and `forced_eos_token_id` 0 as OPUS-MT
configs have them. Then the references, in `reference.json`:

- `generate(num_beams=1, do_sample=False)` on every input, one at a time, with the budget the
  server gives a text (`ceil(2 * source subwords) + 10`, at most the model's
  `max_position_embeddings - 1`): `max_new_tokens` is that budget plus one, the step where
  `forced_eos_token_id` ends a text that has not ended (the server stops there instead);
- `MarianTokenizer`'s ids of every input (EOS included) and its decoding of each output;
- teacher-forced logits (the model's forward pass, no generation rules) along random
  target tokens of a few inputs;
- the round-trip report of the converted tokenizers (`model-export/python/marian_tokenizers.py`,
  run on the saved directory), which ship beside the model.

    python3 -m nmt_tools.marian.fixture --out model-export/tests/fixtures/marian

writes the committed fixture (`tiny-swish`); `--sweep` adds the wider set (other activations,
sizes, `scale_embedding` off) to check by hand with `cargo test -p model-export --test marian
-- --ignored` (`NMT_MARIAN_SWEEP=DIR`); `--bench` writes only an OPUS-MT-shaped model, for the
CTranslate2 comparison on the same weights (`python3 -m nmt_tools.ct2.compare --hf-dir`);
`--trained HF_DIR` writes only the references of a model trained elsewhere
(`nmt_tools.marian.train`), into its own directory, on real sentences: put it (or a link to it)
in a folder and point `NMT_MARIAN_SWEEP` there.
Needs torch (the CPU wheel is enough), transformers,
sentencepiece, protobuf and tokenizers; none of them is needed to run the tests.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_tools.paths import repo_root, shown

if TYPE_CHECKING:
    from transformers import MarianMTModel, MarianTokenizer

MODULE = "nmt_tools.marian.fixture"
# A transformers MarianMTModel (torch is read as Any by the checks).
Model = Any
CONVERTER = Path("model-export/python/marian_tokenizers.py")
# The server's free-decoding budget (`RequestLimits::output_budget` with its defaults).
MAX_LENGTH_RATIO = 2.0
MAX_LENGTH_OFFSET = 10


@dataclass(frozen=True)
class Variant:
    """One random model: its name (the fixture's folder) and shape."""

    name: str
    d_model: int = 32
    layers: int = 2
    heads: int = 4
    ffn: int = 64
    activation: str = "swish"
    scale_embedding: bool = True
    vocab_per_side: int = 160
    # SentencePiece's normalization: OPUS-MT's models have `nmt_nfkc`, whose character map
    # takes 240 KB in each .spm file and each tokenizer.json; the committed fixture has none.
    normalization: str = "identity"
    max_positions: int = 256
    seed: int = 33
    # The pad row of the shared embedding at zero, as in trained OPUS-MT models (padding_idx):
    # CTranslate2's Marian conversion relies on it (its decoder starts from a zero embedding
    # instead of pad's row), so the CTranslate2 comparison needs it; the fixtures draw it too.
    zero_pad_embedding: bool = False


COMMITTED = [Variant("tiny-swish")]
SWEEP = [
    Variant("sweep-gelu", activation="gelu", seed=34),
    Variant("sweep-relu", activation="relu", seed=35),
    Variant("sweep-unscaled", scale_embedding=False, seed=36),
    Variant("sweep-wide", d_model=64, layers=3, heads=8, ffn=128, vocab_per_side=300, seed=37),
    Variant("sweep-nfkc", normalization="nmt_nfkc", seed=38),
]
# OPUS-MT's shape (opus-mt-en-es: 6+6 layers, d_model 512, 8 heads, FFN 2048, swish), for the
# speed of an imported model beside CTranslate2 on the same weights (`--bench`, with many more
# SentencePiece lines than the fixtures: `--english data/corpus-l10n/train.en --spanish
# data/corpus-l10n/train.es --train-lines 60000`); not a fixture.
BENCH = Variant(
    "bench-opus-shape",
    d_model=512,
    layers=6,
    heads=8,
    ffn=2048,
    vocab_per_side=16000,
    max_positions=512,
    seed=40,
    zero_pad_embedding=True,
)

# Inputs beyond the corpus lines: what tokenizers get wrong first.
TRICKY = [
    "Numbers: 3.14, 1,000 and 42%.",
    "  Leading and trailing spaces  ",
    "Tabs\tand  double  spaces",
    "Ñandú, café, naïve and Ω.",
    "ALL CAPS SHOUTING!",
    "a",
]


def corpus_lines(path: Path, count: int) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line][:count]


def default_corpus() -> tuple[Path, Path]:
    """The held-out Bible verses when the corpus is built (scripts/setup.sh), else the eval
    fixtures' twenty."""
    root = repo_root()
    built = root / "data/corpus-l10n"
    if (built / "test.en").is_file():
        return built / "test.en", built / "test.es"
    fixtures = root / "eval/tests/fixtures/corpus"
    return fixtures / "test.en", fixtures / "test.es"


def train_spm(lines: list[str], vocab_size: int, normalization: str) -> bytes:
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=0.9995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        normalization_rule_name=normalization,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def shared_vocab(source: bytes, target: bytes) -> dict[str, int]:
    """OPUS-MT's layout: `</s>`, `<unk>`, the source pieces, the target's new ones, `<pad>`."""
    import sentencepiece

    pieces: list[str] = ["</s>", "<unk>"]
    for model in (source, target):
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            if processor.is_control(i) or processor.is_unknown(i):
                continue
            piece = processor.id_to_piece(i)
            if piece not in pieces:
                pieces.append(piece)
    pieces.append("<pad>")
    return {piece: i for i, piece in enumerate(pieces)}


def randomize(model: Model, seed: int) -> None:
    """Every parameter and `final_logits_bias` drawn: matrices at 1/sqrt(fan-in), norms away
    from (1, 0), EOS's bias raised so that some texts end before their budget (random
    post-norm decoders soon settle on repeating a token or two)."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def draw(shape: torch.Size, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * std + mean

    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("embed_positions.weight"):
                continue
            if parameter.dim() == 2 and "embed" not in name and "shared" not in name and "lm_head" not in name:
                parameter.copy_(draw(parameter.shape, 1.0 / math.sqrt(parameter.shape[1])))
            elif parameter.dim() == 2:
                parameter.copy_(draw(parameter.shape, 0.1))
            elif "layer_norm" in name and name.endswith("weight"):
                parameter.copy_(draw(parameter.shape, 0.2, 1.0))
            else:
                parameter.copy_(draw(parameter.shape, 0.1))
        bias = draw(model.final_logits_bias.shape, 0.2)
        bias[0, model.config.eos_token_id] += 2.0
        model.final_logits_bias.copy_(bias)


def budget(source_subwords: int, max_positions: int) -> int:
    """The server's output budget for a text of this many subwords (EOS not counted)."""
    bound = math.ceil(MAX_LENGTH_RATIO * source_subwords) + MAX_LENGTH_OFFSET
    return max(1, min(bound, max_positions - 1))


def write_tokenizer(
    variant: Variant, english: list[str], spanish: list[str], out: Path
) -> tuple[MarianTokenizer, dict[str, int]]:
    """SentencePiece models trained on the fly, the shared vocabulary, saved as Marian's files."""
    from transformers import MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        source = train_spm(english, variant.vocab_per_side, variant.normalization)
        target = train_spm(spanish, variant.vocab_per_side, variant.normalization)
        (scratch / "source.spm").write_bytes(source)
        (scratch / "target.spm").write_bytes(target)
        vocab = shared_vocab(source, target)
        (scratch / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(
            source_spm=str(scratch / "source.spm"),
            target_spm=str(scratch / "target.spm"),
            vocab=str(scratch / "vocab.json"),
            source_lang="en",
            target_lang="es",
        )
        tokenizer.save_pretrained(str(out))
    return tokenizer, vocab


def random_model(variant: Variant, vocab_size: int, pad: int, out: Path) -> MarianMTModel:
    """A random MarianMTModel of the variant's shape, saved as safetensors, pad banned."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=variant.d_model,
        encoder_layers=variant.layers,
        decoder_layers=variant.layers,
        encoder_attention_heads=variant.heads,
        decoder_attention_heads=variant.heads,
        encoder_ffn_dim=variant.ffn,
        decoder_ffn_dim=variant.ffn,
        activation_function=variant.activation,
        scale_embedding=variant.scale_embedding,
        max_position_embeddings=variant.max_positions,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        dropout=0.0,
    )
    torch.manual_seed(variant.seed)
    model = MarianMTModel(config)
    randomize(model, variant.seed)
    if variant.zero_pad_embedding:
        with torch.no_grad():
            model.get_input_embeddings().weight[pad].zero_()
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        forced_eos_token_id=0,
        decoder_start_token_id=pad,
        pad_token_id=pad,
        eos_token_id=0,
        num_beams=1,
        do_sample=False,
    )
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    return model


def greedy_cases(
    model: MarianMTModel, tokenizer: MarianTokenizer, variant: Variant, pad: int, inputs: list[str]
) -> list[dict[str, Any]]:
    """`generate`'s greedy token ids for each input, under the server's output budget."""
    cases: list[dict[str, Any]] = []
    for text in inputs:
        ids = tokenizer(text, return_tensors="pt").input_ids
        limit = budget(ids.shape[1] - 1, variant.max_positions)
        generated = model.generate(ids, num_beams=1, do_sample=False, max_new_tokens=limit + 1)[0].tolist()
        assert generated[0] == pad, generated
        output = generated[1:]
        ended = bool(output) and output[-1] == 0
        if ended:
            output = output[:-1]
        cases.append(
            {
                "text": text,
                "source_ids": ids[0].tolist(),
                "budget": limit,
                "output_ids": output,
                "ended_with_eos": ended and len(output) < limit,
                "translation": tokenizer.decode(output, skip_special_tokens=True),
            }
        )
    return cases


def teacher_forced(
    model: MarianMTModel, cases: list[dict[str, Any]], variant: Variant, pad: int
) -> list[dict[str, Any]]:
    """Logits along random target tokens, not only greedy ones: every row of the projection is met."""
    import torch

    forced: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(variant.seed)
    for case in cases[:3]:
        drawn = torch.randint(0, pad, (9,), generator=generator).tolist()
        decoder_ids = [pad, *drawn]
        logits = model(
            input_ids=torch.tensor([case["source_ids"]]),
            decoder_input_ids=torch.tensor([decoder_ids]),
        ).logits[0]
        forced.append(
            {
                "source_ids": case["source_ids"],
                "decoder_ids": decoder_ids,
                "logits": [[float(f"{v:.7g}") for v in row] for row in logits.tolist()],
            }
        )
    return forced


def convert_tokenizers(out: Path, inputs: list[str]) -> dict[str, Any]:
    """The embedded converter's tokenizer.json files, checked both ways on the inputs."""
    check = out / "check.txt"
    check.write_text("\n".join(inputs) + "\n", encoding="utf-8")
    converter = subprocess.run(
        [sys.executable, str(repo_root() / CONVERTER), str(out), str(out), "--check", str(check)],
        check=True,
        capture_output=True,
        text=True,
    )
    check.unlink()
    report: dict[str, Any] = json.loads(converter.stdout)
    return report


def build(variant: Variant, english: list[str], spanish: list[str], out: Path, inputs: list[str]) -> dict[str, Any]:
    tokenizer, vocab = write_tokenizer(variant, english, spanish, out)
    pad = vocab["<pad>"]
    model = random_model(variant, len(vocab), pad, out)
    return write_reference(model, tokenizer, variant.name, asdict(variant), out, inputs)


def write_reference(
    model: Model, tokenizer: MarianTokenizer, name: str, described: dict[str, Any], out: Path, inputs: list[str]
) -> dict[str, Any]:
    """transformers' outputs on `inputs` (greedy ids, teacher-forced logits) and the converted
    tokenizers' report, written to `out/reference.json` beside the saved model; a summary."""
    import torch
    import transformers

    pad = model.config.pad_token_id
    variant = Variant(name, max_positions=model.config.max_position_embeddings, seed=int(described.get("seed", 33)))
    with torch.no_grad():
        cases = greedy_cases(model, tokenizer, variant, pad, inputs)
        forced = teacher_forced(model, cases, variant, pad)
    tokenizers_report = convert_tokenizers(out, inputs)
    ended = sum(case["ended_with_eos"] for case in cases)
    reference = {
        "generator": f"python3 -m {MODULE}",
        "variant": described,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "vocab_size": model.config.vocab_size,
        "pad_id": pad,
        "max_length_ratio": MAX_LENGTH_RATIO,
        "max_length_offset": MAX_LENGTH_OFFSET,
        "cases": cases,
        "teacher_forced": forced,
        "tokenizers": tokenizers_report,
    }
    (out / "reference.json").write_text(json.dumps(reference, ensure_ascii=False) + "\n", encoding="utf-8")
    return {
        "variant": name,
        "inputs": len(cases),
        "ended_with_eos": ended,
        "encode_mismatches": len(tokenizers_report["check"]["encode_mismatches"]),
        "decode_mismatches": len(tokenizers_report["check"]["decode_mismatches"]),
    }


def reference_for_trained(hf_dir: Path, inputs: list[str]) -> dict[str, Any]:
    """`write_reference` for a model trained elsewhere (`nmt_tools.marian.train`'s `hf/`),
    loaded from its directory."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(hf_dir))
    model.eval()
    tokenizer = MarianTokenizer.from_pretrained(str(hf_dir))
    described = {"name": hf_dir.name, "trained": True, **model.config.to_diff_dict()}
    with torch.no_grad():
        return write_reference(model, tokenizer, hf_dir.name, described, hf_dir, inputs)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="folder that gets one subfolder per model (not with --trained)")
    parser.add_argument("--english", type=Path, help="English lines (default: the held-out verses)")
    parser.add_argument("--spanish", type=Path, help="Spanish lines (default: their translations)")
    parser.add_argument("--train-lines", type=int, default=300, help="lines per side the SentencePiece models see")
    parser.add_argument("--inputs", type=int, default=100, help="corpus lines to translate, beside the tricky ones")
    parser.add_argument("--sweep", action="store_true", help="also the wider set of configurations")
    parser.add_argument("--bench", action="store_true", help="only an OPUS-MT-shaped model, for speed")
    parser.add_argument(
        "--trained",
        type=Path,
        help="a saved Marian directory (nmt_tools.marian.train's hf/): write its reference.json "
        "on --inputs lines of --english (after its first --train-lines), and nothing else",
    )
    args = parser.parse_args()
    english_path, spanish_path = default_corpus()
    english_path = args.english or english_path
    spanish_path = args.spanish or spanish_path
    english = corpus_lines(english_path, args.train_lines + args.inputs)
    spanish = corpus_lines(spanish_path, args.train_lines)
    training, held_out = english[: args.train_lines], english[args.train_lines :]
    inputs = (held_out or training)[: args.inputs] + TRICKY
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.trained:
        print(json.dumps(reference_for_trained(args.trained, inputs), indent=1))
        return
    if args.out is None:
        parser.error("--out is needed to write random models")
    variants = [BENCH] if args.bench else COMMITTED + (SWEEP if args.sweep else [])
    summary = [build(v, training, spanish, args.out / v.name, inputs) for v in variants]
    print(json.dumps({"corpus": [shown(english_path), shown(spanish_path)], "models": summary}, indent=1))


if __name__ == "__main__":
    main()
