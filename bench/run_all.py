"""Run every benchmark under bench/ (bench_*.py, each with main(argv)) and list the result files.

`make bench` runs them in full; `python -m bench.run_all --quick` runs the short versions.
Each benchmark measures its own baseline in the same run and writes bench/results/<name>.json.
"""
import importlib
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    failed = []
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem
        print(f"== {name}{' (quick)' if quick else ''}", flush=True)
        started = time.monotonic()
        try:
            mod = importlib.import_module(f"bench.{name}")
            rc = mod.main(["--quick"] if quick else [])
        except SystemExit as exc:
            rc = exc.code
        except Exception as exc:  # one benchmark's failure does not hide the others' results
            print(f"{name}: failed: {exc}", file=sys.stderr)
            rc = 1
        if rc not in (0, None):
            failed.append(name)
        print(f"== {name}: {time.monotonic() - started:.1f} s", flush=True)
    print("results:", ", ".join(str(p.relative_to(HERE.parent)) for p in sorted((HERE / "results").glob("*.json"))))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
