#!/usr/bin/env bash
# Renders every install path of csi-scsi and validates every rendered
# object against the Kubernetes OpenAPI schemas:
#   - kustomize: deploy/base, deploy/overlays/*, deploy/crds, deploy/examples
#     (`kubectl kustomize`, offline);
#   - Helm: `helm template` of deploy/chart/*, with the default values and
#     with each chart's ci/*-values.yaml (needs `helm` on PATH; without it
#     the charts are skipped with a notice, and .ci/deploy-check, which
#     builds helm with tools/build, fails instead);
#   - built-in kinds (CRDs included) with kubernetes-validate (PyPI) in
#     strict mode, for the oldest and newest Kubernetes versions supported;
#   - csi-scsi.io objects against the schemas of our own CRDs, CEL rules
#     included.
# Needs kubectl, python3 with kubernetes-validate, jsonschema and PyYAML
# (.ci/deploy-check installs them). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"

# The oldest and newest minors of the support matrix (docs/kubernetes.md);
# .ci/deploy-check passes the ones tools/ pins.
versions="${KUBE_VERSIONS:-1.35.0 1.37.0}"
# RENDERED_DIR keeps what was rendered (.ci/deploy-check checks the
# sidecars' flags in it); otherwise a temporary directory.
if [ -n "${RENDERED_DIR:-}" ]; then
    out="$RENDERED_DIR"
    mkdir -p "$out"
else
    out="$(mktemp -d)"
    trap 'rm -rf "$out"' EXIT
fi

command -v kubectl >/dev/null || { echo "validate.sh: kubectl is required (kubectl kustomize)" >&2; exit 1; }

rendered=()
for dir in base overlays/* crds examples; do
    [ -f "$dir/kustomization.yaml" ] || continue
    name="kustomize-${dir//\//-}"
    echo "== kubectl kustomize deploy/$dir"
    kubectl kustomize "$dir" > "$out/$name.yaml"
    rendered+=("$out/$name.yaml")
done

if command -v helm >/dev/null; then
    for chart in chart/*/; do
        chart="${chart%/}"
        [ -f "$chart/Chart.yaml" ] || continue
        name="helm-$(basename "$chart")"
        echo "== helm template deploy/$chart"
        helm template csi-scsi "$chart" --namespace csi-scsi > "$out/$name.yaml"
        rendered+=("$out/$name.yaml")
        for values in "$chart"/ci/*-values.yaml; do
            [ -f "$values" ] || continue
            v="$(basename "$values" .yaml)"
            echo "== helm template deploy/$chart -f deploy/$values"
            helm template csi-scsi "$chart" --namespace csi-scsi -f "$values" > "$out/$name-$v.yaml"
            rendered+=("$out/$name-$v.yaml")
        done
    done
elif [ "${REQUIRE_HELM:-0}" = 1 ]; then
    echo "validate.sh: helm is required (REQUIRE_HELM=1) but not on PATH; tools/build helm prints one" >&2
    exit 1
else
    echo "== helm: not on PATH, charts skipped (tools/build helm builds one)"
fi

python3 - "$versions" crds "${rendered[@]}" <<'PY'
"""Validates rendered manifests: built-in kinds with kubernetes-validate,
csi-scsi.io kinds with jsonschema against our CRDs."""
import copy
import glob
import os
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

versions = sys.argv[1].split()
crd_dir = sys.argv[2]
files = sys.argv[3:]

# Our CRDs' schemas, by (apiVersion, kind).
schemas = {}
for path in sorted(glob.glob(os.path.join(crd_dir, "*.csi-scsi.io.yaml"))):
    with open(path) as f:
        crd = yaml.safe_load(f)
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    for v in crd["spec"]["versions"]:
        schemas[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]

# The CEL rules our CRDs carry, evaluated here the way the API server
# would. A rule without an evaluator fails: add one when adding a rule.
def has(obj, field):
    return isinstance(obj, dict) and obj.get(field) is not None

CEL = {
    "has(self.iscsi) != has(self.fibreChannel)": lambda s: has(s, "iscsi") != has(s, "fibreChannel"),
    "self.startsWith('iqn.') || self.startsWith('eui.') || self.startsWith('naa.')":
        lambda s: isinstance(s, str) and s.startswith(("iqn.", "eui.", "naa.")),
}

def to_jsonschema(s):
    """OpenAPI v3 (Kubernetes flavour) to JSON Schema: nullable, x- keys."""
    s = copy.deepcopy(s)
    def walk(node):
        if isinstance(node, dict):
            if node.pop("nullable", False) and "type" in node:
                node["type"] = [node["type"], "null"]
            for k in [k for k in node if k.startswith("x-kubernetes-")]:
                node.pop(k)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(s)
    return s

def cel_failures(schema, value, path="self"):
    out = []
    if not isinstance(schema, dict):
        return out
    for rule in schema.get("x-kubernetes-validations", []):
        check = CEL.get(rule["rule"])
        if check is None:
            out.append(f"{path}: no evaluator for CEL rule {rule['rule']!r} (add one to deploy/validate.sh)")
        elif value is not None and not check(value):
            out.append(f"{path}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                out += cel_failures(sub, value[k], f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += cel_failures(schema["items"], item, f"{path}[{i}]")
    return out

def strict_unknown_fields(schema, value, path):
    """Like the API server's strict field validation: no unknown fields."""
    out = []
    if isinstance(value, dict) and isinstance(schema, dict) and "properties" in schema:
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            for k in value:
                if k not in schema["properties"] and not (path == "" and k in ("apiVersion", "kind", "metadata")):
                    out.append(f"{path or '.'}: unknown field {k!r}")
        for k, sub in schema["properties"].items():
            if k in value:
                out += strict_unknown_fields(sub, value[k], f"{path}.{k}")
    return out

failures = 0
checked = 0
for path in files:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    name = os.path.basename(path)
    if not docs:
        print(f"FAIL {name}: rendered nothing")
        failures += 1
    for doc in docs:
        ident = f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        api_version = doc.get("apiVersion", "")
        checked += 1
        if api_version.startswith("csi-scsi.io/"):
            schema = schemas.get((api_version, doc.get("kind")))
            if schema is None:
                print(f"FAIL {ident}: no CRD in deploy/crds defines it")
                failures += 1
                continue
            errs = [e.message for e in jsonschema.Draft7Validator(to_jsonschema(schema)).iter_errors(doc)]
            errs += strict_unknown_fields(schema, doc, "")
            errs += cel_failures(schema.get("properties", {}).get("spec", {}), doc.get("spec"), "spec")
            for e in errs:
                print(f"FAIL {ident}: {e}")
            failures += bool(errs)
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                print(f"FAIL {ident} (Kubernetes {version}): {e.message} at {'.'.join(map(str, e.path))}")
                failures += 1
            except kubernetes_validate.SchemaNotFoundError as e:
                print(f"FAIL {ident} (Kubernetes {version}): no schema: {e}")
                failures += 1
if failures:
    print(f"{failures} invalid objects out of {checked}")
    sys.exit(1)
print(f"all {checked} rendered objects valid against Kubernetes {', '.join(versions)} and the csi-scsi.io CRDs")
PY
