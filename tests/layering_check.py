#!/usr/bin/env python3
"""The layering of DESIGN.md's "may use" table, checked against the build: for every module, a header of
every other module is included from a probe compiled with that module's own compile line (taken from
compile_commands.json). A header the module may use must compile; any other must fail as "No such file",
because the module's include path does not reach it.

    layering_check.py BUILD_DIR SOURCE_DIR

VISIBLE is the table read transitively through public interfaces: the kernels are private to ops (ops
shares only their parameter vocabulary, kernels/conv_params.h, pool_params.h and reduction.h), so nn, amp
and everything above ops see no kernel. Keep it in step with the USES in CMakeLists.txt and DESIGN.md.
"""
import json
import pathlib
import shlex
import subprocess
import sys

VISIBLE = {
    "core": set(),
    "kernels": {"core"},
    "ops": {"core", "kernels"},
    "autograd": {"core", "ops"},
    "nn": {"core", "ops", "autograd"},
    "optim": {"core", "ops"},
    "amp": {"core", "ops", "autograd", "nn", "optim"},
    "data": {"core"},
    "io": {"core"},
    "distributed": {"core", "ops", "autograd", "nn", "optim", "amp"},
    "train": {"core", "ops", "autograd", "nn", "optim", "amp", "data", "io", "distributed"},
}
# One public header per module (kernels: a compute header, not the shared vocabulary).
HEADER = {
    "core": "demi/core/tensor.h", "kernels": "demi/kernels/cpu/amp_kernels.h", "ops": "demi/ops/ops.h",
    "autograd": "demi/autograd/autograd.h", "nn": "demi/nn/cell.h", "optim": "demi/optim/optimizer.h",
    "amp": "demi/amp/policy.h", "data": "demi/data/dataset.h", "io": "demi/io/safetensors.h",
    "distributed": "demi/distributed/distributed.h", "train": "demi/train/model.h",
}
VOCABULARY = "demi/kernels/conv_params.h"  # what ops' users see of the kernels


def main() -> int:
    build, source = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
    commands = json.loads((build / "compile_commands.json").read_text())
    probe = build / "layering_probe.cc"
    failures = []
    checked = 0
    for module, visible in VISIBLE.items():
        prefix = str(source / "demi" / module) + "/"
        entry = next((e for e in commands if e["file"].startswith(prefix) and not e["file"].endswith("_test.cc")
                      and f"demi_{module}.dir" in e["command"]), None)
        if entry is None:
            failures.append(f"{module}: no compile command for its library in compile_commands.json")
            continue
        args = shlex.split(entry["command"])
        i = args.index("-o")
        args = args[:i] + args[i + 2:]
        args = [str(probe) if a == entry["file"] else a for a in args]
        cases = [(other, HEADER[other], other in visible or other == module) for other in VISIBLE]
        if module not in ("core", "data", "io"):
            cases.append(("kernels' vocabulary", VOCABULARY, True))

        def probe_with(headers, mode):
            probe.write_text("".join(f'#include "{h}"\n' for h in headers))
            return subprocess.run(args + mode, cwd=entry["directory"], capture_output=True, text=True)

        # Every header the module may use, in one probe compiled for syntax; only when that fails, one probe
        # per header, to name the one at fault.
        allowed = [(other, header) for other, header, ok in cases if ok]
        checked += len(allowed)
        if probe_with([h for _, h in allowed], ["-fsyntax-only"]).returncode != 0:
            for other, header in allowed:
                r = probe_with([header], ["-fsyntax-only"])
                if r.returncode != 0:
                    failures.append(f"{module} may use {other}, but including {header} fails:\n{r.stderr[-800:]}")
        # A header it may not use must not even be found: the preprocessor alone decides.
        for other, header, ok in cases:
            if ok:
                continue
            r = probe_with([header], ["-E", "-o", "/dev/null"])
            checked += 1
            if r.returncode == 0:
                failures.append(f"{module} may not use {other}, yet including {header} compiles")
            elif "No such file" not in r.stderr:
                failures.append(f"{module} + {header} fails for another reason than the include path:\n"
                                f"{r.stderr[-800:]}")
    probe.unlink(missing_ok=True)
    for f in failures:
        print("layering:", f)
    print(f"layering: {checked} includes probed, {len(failures)} wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
