"""`flashspec reproduce t4` in its smoke mode: the command runs end to end on a CPU, prints the paper's numbers
beside its own and writes a record with provenance (the GPU run is where its numbers mean something)."""
from __future__ import annotations

import json

import pytest

from flashspec import cli
from flashspec_lab import provenance, reproduce


def test_reproduce_t4_smoke_runs_and_writes_a_record(tmp_path, capsys):
    out = tmp_path / "t4.json"
    assert cli.main(["reproduce", "t4", "--smoke", "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "paper (T4)" in printed and "this CPU" in printed and "44.2" in printed
    record = json.loads(out.read_text())
    assert list(record) == list(provenance.RESULT_KEYS)
    assert record["settings"]["source"] == "smoke" and record["results"]["gpu"] is None
    decoded = record["results"]["decode"]
    assert decoded["speculative"]["tokens"] == decoded["plain"]["tokens"] == 12
    assert 0.0 <= decoded["speculative"]["acceptance_rate"] <= 1.0
    assert set(record["results"]["verify"]["batches"]) == {"1", "8"}
    assert record["results"]["paper_t4"] == reproduce.PAPER_T4


def test_reproduce_needs_a_gpu_for_the_real_sources(capsys):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        reproduce.load_pool("random", reproduce.torch.device("cpu"))
    assert cli.main(["reproduce", "nope"]) == 2
    assert "usage: flashspec reproduce {t4}" in capsys.readouterr().err
