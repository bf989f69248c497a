"""The multiple-choice path's cost: a choices task of N questions x 4 choices
(an instant loglikelihood provider) against bare pytest making the same
calls (`-p no:evalreplay`: one parametrized test per question that asks the
same provider for its four log-likelihoods and picks the best), side by
side, in child processes (scale_harness.py).

    python benchmarks/mc_overhead.py            # 10,000 questions, 1 pair
    python benchmarks/mc_overhead.py --quick    # 2,000 questions, 1 pair
    python benchmarks/mc_overhead.py --runs 3   # steadier medians

Goals (issue #34): CPU within 1.10x of bare pytest's, peak RSS within 1.25x.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_harness import BARE, Compared, Measure, expect_in, run_pytest, verdict, warm_up

RSS_GOAL = 1.25
CPU_GOAL = 1.10

PROVIDER = '''
import zlib


class InstantLL:
    """Log-likelihoods at once: a fixed function of the continuation."""

    kind = "instant-ll"
    model = "instant-1"

    def generate(self, requests):
        raise AssertionError("a choices task asks for log-likelihoods only")

    def loglikelihood(self, requests):
        return [[(-(zlib.crc32(c.encode()) % 997) / 100.0, False) for c in r.continuations]
                for r in requests]
'''

CONFTEST = (
    PROVIDER
    + """

def pytest_evalreplay_make_provider(config, kind):
    return InstantLL() if kind == "instant-ll" else None
"""
)

WORDS = "red green blue apple river stone cloud seven quick lazy bright narrow"
EVALS = """
from pytest_evalreplay import EvalTask

WORDS = "{words}".split()
mc = EvalTask(
    "mc",
    [{{"id": f"q{{i}}", "question": f"Which word {{i}}?", "choices": WORDS[i % 8 : i % 8 + 4], "gold": i % 4}}
     for i in range({n})],
    prompt="Question: {{question}}\\nAnswer:",
    choices="choices",
    target="gold",
)
"""
BARE_TEST = """
import pytest
from pytest_evalreplay import Request

from provider import InstantLL

WORDS = "{words}".split()
PROVIDER = InstantLL()


@pytest.mark.parametrize("i", range({n}))
def test_question(i):
    choices = WORDS[i % 8 : i % 8 + 4]
    request = Request(task="mc", instance_id=f"q{{i}}", context=f"Question: Which word {{i}}?\\nAnswer:",
                      request_type="loglikelihood", continuations=tuple(" " + c for c in choices))
    (scores,) = PROVIDER.loglikelihood([request])
    best = max(range(len(choices)), key=lambda k: scores[k][0])
    assert best in range(4)
"""


def projects(tmp: Path, n: int) -> tuple[Path, Path]:
    ours, bare = tmp / f"mc-{n}", tmp / f"bare-{n}"
    ours.mkdir(parents=True)
    bare.mkdir(parents=True)
    (ours / "conftest.py").write_text(CONFTEST)
    (ours / "test_mc.py").write_text(EVALS.format(n=n, words=WORDS))
    (bare / "provider.py").write_text(PROVIDER)
    (bare / "test_bare.py").write_text(BARE_TEST.format(n=n, words=WORDS))
    return ours, bare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 questions")
    parser.add_argument("--questions", type=int, default=None, help="questions (default 10,000)")
    parser.add_argument("--runs", type=int, default=1, help="pairs")
    args = parser.parse_args(argv)
    n = args.questions or (2_000 if args.quick else 10_000)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalreplay-mc-") as name:
        tmp = Path(name)
        warm_up(tmp)
        ours, bare = projects(tmp, n)
        plugin: list[Measure] = []
        baseline: list[Measure] = []
        for k in range(args.runs):  # alternate which goes first, so load drifts hit both alike
            for side in ("plugin", "bare") if k % 2 == 0 else ("bare", "plugin"):
                if side == "plugin":
                    out = tmp / f"out-{k}"
                    m = run_pytest(ours, ["--evalreplay-provider=instant-ll", f"--evalreplay-output={out}"])
                    expect_in(m, f"{n} passed")
                    plugin.append(m)
                else:
                    m = run_pytest(bare, BARE)
                    expect_in(m, f"{n} passed")
                    baseline.append(m)
    c = Compared(plugin, baseline)
    print(
        f"multiple choice, {n:,} questions x 4 choices, median of {args.runs} run(s): plugin vs bare pytest"
    )
    print(c.line("cpu", "CPU time", "s", "plugin", "bare"))
    print(c.line("wall", "wall time", "s", "plugin", "bare"))
    print(c.line("maxrss_mib", "peak RSS", "MiB", "plugin", "bare"))
    fast = c.ratio("cpu") <= CPU_GOAL
    small = c.ratio("maxrss_mib") <= RSS_GOAL
    print(f"  goal     : CPU <= {CPU_GOAL}x bare -> {verdict(fast)}")
    print(f"  goal     : peak RSS <= {RSS_GOAL}x bare -> {verdict(small)}")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if fast and small else 1


if __name__ == "__main__":
    sys.exit(main())
