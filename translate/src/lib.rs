//! Translating with a model package without a server: the engine nmt-server runs (its
//! tokenizer codec, limits, length planning, ONNX Runtime backend and greedy decode loop),
//! called directly. `nmt-eval` scores test sets with it; `nmt-translate` translates files.

pub mod engine;
