"""The repository's Python: benchmarks beside the Rust engine, study write-ups, and checks run
through a running server. Each tool is a module run as `python3 -m nmt_tools.<module>`, and
every one explains itself with `--help`:

- `ct2.compare`, `ct2.convert`: this server beside CTranslate2 on the same weights;
- `int8.presets`: int8 against float32 for every preset;
- `decoding.step_floor`: what a decoder step at batch 1 is made of;
- `training.torch_train_bench`: PyTorch's training speed on the shipped shape;
- `studies.position_study`, `studies.length_study`, `studies.length_generalization`: the
  experiments' write-ups and checks;
- `eval.catalogs`, `eval.probes`, `eval.evaluate`: checks through a running server, and the
  `nmt-eval` wrapper.

Shared once: `machine` (CPU, load), `provenance` (git, versions, dates), `server` (the HTTP
API and the server's own limits), `verses` (the benchmark inputs), `worker` (benchmark worker
processes), `paths` (the repository root).
"""
