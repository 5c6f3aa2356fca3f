"""The configurations compare measures ("cells"), and the worker command that runs each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nmt_tools.server import Limit

# One measured configuration, as the report's JSON keeps it.
Cell = dict[str, Any]

CT2 = "CTranslate2"
ENGINE = "this engine (no HTTP)"
SERVER = "this server (HTTP)"
REFERENCE = "this engine (no HTTP), shipped model"


def per_batch_size(args: argparse.Namespace, mode: str, cells: list[Cell]) -> list[Cell]:
    """Sorted-batch cells once per `--batch-size`, each with its size, and, when the run
    measures several sizes, the size in its id and threads (its row of the tables); the
    other modes' cells as they are."""
    if mode != "batch":
        return cells
    several = len(args.batch_size) > 1
    return [
        cell
        | {"batch_size": batch}
        | ({"id": f"{cell['id']}-b{batch}", "threads": f"{cell['threads']}, batches of {batch}"} if several else {})
        for batch in args.batch_size
        for cell in cells
    ]


def ct2_cells(args: argparse.Namespace, precision: str, mode: str, package: str) -> list[Cell]:
    layouts = [(1, t) for t in args.ct2_threads]
    if mode in ("concurrent", "batch") and args.ct2_inter2:
        # CTranslate2's own way to use two cores for many sentences: two replicas, each
        # decoding its own call (a client's sentence, or a batch).
        layouts.append((2, 1))
    return [
        {
            "id": f"ct2-{precision}-{mode}-inter{inter}-intra{intra}",
            "system": CT2,
            "precision": precision,
            "mode": mode,
            "threads": f"intra {intra}" if inter == 1 else f"inter {inter} x intra {intra}",
            "inter_threads": inter,
            "intra_threads": intra,
            "compute_type": precision,
            "package": package,
        }
        for inter, intra in layouts
    ]


def engine_cells(args: argparse.Namespace, precision: str, mode: str, package: str) -> list[Cell]:
    layouts = [(1, t) for t in (args.our_threads_one if mode == "one" else args.our_threads)]
    if mode == "batch":
        # The engine's counterpart of CTranslate2's inter_threads on sorted batches: workers
        # each decoding the next batch (`nmt-translate --workers`), as many as the server's.
        layouts += [(w, 1) for w in args.server_workers if w > 1]
    return [
        {
            "id": f"engine-{precision}-{mode}-t{t}" + (f"-w{workers}" if workers > 1 else ""),
            "system": ENGINE,
            "precision": precision,
            "mode": mode,
            "threads": f"intra-op {t}" if workers == 1 else f"{workers} workers x intra-op {t}",
            "batch_size": 1,
            "intra_threads": t,
            "workers": workers,
            "package": package,
        }
        for workers, t in layouts
    ]


def server_cells(args: argparse.Namespace, precision: str, mode: str, package: str) -> list[Cell]:
    clients = 1 if mode == "one" else args.clients
    layouts = [(1, t) for t in args.server_threads]
    if mode == "concurrent":
        # The server's counterpart of CTranslate2's inter_threads: model workers.
        layouts += [(w, 1) for w in args.server_workers if w > 1]
    return [
        {
            "id": f"server-{precision}-{mode}-t{t}" + (f"-w{workers}" if workers > 1 else ""),
            "system": SERVER,
            "precision": precision,
            "mode": mode,
            "threads": f"intra-op {t}" if workers == 1 else f"{workers} workers x intra-op {t}",
            "clients": clients,
            "intra_threads": t,
            "model_workers": workers,
            "package": package,
        }
        for workers, t in layouts
    ]


def reference_cells(args: argparse.Namespace) -> list[Cell]:
    return [
        {
            "id": f"reference-{mode}",
            "system": REFERENCE,
            "precision": "float32",
            "mode": mode,
            "threads": "intra-op 1",
            "batch_size": 1 if mode == "one" else max(args.batch_size),
            "intra_threads": 1,
            "package": args.reference_package,
            "reference": True,
        }
        for mode in args.reference_modes
    ]


def cells_for(args: argparse.Namespace, packages: dict[str, str]) -> list[Cell]:
    """Every configuration to measure, in the order of a forward round: by precision, then by
    mode, CTranslate2's cells next to this side's, so that the cells compared with each other
    also run close together in time."""
    cells = []
    for precision in ("float32", "int8"):
        for mode in ("one", "concurrent", "batch"):
            cells += per_batch_size(args, mode, ct2_cells(args, precision, mode, packages["float32"]))
            if precision not in packages:
                continue
            if mode in ("one", "batch"):
                cells += per_batch_size(args, mode, engine_cells(args, precision, mode, packages[precision]))
            if mode in ("one", "concurrent"):
                cells += server_cells(args, precision, mode, packages[precision])
    if args.reference_package:
        cells += reference_cells(args)
    return cells


def worker_command(cell: Cell, args: argparse.Namespace, ct2_model: Path, limits: dict[str, Limit]) -> list[str]:
    """The command of the cell's worker: nmt_tools.ct2.worker for CTranslate2, nmt-bench-worker
    (engine in-process, or nmt-server over HTTP) for this side."""
    if cell["system"] == CT2:
        # fmt: off
        command = [
            sys.executable, "-m", "nmt_tools.ct2.worker",
            "--model", str(ct2_model),
            "--package", cell["package"],
            "--verses", args.verses,
            "--compute-type", cell["compute_type"],
            "--intra-threads", str(cell["intra_threads"]),
            "--inter-threads", str(cell["inter_threads"]),
            "--mode", cell["mode"],
            "--clients", str(args.clients),
            "--batch-size", str(cell.get("batch_size", 1)),
            "--warmup", str(args.warmup),
        ]
        # fmt: on
        for limit in limits.values():
            command += [limit.flag, str(limit.value)]
        return command
    common = [args.worker_bin, "--verses", args.verses, "--warmup", str(args.warmup)]
    if "clients" in cell:
        # fmt: off
        return common + [
            "http",
            "--package", cell["package"],
            "--clients", str(cell["clients"]),
            "--server-bin", args.server_bin,
            "--server-log", str(Path(args.work) / "logs" / f"{cell['id']}.server.log"),
            "--server-arg=--intra-op-threads",
            f"--server-arg={cell['intra_threads']}",
            "--server-arg=--model-workers",
            f"--server-arg={cell.get('model_workers', 1)}",
            "--server-arg=--device",
            "--server-arg=cpu",
        ]
        # fmt: on
    # fmt: off
    return common + [
        "engine",
        "--package", cell["package"],
        "--batch-size", str(cell["batch_size"]),
        "--threads", str(cell["intra_threads"]),
        "--workers", str(cell.get("workers", 1)),
    ]
    # fmt: on
