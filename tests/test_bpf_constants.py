"""The constants the BPF C programs and the agent's Python share (bpf/common.h: "the Python side mirrors
every constant here; change both together"): an argument kind, a why-recorded bit, an event kind or a
call class that differs between the two would record garbage without an error. Read from the sources,
no BCC."""
import re
from pathlib import Path

from straggler.probes import loader, records, symbols

BPF = Path(__file__).resolve().parent.parent / "bpf"


def defines():
    out = {}
    for path in sorted(BPF.glob("*.[ch]")):
        for name, value in re.findall(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(\d+)\b", path.read_text(), re.M):
            assert out.setdefault(name, int(value)) == int(value), f"{name} defined twice with other values"
    return out


def test_every_shared_constant_has_one_value_in_c_and_python():
    c = defines()
    python = {name: getattr(symbols, name) for name in dir(symbols) if re.fullmatch(r"ARG_[A-Z0-9_]+", name)
              and isinstance(getattr(symbols, name), int)}
    python.update({name: getattr(records, name) for name in dir(records)
                   if re.fullmatch(r"(WHY|EV|PROC)_[A-Z]+", name) and isinstance(getattr(records, name), int)})
    python.update(NCCL_IN_PROGRESS=symbols.NCCL_IN_PROGRESS, CLASS_COLLECTIVE=symbols.CLASS_ID["collective"],
                  CLASS_SYNC=symbols.CLASS_ID["sync"],
                  NCLASSES=len(symbols.CALL_CLASSES) + 1, NBUCKETS=loader.NBUCKETS)
    assert {k for k in c if re.fullmatch(r"ARG_[A-Z0-9_]+", k)} == {k for k in python if k.startswith("ARG_")}
    assert {k for k in c if k.startswith("WHY_")} == {k for k in python if k.startswith("WHY_")}
    differ = {k: (c.get(k), v) for k, v in python.items() if c.get(k) != v}
    assert not differ, f"C vs Python: {differ}"
    assert records.NBUCKETS == loader.NBUCKETS
