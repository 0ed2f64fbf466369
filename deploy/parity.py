#!/usr/bin/env python3
"""Checks that the Helm chart, with its default values, installs exactly
what the kustomize production overlay installs (or, with --values and
--overlay, that a values file installs what another overlay does).

    python3 deploy/parity.py [--chart deploy/chart/csi-scsi]
                             [--overlay deploy/overlays/production]
                             [--values FILE] [--skip-kind KIND ...]
                             [--skip-object KIND/NAME ...]
                             [--subchart NAME]

--skip-kind leaves out the overlay's objects of that kind, --skip-object
one object (the lab overlay renders the examples, which no values file
does; the install has Secrets of its own, so the examples' CHAP Secret is
left out by name).

--subchart NAME: --chart is a parent chart (its dependencies built) with
csi-scsi as its dependency NAME; the values file is csi-scsi's, given to
the parent under the key NAME, as a parent chart's user writes it.

Renders both (`helm template ... --include-crds`, `kubectl kustomize`, with
the `helm` and `kubectl` on PATH), pairs the objects by apiVersion, kind,
namespace and name, and compares each pair after removing only what is
expected to differ.

The chart is rendered with namespace.create=true: the overlays apply the
labelled Namespace, as `helm template | kubectl apply` does with that
value (with `helm install` it stays false, its default: the namespace
exists before the release). The Namespace's labels are compared too.

What may differ:

- the labels Helm adds (helm.sh/chart, app.kubernetes.io/managed-by,
  app.kubernetes.io/instance, app.kubernetes.io/version), wherever a
  `labels` map is, and the annotation helm.sh/resource-policy;
- the tag of csi-scsi's own images (the containers csi-scsi-proxy and
  csi-scsi-agent): the chart defaults to its appVersion, an overlay to its
  own tag. The sidecars' images are compared whole: their tags are the
  versions pinned in tools/*/go.mod;
- how a number is spelled: kustomize re-serialises the CRDs (0.0 becomes
  0), Helm copies crds/ verbatim; numbers compare by value, as the API
  server reads them;
- the label app.kubernetes.io/part-of on CustomResourceDefinitions, which
  the kustomize base stamps on every object: the chart's crds/ are plain
  copies of deploy/crds (byte-identical, .ci/deploy-check checks that),
  since Helm never templates crds/.

Any other difference fails, with a unified diff per object. Exit status: 0
when identical, 1 on a difference, 2 when rendering fails.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

import yaml

HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
HELM_ANNOTATIONS = {"helm.sh/resource-policy"}
OWN_IMAGES = {"csi-scsi-proxy", "csi-scsi-agent"}
TAG = re.compile(r":[^:/@]+$")


def render(cmd):
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        print(f"parity: {' '.join(cmd)} failed:\n{err}", file=sys.stderr)
        sys.exit(2)
    return [d for d in yaml.safe_load_all(out) if d]


def nest(values, key):
    """A values file under one key (`key:` and every line indented): what
    a parent chart's user writes for its dependency `key`."""
    lines = [("  " + line if line.strip() else line) for line in values.splitlines()]
    return f"{key}:\n" + "\n".join(lines) + "\n"


def strip_maps(node):
    """Drops the Helm labels and annotations from every labels/annotations
    map, and empty maps left behind."""
    if isinstance(node, dict):
        for key, drop in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
            m = node.get(key)
            if isinstance(m, dict):
                for k in drop & set(m):
                    del m[k]
                if not m:
                    del node[key]
        for v in node.values():
            strip_maps(v)
    elif isinstance(node, list):
        for v in node:
            strip_maps(v)


def numbers_by_value(node):
    """0.0 and 0 are one JSON number to the API server."""
    if isinstance(node, dict):
        return {k: numbers_by_value(v) for k, v in node.items()}
    if isinstance(node, list):
        return [numbers_by_value(v) for v in node]
    if isinstance(node, float) and node.is_integer():
        return int(node)
    return node


def untag_own_images(doc):
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        if c.get("name") in OWN_IMAGES and isinstance(c.get("image"), str):
            c["image"] = TAG.sub(":<tag>", c["image"])


def normalise(doc, side):
    strip_maps(doc)
    untag_own_images(doc)
    if side == "kustomize" and doc.get("kind") == "CustomResourceDefinition":
        labels = doc.get("metadata", {}).get("labels", {})
        labels.pop("app.kubernetes.io/part-of", None)
        if not labels:
            doc.get("metadata", {}).pop("labels", None)
    return numbers_by_value(doc)


def key(doc):
    md = doc.get("metadata", {})
    return (doc.get("apiVersion", ""), doc.get("kind", ""), md.get("namespace", ""), md.get("name", ""))


def index(docs, side, label):
    out = {}
    for d in docs:
        k = key(d)
        if k in out:
            print(f"parity: {label} renders {fmt(k)} twice", file=sys.stderr)
            sys.exit(1)
        out[k] = normalise(d, side)
    return out


def fmt(k):
    api, kind, ns, name = k
    return f"{kind} {ns + '/' if ns else ''}{name} ({api})"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chart", default=os.path.join(here, "chart", "csi-scsi"))
    ap.add_argument("--overlay", default=os.path.join(here, "overlays", "production"))
    ap.add_argument("--namespace", default="csi-scsi")
    ap.add_argument("--values", help="a values file for the chart (default: its defaults)")
    ap.add_argument("--skip-kind", action="append", default=[],
                    help="leave out the overlay's objects of this kind")
    ap.add_argument("--skip-object", action="append", default=[],
                    help="leave out the overlay's object KIND/NAME")
    ap.add_argument("--subchart", metavar="NAME",
                    help="--chart is a parent chart with csi-scsi as its dependency NAME")
    args = ap.parse_args()

    prefix = f"{args.subchart}." if args.subchart else ""
    with tempfile.TemporaryDirectory() as tmp:
        values = []
        if args.values:
            path = args.values
            if args.subchart:
                path = os.path.join(tmp, "values.yaml")
                with open(args.values) as src, open(path, "w") as dst:
                    dst.write(nest(src.read(), args.subchart))
            values = ["-f", path]
        helm = render(["helm", "template", "csi-scsi", args.chart,
                       "--namespace", args.namespace, "--include-crds",
                       "--set", f"{prefix}namespace.create=true"] + values)
    kust = [d for d in render(["kubectl", "kustomize", args.overlay])
            if d.get("kind") not in args.skip_kind
            and f"{d.get('kind')}/{d.get('metadata', {}).get('name')}" not in args.skip_object]
    h = index(helm, "helm", "the chart")
    k = index(kust, "kustomize", "the overlay")

    what = os.path.relpath(args.values) if args.values else "defaults"
    if args.subchart:
        what += f", as the subchart {args.subchart} of {os.path.basename(os.path.normpath(args.chart))}"
    problems = 0
    for only, where in ((sorted(set(k) - set(h)), "the overlay only"),
                        (sorted(set(h) - set(k)), "the chart only")):
        for x in only:
            print(f"DIFF {fmt(x)}: rendered by {where}")
            problems += 1
    for x in sorted(set(h) & set(k)):
        a = yaml.safe_dump(k[x], sort_keys=True, default_flow_style=False).splitlines()
        b = yaml.safe_dump(h[x], sort_keys=True, default_flow_style=False).splitlines()
        if a != b:
            problems += 1
            print(f"DIFF {fmt(x)}:")
            for line in difflib.unified_diff(a, b, "kustomize " + os.path.relpath(args.overlay),
                                             "helm " + os.path.relpath(args.chart), lineterm="", n=4):
                print("    " + line)
    if problems:
        print(f"parity: {problems} difference(s) between the chart ({what}) and the overlay")
        return 1
    print(f"parity: chart ({what}) == {os.path.relpath(args.overlay)} ({len(h)} objects)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
