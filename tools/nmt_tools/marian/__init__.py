"""Hugging Face Marian (OPUS-MT) models beside `nmt-export import-marian`: tiny random models
with transformers' reference outputs, the importer's test fixtures."""
