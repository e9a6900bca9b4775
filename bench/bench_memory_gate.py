"""The memory-write gate's cost on the event loop (issue 45 N3, N8): ``own_words`` checks every
memory write of a turn that carried third-party material — up to a 30,000-character file, the
tool results, the forwards replayed from earlier turns. The check runs on the loop, so its CPU
is another chat's wait. Measured in-process, the words of one fact against material of growing
size: the check as it was before (``taken_from_material`` segmenting every material with jieba,
reproduced here as the baseline) against the check now (only the fact is segmented, the material
searched), plus ``uncovered`` (the typed words' coverage). Median of the runs, CPU time.

    python -m bench.bench_memory_gate [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LINE = "周会纪要：发布推迟到下周一，测试还没跑完，同意推迟。迁移脚本 migration script 我周日再检查一遍。"
FACT = "用户周日检查迁移脚本"
SAID = "记一下我周日要做的事"


def _segmenting(content: str, *, said: str, material: list[str]) -> tuple[str, ...]:
    """The check before issue 45 (memory/text/untrusted.py at 61912ac): every material segmented."""
    from memory.text.untrusted import _terms, material_texts, strip

    bodies = [*material, *material_texts(said)]
    if not content or not any(b.strip() for b in bodies):
        return ()
    own = _terms(strip(said))
    seen = set().union(*(_terms(b) for b in bodies))
    return tuple(sorted((_terms(content) & seen) - own))


def _cpu(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    times.sort()
    return times[len(times) // 2]


def run(quick: bool = False) -> list[str]:
    from bench.common import table
    from memory.text.tokenizer import warm_up
    from memory.text.untrusted import taken_from_material, uncovered

    warm_up()
    runs = 3 if quick else 9
    rows = []
    for chars in ((1_000, 30_000) if quick else (1_000, 10_000, 30_000, 100_000)):
        body = (LINE * (chars // len(LINE) + 1))[:chars]
        material = [body]
        before = _segmenting(FACT, said=SAID, material=material)
        now = taken_from_material(FACT, said=SAID, material=material)
        assert before and now, (before, now)         # both find the words the material supplied
        b = _cpu(lambda: _segmenting(FACT, said=SAID, material=material), runs)
        n = _cpu(lambda: taken_from_material(FACT, said=SAID, material=material), runs)
        u = _cpu(lambda: uncovered(FACT, said=SAID), runs)
        rows.append((f"{chars:,}", f"{b * 1000:.2f}", f"{n * 1000:.2f}", f"{n / b:.3f}×" if b else "—",
                     f"{u * 1000:.3f}", ", ".join(now)))
    return [*table(["material chars", "segmenting (before) ms", "searching (now) ms", "now / before",
                    "uncovered ms", "words taken (now)"], rows),
            "", f"CPU time per check (median of {runs}); one fact of {len(FACT)} characters."]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print("\n".join(run(ap.parse_args().quick)))
