"""The PyTorch trainer's data steps, which must build what `nmt-train train` builds (its model is
checked against nmt-train's on real weights: the same dev loss, docs/training.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nmt_tools.training.torch_train import (
    EOS,
    Example,
    learning_rate,
    parse_oversample,
    token_batches,
    training_examples,
)


@dataclass
class Encoding:
    ids: list[int]


class WordTokenizer:
    """One id per word: the number in `wN`, so that joins can be read back."""

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        assert not add_special_tokens
        return [Encoding([int(w[1:]) for w in text.split()]) for text in texts]


# A one-layer transformer small enough to train a few steps on CPU in a test.
TINY_CONFIG = {
    "preset": "transformer-tiny", "architecture": "transformer", "vocab_size": 12000, "d_model": 16,
    "num_heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0, "norm": "pre",
    "absolute_position": "sinusoidal", "max_positions": 64, "relative_attention": "none", "relative_clip": 0,
    "recurrent_position": "none", "recurrent_dim": 0, "length_encoding": "none", "length_noise": 0,
    "layer_norm_eps": 1e-5,
}  # fmt: skip


def pair(i: int, origin: str, masked: bool = False) -> dict[str, Any]:
    return {
        "origin": origin,
        "source": f"w{i}",
        "target": f"w{i + 100}",
        "masked": [f"w{i + 1000}", f"w{i + 2000}"] if masked else None,
    }


def test_oversampled_pairs_repeat_and_masked_forms_replace_single_pairs() -> None:
    pairs = [pair(0, "bible/a"), pair(1, "debian/x", masked=True), pair(2, "bible/b")]
    examples = training_examples(pairs, WordTokenizer(), [("bible/", 3)], 0.0, 4, 256, 1)
    sources = sorted(e.source[0] for e in examples)
    assert sources == [0, 0, 0, 2, 2, 2, 1001]
    assert all(e.source[-1] == EOS for e in examples)
    masked = next(e for e in examples if e.source[0] == 1001)
    assert masked.target == [2001]


def test_joined_examples_join_unmasked_pairs_two_lines_apart() -> None:
    pairs = [pair(i, "bible/a", masked=i % 2 == 0) for i in range(40)]
    examples = training_examples(pairs, WordTokenizer(), [], 0.5, 4, 256, 7)
    joined = examples[40:]
    assert len(joined) == 20
    for e in joined:
        words = e.source[:-1]
        assert 2 <= len(words) <= 4
        assert all(b - a == 2 for a, b in zip(words, words[1:], strict=False)), words
        assert e.target == [w + 100 for w in words]
    assert max(len(e.source) - 1 for e in joined) == 4


def test_examples_longer_than_max_len_are_dropped() -> None:
    long = {"origin": "x", "source": " ".join(["w5"] * 9), "target": "w1", "masked": None}
    examples = training_examples([long, pair(1, "x")], WordTokenizer(), [], 0.0, 4, 8, 1)
    assert [e.source for e in examples] == [[1, EOS]]


def test_batches_respect_the_token_budget_and_cover_everything() -> None:
    examples = [Example([5] * (n % 17 + 1), [6] * (n % 11 + 1)) for n in range(1, 60)]
    batches = token_batches(examples, 64, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    for b in batches:
        longest = max(max(len(examples[i].source), len(examples[i].target) + 1) for i in b)
        assert len(b) == 1 or longest * len(b) <= 64


def test_schedule_and_flags_match_nmt_train() -> None:
    assert abs(learning_rate(100, 1e-3, 100) - 1e-3) < 1e-12
    assert abs(learning_rate(400, 1e-3, 100) - 5e-4) < 1e-12
    assert learning_rate(50, 1e-3, 100) == 5e-4
    assert parse_oversample("bible/=6") == ("bible/", 6)


def test_eval_steps_keep_the_moving_averages_best_point(tmp_path: Path) -> None:
    """`--eval-steps`: the moving average's dev loss every N updates, its lowest written to
    OUT/best as a checkpoint with that loss (CPU, a tiny model; skipped where torch is absent)."""
    import json

    pytest.importorskip("torch")
    from nmt_tools.paths import repo_root
    from nmt_tools.training import torch_train

    lines = [
        json.dumps({"origin": "t", "source": f"file {i} saved", "target": f"archivo {i} guardado"}) for i in range(40)
    ]
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    argv = ["train", "--pairs", str(tmp_path / "pairs.jsonl"), "--dev", str(tmp_path / "pairs.jsonl")]
    argv += [
        "--tokenizer",
        str(repo_root() / "models/en-es-l10n/tokenizer.json"),
        "--config",
        str(tmp_path / "config.json"),
    ]
    argv += ["--out", str(tmp_path / "out"), "--device", "cpu", "--max-steps", "6", "--eval-steps", "2"]
    torch_train.main([*argv, "--batch-tokens", "200", "--lr", "1e-2", "--warmup-steps", "1"])
    best = json.loads((tmp_path / "out" / "best" / "trainer_state.json").read_text())
    assert best["step"] in (2, 4, 6) and best["dev_loss"] > 0
    # The last evaluation was at the last step, so the best is at most the final average's loss.
    ema = json.loads((tmp_path / "out" / "ema" / "trainer_state.json").read_text())
    assert ema["step"] == 6 and best["dev_loss"] <= ema["dev_loss"] + 1e-6


def test_dev_in_band_counts_only_dev_pairs_the_run_trains_on_and_import_keeps_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--dev-in-band`: the dev loss that picks the best point reads no length the run is not
    trained on; `import-gpu --kind best` then records the run's whole budget (the final
    state's steps) beside the step its weights come from."""
    import argparse
    import json

    pytest.importorskip("torch")
    from nmt_tools.paths import repo_root
    from nmt_tools.studies import position_study
    from nmt_tools.training import torch_train

    short = [{"origin": "t", "source": f"file {i}", "target": f"archivo {i}"} for i in range(30)]
    long = [{"origin": "t", "source": f"the file {i} was saved to disk", "target": f"archivo {i}"} for i in range(7)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in short + long))
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    tokenizer = str(repo_root() / "models/en-es-l10n/tokenizer.json")
    out = tmp_path / "out"
    argv = ["train", "--pairs", str(tmp_path / "pairs.jsonl"), "--dev", str(tmp_path / "pairs.jsonl")]
    argv += ["--tokenizer", tokenizer, "--config", str(tmp_path / "config.json"), "--out", str(out)]
    argv += ["--device", "cpu", "--max-steps", "4", "--eval-steps", "2", "--max-source-len", "5", "--dev-in-band"]
    torch_train.main([*argv, "--batch-tokens", "200", "--lr", "1e-2", "--warmup-steps", "1"])
    assert "30 training examples, 30 dev" in capsys.readouterr().out

    parts = tmp_path / "parts"
    torch_train.main(["split", "--checkpoint", str(out / "best"), "--out", str(parts), "--prefix", "run.best-"])
    final = json.loads((out / "ema" / "trainer_state.json").read_text())
    best = json.loads((out / "best" / "trainer_state.json").read_text())
    final["step"], best["step"] = 9, 4  # a run whose best point came before its last step
    (parts / "run.final-trainer_state.json").write_text(json.dumps(final))
    (parts / "run.best-trainer_state.json").write_text(json.dumps(best))
    args = argparse.Namespace(
        parts=parts, name="run", config=tmp_path / "config.json", out=tmp_path / "record", kind="best"
    )
    position_study.import_gpu(args)
    report = json.loads((tmp_path / "record" / "report.json").read_text())
    assert report["state"]["step"] == 9 and report["state"]["weights_step"] == 4
    assert report["state"]["weights"].endswith("at its lowest dev loss")


def test_a_resumed_run_ends_where_one_unbroken_run_ends(tmp_path: Path) -> None:
    """`--resume`: three updates, a stop, three more give the weights, moving average and
    counters of six in one go (CPU, so bit for bit); other settings than the snapshot's are
    refused."""
    import json

    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from nmt_tools.paths import repo_root
    from nmt_tools.training import torch_train

    pairs = [{"origin": "t", "source": f"file {i} saved", "target": f"archivo {i} guardado"} for i in range(40)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIG, "dropout": 0.3}))

    def run(out: Path, steps: int, *extra: str) -> None:
        argv = ["train", "--pairs", str(tmp_path / "pairs.jsonl"), "--dev", str(tmp_path / "pairs.jsonl")]
        argv += ["--tokenizer", str(repo_root() / "models/en-es-l10n/tokenizer.json")]
        argv += ["--config", str(tmp_path / "config.json"), "--out", str(out), "--device", "cpu"]
        argv += ["--max-steps", str(steps), "--eval-steps", "2", "--batch-tokens", "120", "--lr", "1e-2"]
        torch_train.main([*argv, "--warmup-steps", "1", "--resume", *extra])

    run(tmp_path / "whole", 6)
    run(tmp_path / "parts", 3)
    run(tmp_path / "parts", 6)
    for kind in ("last", "ema", "best"):
        whole = load_file(str(tmp_path / "whole" / kind / "model.safetensors"))
        parts = load_file(str(tmp_path / "parts" / kind / "model.safetensors"))
        assert all(torch.equal(whole[k], parts[k]) for k in whole), kind
        states = [json.loads((tmp_path / o / kind / "trainer_state.json").read_text()) for o in ("whole", "parts")]
        assert [s["step"] for s in states] == [states[0]["step"]] * 2
        assert states[0]["target_tokens_seen"] == states[1]["target_tokens_seen"]
    with pytest.raises(SystemExit, match="lr"):
        run(tmp_path / "parts", 8, "--lr", "2e-2")
