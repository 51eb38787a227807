"""Start-up time of `import einopt` and `einopt --help` (target: < 1 s each).

python scripts/bench_startup.py
"""

import statistics
import subprocess
import sys
import time


def timed(cmd: list[str], runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    base = timed([sys.executable, "-c", "pass"])
    imp = timed([sys.executable, "-c", "import einopt"])
    helptime = timed([sys.executable, "-m", "einopt.cli", "--help"])
    print(f"python -c pass      {base * 1e3:7.0f} ms")
    print(f"import einopt       {imp * 1e3:7.0f} ms")
    print(f"einopt --help       {helptime * 1e3:7.0f} ms  (target < 1000 ms)")


if __name__ == "__main__":
    main()
