"""The plain-arm stream simulator: the acceptance inverse and the stream's throughput ratios."""
import pytest

from flashspec_lab import simulate


def test_acceptance_for_tokens_inverts_the_truncated_geometric_mean():
    for alpha in (0.0, 0.3, 0.7, 1.0):
        tokens = sum(alpha ** j for j in range(5))
        assert simulate.acceptance_for_tokens(tokens, 4) == pytest.approx(alpha, abs=1e-9)
    with pytest.raises(ValueError, match="tokens_per_step"):
        simulate.acceptance_for_tokens(5.5, 4)


def test_plain_arm_stream_falls_back_to_plain_when_no_draft_pays_and_speculates_when_one_does():
    weak = {"a": {"x": 0.0, "y": 0.0}, "b": {"x": 0.0, "y": 0.0}}
    slow = simulate.plain_arm_stream(weak, step_ms=2.0, plain_ms=1.0, gamma=4, tokens_per_category=400, seed=0)
    assert all(0.5 < ratio < 1.0 for ratio in slow.values()) and slow["y"] > 0.97  # learnt in x, plain in y
    strong = {"a": {"x": 1.0, "y": 1.0}}
    fast = simulate.plain_arm_stream(strong, step_ms=2.0, plain_ms=1.0, gamma=4, tokens_per_category=400, seed=0)
    assert fast["y"] == pytest.approx(2.5, rel=0.02)  # 5 tokens per 2 ms against 1 per 1 ms
    assert simulate.plain_arm_stream(weak, 2.0, 1.0, 4, 100, seed=3) == simulate.plain_arm_stream(weak, 2.0, 1.0, 4,
                                                                                                  100, seed=3)
