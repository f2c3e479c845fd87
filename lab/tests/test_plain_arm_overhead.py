"""The plain-arm overhead driver runs end to end on tiny shapes and records every decoder against fast plain."""
import json
from pathlib import Path

import pytest


@pytest.mark.parametrize("feature", [False, True], ids=["token-draft", "with-feature-draft"])
def test_plain_arm_overhead_smoke_run_records_every_decoder(tmp_path: Path, feature: bool) -> None:
    from experiments import plain_arm_overhead

    out = tmp_path / "overhead.json"
    options = ["--feature-draft"] if feature else []
    options = ["--out", str(out), "--smoke", "--requests", "2", "--new-tokens", "6"] + options
    assert plain_arm_overhead.main(options) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results["runs"]) == set(plain_arm_overhead.DECODERS)
    assert results["tok_s_over_fast_plain"]["fast_plain"] == 1.0
    fixed = results["runs"]["plain_arm_fixed"][0]
    assert fixed["plain_share"] == 1.0 and fixed["tokens"] == 12 and fixed["steps"] == 12
    assert json.loads(out.read_text())["settings"]["feature_draft"] is feature
