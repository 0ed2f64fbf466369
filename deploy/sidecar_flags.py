"""Checks every flag the rendered manifests give a CSI sidecar against that
sidecar's own `--help`, so a flag a new release renamed or removed fails
here, before a Pod crash-loops on it.

    python3 deploy/sidecar_flags.py csi-provisioner=PATH ... -- RENDERED.yaml ...

Each NAME=PATH is a sidecar binary (tools/build NAME); a container runs
sidecar NAME when its image's repository ends in /NAME.
"""
import re
import subprocess
import sys

import yaml


def help_flags(binary):
    """The flags a Go `flag` (or pflag) program lists in its --help."""
    run = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    text = run.stdout + run.stderr
    flags = set(re.findall(r"^\s+--?([A-Za-z0-9][A-Za-z0-9_.-]*)", text, re.M))
    if len(flags) < 5:
        sys.exit(f"FAIL {binary} --help listed {len(flags)} flags: not a sidecar's help?\n{text[:2000]}")
    return flags


def containers(doc):
    spec = (doc.get("spec") or {}).get("template", {}).get("spec", {})
    return (spec.get("containers") or []) + (spec.get("initContainers") or [])


def main(argv):
    sep = argv.index("--")
    tools = dict(a.split("=", 1) for a in argv[:sep])
    files = argv[sep + 1:]
    known = {name: help_flags(path) for name, path in tools.items()}
    failures = checked = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            for c in containers(doc):
                repo = c.get("image", "").split("@")[0].rsplit(":", 1)[0]
                name = repo.rsplit("/", 1)[-1]
                if name not in known:
                    continue
                for arg in c.get("args") or []:
                    m = re.match(r"^--?([A-Za-z0-9][A-Za-z0-9_.-]*)", arg)
                    if not m:
                        continue
                    checked += 1
                    if m.group(1) not in known[name]:
                        print(f"FAIL {path}: {doc['kind']}/{doc['metadata']['name']} container "
                              f"{c['name']}: {name} has no flag --{m.group(1)} (its --help lists none)")
                        failures += 1
    if checked == 0:
        sys.exit("FAIL no sidecar container found in the rendered manifests")
    if failures:
        sys.exit(f"{failures} sidecar flags unknown to the sidecars built from tools/")
    print(f"all {checked} sidecar flags in the rendered manifests are in the sidecars' --help "
          f"({', '.join(sorted(tools))})")


if __name__ == "__main__":
    main(sys.argv[1:])
