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
#     included;
#   - the chart as a subchart: tests/fixtures/subchart (a parent chart
#     with csi-scsi as a file:// dependency), its dependency built in a
#     copy (never in the tree), rendered with its defaults and with each
#     ci/*-values.yaml given under the key csi-scsi;
#   - the optional kinds of other projects the chart can render
#     (ServiceMonitor, PodMonitor; cert-manager's Issuer and Certificate):
#     strictly against the fields of their upstream CRDs the chart uses,
#     written out below (their CRDs are not here).
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
for dir in base overlays/* crds examples examples/*; do
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
    # The chart as a parent chart's dependency: the fixture and the chart
    # copied as the repository lays them out (the fixture names
    # file://../../../deploy/chart/csi-scsi), so `helm dependency build`
    # writes charts/ and Chart.lock into the copy. $out/subchart/ is kept
    # with RENDERED_DIR (.ci/deploy-check runs parity.py on it).
    sub="$out/subchart"
    parent="$sub/tests/fixtures/subchart"
    rm -rf "$sub"
    mkdir -p "$sub/tests/fixtures" "$sub/deploy/chart"
    cp -R ../tests/fixtures/subchart "$sub/tests/fixtures/"
    cp -R chart/csi-scsi "$sub/deploy/chart/"
    echo "== helm dependency build tests/fixtures/subchart (a copy)"
    helm dependency build "$parent" >/dev/null
    echo "== helm lint --strict tests/fixtures/subchart (a copy)"
    helm lint --strict "$parent" >/dev/null
    echo "== helm template tests/fixtures/subchart"
    helm template csi-scsi "$parent" --namespace csi-scsi > "$out/helm-subchart.yaml"
    rendered+=("$out/helm-subchart.yaml")
    for values in chart/csi-scsi/ci/*-values.yaml; do
        [ -f "$values" ] || continue
        v="$(basename "$values" .yaml)"
        # csi-scsi's values under the parent's key for it.
        { echo "csi-scsi:"; sed 's/^\(.\)/  \1/' "$values"; } > "$sub/$v.yaml"
        echo "== helm template tests/fixtures/subchart -f (deploy/$values under csi-scsi:)"
        helm template csi-scsi "$parent" --namespace csi-scsi -f "$sub/$v.yaml" > "$out/helm-subchart-$v.yaml"
        rendered+=("$out/helm-subchart-$v.yaml")
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

# Kinds of other projects the chart renders only when asked
# (metrics.serviceMonitor, metrics.podMonitor, certManager): their CRDs are
# not here, so each is held to the fields of its upstream CRD
# (prometheus-operator's monitoring.coreos.com/v1, cert-manager's
# cert-manager.io/v1) that the chart uses, strictly: a misspelt or
# misplaced field fails. Widen a schema when the chart uses a new field.
def obj(props, required=()):
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": list(required)}
STR = {"type": "string"}
STR_MAP = {"type": "object", "additionalProperties": STR}
STR_LIST = {"type": "array", "items": STR}
PROM_DURATION = {"type": "string",
                 "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
GO_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
LABEL_SELECTOR = obj({
    "matchLabels": STR_MAP,
    "matchExpressions": {"type": "array", "items": obj({
        "key": STR,
        "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
        "values": STR_LIST}, ["key", "operator"])},
})
METADATA = obj({"name": STR, "namespace": STR, "labels": STR_MAP, "annotations": STR_MAP}, ["name", "namespace"])
def kind(spec, spec_required=()):
    return obj({"apiVersion": STR, "kind": STR, "metadata": METADATA,
                "spec": obj(spec, spec_required)}, ["apiVersion", "kind", "metadata", "spec"])
SCRAPE = {"path": STR, "interval": PROM_DURATION, "scrapeTimeout": PROM_DURATION}
NAMESPACES = obj({"any": {"type": "boolean"}, "matchNames": STR_LIST})
USAGES = ["signing", "digital signature", "content commitment", "key encipherment",
          "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
          "decipher only", "any", "server auth", "client auth", "code signing",
          "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
          "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"]
OTHER_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): kind({
        "namespaceSelector": NAMESPACES,
        "selector": LABEL_SELECTOR,
        "endpoints": {"type": "array", "items": obj({"port": STR, **SCRAPE})},
    }, ["selector"]),
    ("monitoring.coreos.com/v1", "PodMonitor"): kind({
        "namespaceSelector": NAMESPACES,
        "selector": LABEL_SELECTOR,
        "podMetricsEndpoints": {"type": "array", "items": obj({"port": STR, **SCRAPE})},
    }, ["selector"]),
    ("cert-manager.io/v1", "Issuer"): kind({
        "selfSigned": obj({}),
        "ca": obj({"secretName": STR}, ["secretName"]),
    }),
    ("cert-manager.io/v1", "Certificate"): kind({
        "secretName": STR,
        "secretTemplate": obj({"labels": STR_MAP, "annotations": STR_MAP}),
        "isCA": {"type": "boolean"},
        "commonName": {"type": "string", "maxLength": 64},
        "uris": STR_LIST,
        "usages": {"type": "array", "items": {"enum": USAGES}},
        "privateKey": obj({
            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
            "encoding": {"enum": ["PKCS1", "PKCS8"]},
            "rotationPolicy": {"enum": ["Never", "Always"]},
            "size": {"type": "integer"}}),
        "duration": GO_DURATION,
        "renewBefore": GO_DURATION,
        "issuerRef": obj({"name": STR, "kind": STR, "group": STR}, ["name"]),
    }, ["secretName", "issuerRef"]),
}

failures = 0
checked = 0
other = 0
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
        other_schema = OTHER_KINDS.get((api_version, doc.get("kind")))
        if other_schema is not None:
            other += 1
            errs = [f"{'.'.join(map(str, e.path)) or '.'}: {e.message}"
                    for e in jsonschema.Draft7Validator(other_schema).iter_errors(doc)]
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
print(f"all {checked} rendered objects valid against Kubernetes {', '.join(versions)} and the csi-scsi.io CRDs"
      f" ({other} of other projects' kinds against the fields the chart uses)")
PY
