"""The sidecar examples (examples/) end to end with a real torch.utils.data.DataLoader and 2 worker
processes: every batch the workers build reaches the statistics (in process through
Sidecar.attach, out of process through the shared-memory ring). Skipped without torch (TorchRec for
the KJT example)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from example_runner import run_example

STEPS, BATCH = 24, 32


def _run_example(name: str, argv: list[str]) -> dict:
    """``examples/<name>.py``'s ``main(argv)`` in a fresh interpreter; its result as a dict."""
    return run_example(name, argv, timeout=240)[0]


def test_dataloader_example_with_two_workers(tmp_path):
    pytest.importorskip("torch")
    r = _run_example("torch_dataloader", ["--out", str(tmp_path / "out"), "--steps", str(STEPS),
                                          "--batch-size", str(BATCH), "--workers", "2"])
    assert r["submitted"] == r["processed"] == STEPS and r["errors"] == 0
    assert r["processed_ids"] == STEPS * BATCH * 2          # one ID per table per sample
    assert any((tmp_path / "out" / "checkpoints").iterdir())


def test_kjt_example_with_two_workers(tmp_path):
    pytest.importorskip("torchrec")
    r = _run_example("torchrec_kjt", ["--out", str(tmp_path / "out"), "--steps", str(STEPS),
                                      "--batch-size", str(BATCH), "--workers", "2"])
    assert r["submitted"] == r["processed"] == STEPS and r["errors"] == 0 and r["dropped"] == 0
    assert r["processed_ids"] >= STEPS * BATCH * 2           # 1-7 history IDs and one item


def test_ring_example_with_two_workers(tmp_path):
    pytest.importorskip("torch")
    ring = f"fs-test-{uuid.uuid4().hex[:8]}"
    r = _run_example("ring_workers", ["--out", str(tmp_path / "out"), "--steps", str(STEPS),
                                      "--batch-size", str(BATCH), "--workers", "2", "--ring",
                                      ring])
    assert r["event"] == "stopped" and r["errors"] == 0
    assert r["ring"]["batches_written"] == r["ring"]["batches_read"] == STEPS
    assert r["processed_ids"] == STEPS * BATCH * 2
    assert not Path(f"/dev/shm/flexshard-ring-{ring}").exists()      # the sidecar removed it
