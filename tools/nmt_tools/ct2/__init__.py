"""This server beside CTranslate2 on the same weights: `convert` writes a package as a
CTranslate2 model, `compare` measures both sides (its workers: `worker` for CTranslate2,
`nmt-bench-worker` for this side). Needs `pip install -e 'tools[ct2]'`."""
