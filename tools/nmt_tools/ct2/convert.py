"""Converts a model package (manifest.json, tokenizer.json, encoder.onnx, decoder.onnx) into a
CTranslate2 model directory, for benchmarking this server against CTranslate2 on the same
weights.

    python3 -m nmt_tools.ct2.convert --package /path/to/package --out /tmp/ct2-model

The weights are read from the ONNX initializers (packages ship no checkpoint); nmt-export
names every initializer after the module it came from, plus a `_N` suffix that only makes it
unique. Only Transformers CTranslate2 computes exactly are converted: pre-norm, ReLU, and either
sinusoidal absolute positions (`transformer`) or Shaw et al.'s relative keys and values with no
absolute positions (`rel-transformer`). Anything else is refused with the reason, rather than
converted into a model that would translate differently.

Requirements: `pip install -e 'tools[ct2]'`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_tools.provenance import version

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Array = npt.NDArray[np.float32]

# A CTranslate2 spec object (its layers' attributes are set by name).
Spec = Any


class Refused(Exception):
    """The package holds a model CTranslate2 cannot express."""


# Switches CTranslate2 has an equivalent for only at one value: (key, value, why not others).
REQUIRED_SWITCHES = [
    ("architecture", "transformer", "the RNN-NMT baseline is not a Transformer"),
    ("norm", "pre", "only the pre-norm layout (the one every preset trains) is converted"),
    ("recurrent_position", "none", "CTranslate2 has no recurrent position encoders"),
    (
        "length_encoding",
        "none",
        "CTranslate2's decoder cannot take a target length (LDPE/LRPE); compare on the plain twin of the model instead",
    ),
]


def supported(config: dict[str, Any]) -> None:
    """Raises Refused, naming the first switch CTranslate2 has no equivalent for."""
    preset = config.get("preset", "?")
    for key, want, why in REQUIRED_SWITCHES:
        if config.get(key) != want:
            raise Refused(f"preset `{preset}`: {key} = {config.get(key)!r}: {why}")
    absolute, relative = config.get("absolute_position"), config.get("relative_attention")
    if (absolute, relative) not in [("sinusoidal", "none"), ("none", "keys_values")]:
        raise Refused(
            f"preset `{preset}`: absolute_position = {absolute!r} with relative_attention = "
            f"{relative!r}: CTranslate2 computes sinusoidal absolute positions alone, or Shaw "
            "relative keys and values alone (with relative vectors it drops absolute positions, "
            "and it has no keys-only or sinusoidal relative variant)"
        )


def load_initializers(path: Path) -> tuple[dict[str, list[Array]], set[float]]:
    """Initializers of an ONNX graph by their module name (the `_N` suffix dropped), and the
    graph's layer-norm epsilons."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    weights: dict[str, list[Array]] = {}
    for init in graph.initializer:
        name = re.sub(r"_\d+$", "", init.name)
        # Constants of the graph's arithmetic share names such as `const`; only named
        # module weights are looked up, and those must be unique.
        weights.setdefault(name, []).append(numpy_helper.to_array(init))
    epsilons = {
        attr.f
        for node in graph.node
        if node.op_type == "LayerNormalization"
        for attr in node.attribute
        if attr.name == "epsilon"
    }
    return weights, epsilons


class Weights:
    """The initializers of both graphs, looked up by module name."""

    def __init__(self, *graphs: dict[str, list[Array]]) -> None:
        self.graphs = graphs

    def get(self, name: str) -> Array:
        import numpy as np

        found = [w[name] for w in self.graphs if name in w]
        if not found:
            raise KeyError(f"no initializer `{name}` in the package's graphs")
        arrays = [a for group in found for a in group]
        # The same module may be in both graphs (the embedding table); it must agree.
        for a in arrays[1:]:
            if a.shape != arrays[0].shape or not np.array_equal(a, arrays[0]):
                raise ValueError(f"initializer `{name}` differs between its copies")
        return np.ascontiguousarray(arrays[0], dtype=np.float32)

    def has(self, name: str) -> bool:
        return any(name in w for w in self.graphs)


def linear(spec: Spec, weights: Weights, scope: str) -> None:
    import numpy as np

    # nmt-export stores `W^T` ([in, out]) for a MatMul; CTranslate2 wants PyTorch's [out, in].
    spec.weight = np.ascontiguousarray(weights.get(f"{scope}.weight").T)
    if weights.has(f"{scope}.bias"):
        spec.bias = weights.get(f"{scope}.bias")


def fused_linear(spec: Spec, weights: Weights, scopes: list[str]) -> None:
    """CTranslate2 runs the projections that read the same input as one matrix."""
    import numpy as np

    ws = [np.ascontiguousarray(weights.get(f"{s}.weight").T) for s in scopes]
    spec.weight = np.ascontiguousarray(np.concatenate(ws, axis=0))
    if all(weights.has(f"{s}.bias") for s in scopes):
        spec.bias = np.concatenate([weights.get(f"{s}.bias") for s in scopes])
    elif any(weights.has(f"{s}.bias") for s in scopes):
        raise ValueError(f"some of {scopes} have a bias and some do not")


def layer_norm(spec: Spec, weights: Weights, scope: str) -> None:
    """`scope` names the norm as the checkpoint keys it: `<sublayer>_norm` beside its sublayer
    (`decoder.layers.0.cross_attn_norm`), or `encoder.final_norm`/`decoder.final_norm`."""
    spec.gamma = weights.get(f"{scope}.weight")
    spec.beta = weights.get(f"{scope}.bias")


def relative_tables(spec: Spec, weights: Weights, scope: str, clip: int) -> None:
    keys = weights.get(f"{scope}.relative_keys")
    values = weights.get(f"{scope}.relative_values")
    # CTranslate2 reads its clip from the table: (rows - 1) / 2, rows key - query + clip, the
    # same indexing as the export's `clip(key - query, -k, k) + k`.
    for t in (keys, values):
        if t.shape[0] != 2 * clip + 1:
            raise ValueError(f"{scope}: relative table of {t.shape[0]} rows, expected 2 * {clip} + 1")
    spec.relative_position_keys = keys
    spec.relative_position_values = values


def self_attention(spec: Spec, weights: Weights, scope: str, relative_clip: int | None) -> None:
    layer_norm(spec.layer_norm, weights, f"{scope}_norm")
    fused_linear(spec.linear[0], weights, [f"{scope}.{p}_proj" for p in "qkv"])
    linear(spec.linear[1], weights, f"{scope}.out_proj")
    if relative_clip is not None:
        relative_tables(spec, weights, scope, relative_clip)


def feed_forward(spec: Spec, weights: Weights, scope: str) -> None:
    layer_norm(spec.layer_norm, weights, f"{scope}_norm")
    linear(spec.linear_0, weights, f"{scope}.fc1")
    linear(spec.linear_1, weights, f"{scope}.fc2")


def sinusoid_table(inverse_frequencies: Array, rows: int) -> Array:
    """The export's absolute encoding for positions 0..rows: angle = f32(pos) * inv (one f32
    product, as the graph's Mul), sin on even dims and cos on odd dims. CTranslate2's own
    sinusoid differs (positions from 1, halves instead of interleaving), so the table is
    written out."""
    import numpy as np

    positions = np.arange(rows, dtype=np.float32)[:, None]
    angles = (positions * inverse_frequencies[None, :]).astype(np.float32)
    table = np.empty((rows, 2 * inverse_frequencies.shape[0]), dtype=np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table


def vocabulary(tokenizer_path: Path, vocab_size: int) -> list[str]:
    """The pieces of a Unigram tokenizer, by id."""
    tok = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "Unigram":
        raise Refused(f"tokenizer model {model.get('type')!r}: only Unigram vocabularies are read")
    pieces: list[str] = [piece for piece, _score in model["vocab"]]
    for added in tok.get("added_tokens", []):
        if added["id"] >= len(pieces) or pieces[added["id"]] != added["content"]:
            raise ValueError(f"added token {added} is not the vocabulary's piece at its id")
    if len(pieces) != vocab_size:
        raise ValueError(f"tokenizer has {len(pieces)} pieces, the model {vocab_size}")
    if len(set(pieces)) != len(pieces):
        raise ValueError("the vocabulary has duplicate pieces; CTranslate2 maps tokens by text")
    return pieces


def read_weights(package: Path, config: dict[str, Any]) -> Weights:
    """Both graphs' initializers, checked against the manifest's config."""
    import numpy as np

    enc, enc_eps = load_initializers(package / "encoder.onnx")
    dec, dec_eps = load_initializers(package / "decoder.onnx")
    epsilons = enc_eps | dec_eps
    if epsilons != {np.float32(config["layer_norm_eps"])}:
        raise ValueError(
            f"layer norm epsilons {sorted(epsilons)} in the graphs, {config['layer_norm_eps']} in the manifest"
        )
    weights = Weights(enc, dec)
    embed = weights.get("embed.weight")
    if embed.shape != (config["vocab_size"], config["d_model"]):
        raise ValueError(f"embedding table {embed.shape}, config {config['vocab_size']}x{config['d_model']}")
    return weights


def position_table(weights: Weights, manifest: dict[str, Any], max_positions: int | None) -> Array:
    """The absolute position table, as long as the server's limits: the source plus its EOS,
    and the longest output (BOS at position 0)."""
    config, limits = manifest["config"], manifest["limits"]
    rows = max_positions or max(
        (limits.get("max_source_tokens") or config["max_positions"]) + 1,
        limits["max_target_tokens"] + 1,
    )
    table = sinusoid_table(weights.get("embed.inverse_frequencies"), rows)
    if table.shape[1] != config["d_model"]:
        raise ValueError(f"sinusoid width {table.shape[1]}, d_model {config['d_model']}")
    return table


def transformer_spec(manifest: dict[str, Any], weights: Weights, max_positions: int | None) -> Spec:
    """The CTranslate2 spec of the package's Transformer, its weights filled in."""
    from ctranslate2.specs import transformer_spec

    config = manifest["config"]
    relative = config["relative_attention"] == "keys_values"
    clip = config["relative_clip"] if relative else None
    heads = config["num_heads"]
    encoder = transformer_spec.TransformerEncoderSpec(
        config["encoder_layers"], heads, pre_norm=True, relative_position=relative
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config["decoder_layers"], heads, pre_norm=True, relative_position=relative
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    # One table for source words, target words and the output projection (tied), multiplied
    # by sqrt(d_model) on input as the export's `embed` does (CTranslate2's scale_embeddings,
    # on by default, is sqrt of the embedding width).
    embed = weights.get("embed.weight")
    encoder.embeddings[0].weight = embed
    decoder.embeddings.weight = embed
    decoder.projection.weight = embed
    assert encoder.scale_embeddings is True and decoder.scale_embeddings is True
    if not relative:
        table = position_table(weights, manifest, max_positions)
        encoder.position_encodings.encodings = table
        decoder.position_encodings.encodings = table

    for i, layer in enumerate(encoder.layer):
        scope = f"encoder.layers.{i}"
        self_attention(layer.self_attention, weights, f"{scope}.self_attn", clip)
        feed_forward(layer.ffn, weights, f"{scope}.ffn")
    layer_norm(encoder.layer_norm, weights, "encoder.final_norm")

    for i, layer in enumerate(decoder.layer):
        scope = f"decoder.layers.{i}"
        self_attention(layer.self_attention, weights, f"{scope}.self_attn", clip)
        cross = layer.attention
        layer_norm(cross.layer_norm, weights, f"{scope}.cross_attn_norm")
        linear(cross.linear[0], weights, f"{scope}.cross_attn.q_proj")
        fused_linear(cross.linear[1], weights, [f"{scope}.cross_attn.{p}_proj" for p in "kv"])
        linear(cross.linear[2], weights, f"{scope}.cross_attn.out_proj")
        feed_forward(layer.ffn, weights, f"{scope}.ffn")
    layer_norm(decoder.layer_norm, weights, "decoder.final_norm")
    return spec


def configure(spec: Spec, manifest: dict[str, Any], pieces: list[str]) -> None:
    """Vocabulary, special tokens and decoding conventions, as the server has them."""
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.layer_norm_epsilon = float(manifest["config"]["layer_norm_eps"])
    spec.config.unk_token = pieces[manifest["unk_id"]]
    spec.config.bos_token = pieces[manifest["bos_id"]]
    spec.config.eos_token = pieces[manifest["eos_id"]]
    spec.config.decoder_start_token = pieces[manifest["bos_id"]]
    # The server appends EOS to every source (`nmt_engine::pipeline::source_ids`).
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True


def convert(
    package: str | Path, out: str | Path, force: bool = False, max_positions: int | None = None
) -> dict[str, Any]:
    """Writes the CTranslate2 model of `package` to `out`; returns the package's manifest."""
    package, out = Path(package), Path(out)
    manifest: dict[str, Any] = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    config = manifest["config"]
    supported(config)
    weights = read_weights(package, config)
    spec = transformer_spec(manifest, weights, max_positions)
    configure(spec, manifest, vocabulary(package / "tokenizer.json", config["vocab_size"]))

    spec.validate()
    spec.optimize(quantization=None)
    if out.exists():
        if not force:
            raise FileExistsError(f"{out} exists (use --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec.save(str(out))
    # The benchmark tokenizes with the package's own tokenizer; keep it with the model.
    shutil.copy(package / "tokenizer.json", out / "tokenizer.json")
    source = {
        "package": str(package.resolve()),
        "name": manifest["name"],
        "preset": config["preset"],
        "files": manifest.get("files", {}),
        "ctranslate2": version("ctranslate2"),
    }
    (out / "source_package.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return manifest


def convert_hf(hf_dir: str | Path, package: str | Path, out: str | Path) -> dict[str, Any]:
    """Writes CTranslate2's own conversion of a Hugging Face directory (`ct2-transformers-
    converter`: OPUS-MT's Marian models among others) to `out`, for a package that
    `nmt-export import-marian` made from the same directory; returns the package's manifest.
    Needs transformers and torch (`pip install -e 'tools[marian]'`)."""
    import ctranslate2

    package, out = Path(package), Path(out)
    manifest: dict[str, Any] = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    if out.exists():
        shutil.rmtree(out)
    ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(out), force=True)
    # Marian's tokenizer appends EOS to every source, and so does this engine; CTranslate2's
    # converted model leaves it to the caller, whom this switch stands in for.
    config_path = out / "config.json"
    ct2_config = json.loads(config_path.read_text(encoding="utf-8"))
    ct2_config["add_source_eos"] = True
    config_path.write_text(json.dumps(ct2_config, indent=2) + "\n", encoding="utf-8")
    source = {
        "package": str(package.resolve()),
        "hf_dir": str(Path(hf_dir).resolve()),
        "name": manifest["name"],
        "converter": "ctranslate2.converters.TransformersConverter",
        "ctranslate2": version("ctranslate2"),
    }
    (out / "source_package.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m nmt_tools.ct2.convert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--package", required=True, help="model package directory")
    p.add_argument("--out", required=True, help="CTranslate2 model directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--max-positions",
        type=int,
        help="rows of the absolute position table (sinusoidal models only; default: the "
        "package's source and output limits)",
    )
    args = p.parse_args(argv)
    try:
        manifest = convert(args.package, args.out, args.force, args.max_positions)
    except Refused as e:
        print(f"convert: cannot convert {args.package}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({manifest['name']}, preset {manifest['config']['preset']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
