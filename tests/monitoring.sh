#!/usr/bin/env bash
# Offline checks of deploy/monitoring/ (the operations kit):
#  - alerts.yaml passes `promtool check rules`, and its unit tests
#    (alerts_test.yaml) pass `promtool test rules`;
#  - every alert has a severity, a summary, a description and a runbook_url
#    whose anchor is a runbook (a `##` section) in docs/runbooks.md, every
#    runbook named after an alert is one alerts.yaml defines, and the unit
#    tests have,
#    for every alert, a case where it fires and one where it stays silent;
#  - prometheusrule.yaml carries exactly alerts.yaml's groups;
#  - the ServiceMonitor and PodMonitor select the operator's Service and pods
#    in its namespace, on the port that serves metrics, over HTTPS with a
#    bearer token, and make the job label the one the alerts name; the
#    metrics-reader binding names the shipped ClusterRole;
#  - the Grafana dashboard parses, every panel queries ${datasource}, every
#    range is $__rate_interval, and every PromQL expression in it is valid
#    (each becomes a recording rule that `promtool check rules` parses).
# Whether every metric named here is exported is checked against the real
# binary by actors/tests/monitoring_kit.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "monitoring: FAILED: $*" >&2; exit 1; }

command -v promtool >/dev/null ||
  fail "promtool is not installed: run 'bash tests/system-packages.sh test' (Debian package prometheus)"
if ! python3 -c 'import yaml' 2>/dev/null || ! command -v kubernetes-validate >/dev/null; then
  echo "installing manifest tools from PyPI: pyyaml kubernetes-validate" >&2
  python3 -m pip install --quiet --disable-pip-version-check pyyaml kubernetes-validate
fi

kit=deploy/monitoring
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

promtool check rules "$kit/alerts.yaml" || fail "promtool check rules $kit/alerts.yaml"
promtool test rules "$kit/alerts_test.yaml" || fail "promtool test rules $kit/alerts_test.yaml"

python3 - "$kit" "$out" <<'PY' || fail "the checks above (deploy/monitoring)"
import json, re, sys, yaml

kit, out = sys.argv[1], sys.argv[2]
errors = []
def check(ok, message):
    if not ok:
        errors.append(message)
    return ok

def load_all(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]

RUNBOOKS = "https://github.com/egress-proxies/egress-proxies-operator/blob/main/docs/runbooks.md#"
SEVERITIES = {"critical", "warning"}

# --- the runbooks: the `##` sections of docs/runbooks.md -------------------
def slug(heading):
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
runbooks, fenced = set(), False
for line in open("docs/runbooks.md"):
    if line.startswith("```"):
        fenced = not fenced
    elif not fenced and line.startswith("## "):
        runbooks.add(slug(line[3:]))
check(runbooks, "docs/runbooks.md has no `##` runbooks")

# --- alerts.yaml ------------------------------------------------------------
alerts_doc = yaml.safe_load(open(f"{kit}/alerts.yaml"))
groups = alerts_doc["groups"]
alerts = {}
for group in groups:
    for rule in group["rules"]:
        name = rule.get("alert")
        if not check(name, f"alerts.yaml group {group['name']}: a rule that is not an alert ({rule.get('record')})"):
            continue
        check(name not in alerts, f"alerts.yaml: alert {name} is defined twice")
        alerts[name] = rule
        labels, annotations = rule.get("labels", {}), rule.get("annotations", {})
        check(labels.get("severity") in SEVERITIES,
              f"alert {name}: severity {labels.get('severity')!r} is not one of {sorted(SEVERITIES)}")
        for key in ("summary", "description", "runbook_url"):
            check(str(annotations.get(key, "")).strip(), f"alert {name}: no {key} annotation")
        url = annotations.get("runbook_url", "")
        if check(url.startswith(RUNBOOKS), f"alert {name}: runbook_url {url!r} does not start with {RUNBOOKS}"):
            anchor = url[len(RUNBOOKS):]
            check(anchor in runbooks,
                  f"alert {name}: runbook_url anchor #{anchor} is not a `##` runbook in docs/runbooks.md")
check(alerts, "alerts.yaml defines no alert")
alert_slugs = {slug(n) for n in alerts}
for anchor in sorted(runbooks):
    if anchor.startswith("egressproxies"):
        check(anchor in alert_slugs, f"docs/runbooks.md has a runbook #{anchor} for an alert alerts.yaml does not define")

# --- the unit tests: every alert fires somewhere and stays silent somewhere --
tests = yaml.safe_load(open(f"{kit}/alerts_test.yaml"))
check(tests.get("rule_files") == ["alerts.yaml"], "alerts_test.yaml does not test alerts.yaml (rule_files)")
fires, silent = set(), set()
for test in tests["tests"]:
    for case in test.get("alert_rule_test", []):
        name = case["alertname"]
        check(name in alerts, f"alerts_test.yaml ({test.get('name')}): unknown alert {name}")
        (fires if case.get("exp_alerts") else silent).add(name)
for name in alerts:
    check(name in fires, f"alerts_test.yaml: no case where {name} fires")
    check(name in silent, f"alerts_test.yaml: no case where {name} stays silent")

# --- prometheusrule.yaml == alerts.yaml --------------------------------------
rule = yaml.safe_load(open(f"{kit}/prometheusrule.yaml"))
check((rule.get("apiVersion"), rule.get("kind")) == ("monitoring.coreos.com/v1", "PrometheusRule"),
      f"prometheusrule.yaml is a {rule.get('apiVersion')} {rule.get('kind')}, not a monitoring.coreos.com/v1 PrometheusRule")
theirs = rule.get("spec", {}).get("groups")
if theirs != groups:
    ours_rules = {r.get("alert"): r for g in groups for r in g["rules"]}
    their_rules = {r.get("alert"): r for g in theirs or [] for r in g["rules"]}
    differing = sorted(n for n in set(ours_rules) | set(their_rules) if ours_rules.get(n) != their_rules.get(n))
    errors.append("prometheusrule.yaml's spec.groups differ from alerts.yaml's groups"
                  + (f" (alerts {', '.join(map(str, differing))})" if differing else " (group names or order)")
                  + ": copy alerts.yaml's groups into it")

# --- the operator's manifests the monitors must match ------------------------
namespace = yaml.safe_load(open("deploy/default/kustomization.yaml"))["namespace"]
services = {d["metadata"]["name"]: d for d in load_all("deploy/manager/services.yaml")}
deployment = yaml.safe_load(open("deploy/manager/deployment.yaml"))
pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
container = deployment["spec"]["template"]["spec"]["containers"][0]
metrics_bind = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--metrics-bind-address=")]
metrics_port = int(metrics_bind[0].rsplit(":", 1)[1]) if metrics_bind else 8080
container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
metrics_port_name = next((n for n, p in container_ports.items() if p == metrics_port), None)
check(metrics_port_name, f"deploy/manager/deployment.yaml has no container port {metrics_port} (--metrics-bind-address)")
service = services.get("egress-proxies-metrics")
check(service, "deploy/manager/services.yaml has no Service egress-proxies-metrics")
service_port = next((p for p in service["spec"]["ports"] if p.get("targetPort") == metrics_port_name), None) if service else None
check(service_port, f"Service egress-proxies-metrics has no port targeting {metrics_port_name!r}")
metrics_auth = load_all("deploy/rbac-base/metrics_auth.yaml")
readers = {d["metadata"]["name"] for d in metrics_auth if d["kind"] == "ClusterRole"
           and any("/metrics" in r.get("nonResourceURLs", []) and "get" in r.get("verbs", []) for r in d["rules"])}
check(readers, "deploy/rbac-base/metrics_auth.yaml has no ClusterRole allowing get on /metrics")

alert_jobs = set(re.findall(r'job\s*=\s*"([^"]*)"', "\n".join(r["expr"] for r in alerts.values())))
check(len(alert_jobs) == 1, f"alerts.yaml names several jobs: {sorted(alert_jobs)}")

def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())

def check_monitor(path, kind, endpoints_key, target_labels, port_name, port_what):
    docs = load_all(path)
    monitors = [d for d in docs if d.get("kind") == kind]
    if not check(len(monitors) == 1, f"{path}: {len(monitors)} {kind} objects, not one"):
        return None, docs
    m = monitors[0]
    check(m.get("apiVersion") == "monitoring.coreos.com/v1", f"{path}: apiVersion {m.get('apiVersion')}")
    spec = m["spec"]
    check(spec.get("namespaceSelector", {}).get("matchNames") == [namespace],
          f"{path}: namespaceSelector.matchNames is not [{namespace}] (deploy/default's namespace)")
    selector = spec.get("selector", {}).get("matchLabels")
    check(selector and subset(selector, target_labels),
          f"{path}: selector {selector} does not select the {port_what} (labels {target_labels})")
    job = target_labels.get(spec.get("jobLabel"))
    check(job and {job} == alert_jobs,
          f"{path}: the job label it gives ({spec.get('jobLabel')} = {job!r}) is not the job alerts.yaml names {sorted(alert_jobs)}")
    endpoints = spec.get(endpoints_key, [])
    if check(len(endpoints) == 1, f"{path}: {len(endpoints)} {endpoints_key}, not one"):
        e = endpoints[0]
        check(e.get("port") == port_name, f"{path}: port {e.get('port')!r} is not {port_name!r}, the {port_what}'s metrics port")
        check(e.get("scheme") == "https", f"{path}: scheme {e.get('scheme')!r}: the operator serves metrics over HTTPS")
        check(e.get("path", "/metrics") == "/metrics", f"{path}: path {e.get('path')!r}")
        check(e.get("tlsConfig", {}).get("insecureSkipVerify") is True,
              f"{path}: tlsConfig.insecureSkipVerify must be true for the default self-signed certificate")
        check(e.get("bearerTokenFile") or e.get("authorization", {}).get("credentials"),
              f"{path}: no bearer token (bearerTokenFile or authorization.credentials): /metrics answers 401 without one")
    return m, docs

if service and service_port:
    check_monitor(f"{kit}/servicemonitor.yaml", "ServiceMonitor", "endpoints",
                  service["metadata"].get("labels", {}), service_port["name"], "Service egress-proxies-metrics")
pm, pm_docs = check_monitor(f"{kit}/podmonitor.yaml", "PodMonitor", "podMetricsEndpoints",
                            pod_labels, metrics_port_name, "operator pods")
sa_token_accounts = set()
if pm:
    credentials = pm["spec"]["podMetricsEndpoints"][0].get("authorization", {}).get("credentials", {})
    secrets = [d for d in pm_docs if d.get("kind") == "Secret" and d["metadata"]["name"] == credentials.get("name")]
    if check(secrets, f"podmonitor.yaml: the token Secret {credentials.get('name')!r} is not in the file"):
        secret = secrets[0]
        check(secret["metadata"].get("namespace") == pm["metadata"].get("namespace"),
              "podmonitor.yaml: the token Secret is not in the PodMonitor's namespace")
        check(secret.get("type") == "kubernetes.io/service-account-token" and credentials.get("key") == "token",
              "podmonitor.yaml: the credentials are not the `token` of a kubernetes.io/service-account-token Secret")
        sa_token_accounts.add((secret["metadata"]["annotations"].get("kubernetes.io/service-account.name"),
                               secret["metadata"].get("namespace")))
binding = yaml.safe_load(open(f"{kit}/metrics-reader-binding.yaml"))
check(binding["kind"] == "ClusterRoleBinding" and binding["roleRef"]["name"] in readers,
      f"metrics-reader-binding.yaml does not bind a ClusterRole that allows get /metrics ({sorted(readers)})")
bound = {(s["name"], s.get("namespace")) for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
check(sa_token_accounts <= bound,
      f"podmonitor.yaml's token belongs to {sorted(sa_token_accounts)}, which metrics-reader-binding.yaml does not bind ({sorted(bound)})")
builtin = [d for d in pm_docs if d.get("kind") == "Secret"] + [binding]
yaml.safe_dump_all(builtin, open(f"{out}/builtin.yaml", "w"))

# --- the Grafana dashboard -------------------------------------------------
try:
    dash = json.load(open(f"{kit}/grafana-dashboard.json"))
except ValueError as e:
    print(f"monitoring: grafana-dashboard.json does not parse: {e}", file=sys.stderr)
    sys.exit(1)
check(dash.get("schemaVersion", 0) >= 36, f"grafana-dashboard.json: schemaVersion {dash.get('schemaVersion')} (want 36 or later)")
check(dash.get("uid") and dash.get("title"), "grafana-dashboard.json: no uid or title")
variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
ds = variables.get("datasource", {})
check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
      "grafana-dashboard.json: no `datasource` variable of type datasource querying prometheus")
check("job" in variables, "grafana-dashboard.json: no `job` variable")
check(any(i.get("type") == "datasource" and i.get("pluginId") == "prometheus" for i in dash.get("__inputs", [])),
      "grafana-dashboard.json: no prometheus datasource in __inputs")
DS = {"type": "prometheus", "uid": "${datasource}"}
for name, v in variables.items():
    if v.get("type") == "query":
        check(v.get("datasource") == DS, f"grafana-dashboard.json: variable {name} does not query ${{datasource}}")
# Values the variables stand for when the expressions are checked.
values = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "job": "egress-proxies-operator", "namespace": ".*"}
panels, ids, records = [], set(), []
def walk(ps):
    for p in ps:
        panels.append(p)
        walk(p.get("panels", []))
walk(dash.get("panels", []))
for p in panels:
    title = p.get("title", "?")
    check(p.get("id") not in ids, f"grafana-dashboard.json: panel id {p.get('id')} used twice")
    ids.add(p.get("id"))
    g = p.get("gridPos", {})
    check(g.get("x", 0) + g.get("w", 0) <= 24, f"panel {title!r}: wider than the grid ({g})")
    if p.get("type") == "row":
        continue
    check(p.get("datasource") == DS, f"panel {title!r}: datasource {p.get('datasource')} is not ${{datasource}}")
    targets = p.get("targets", [])
    check(targets, f"panel {title!r}: no query")
    for t in targets:
        expr = t.get("expr", "")
        where = f"panel {title!r} query {t.get('refId')}"
        if not check(expr.strip(), f"{where}: empty expr"):
            continue
        check(t.get("datasource", DS) == DS, f"{where}: datasource {t.get('datasource')} is not ${{datasource}}")
        for window in re.findall(r"\[([^\]]*)\]", expr):
            check(window == "$__rate_interval", f"{where}: range [{window}] is not [$__rate_interval]")
        check('job="$job"' in expr, f'{where}: does not select job="$job"')
        used = set(re.findall(r"\$\{?(\w+)", expr))
        for var in used - set(values):
            errors.append(f"{where}: unknown variable ${var}")
        check(used - {"__rate_interval", "__interval", "__range"} <= set(variables),
              f"{where}: uses variables the dashboard does not define: {sorted(used - set(variables))}")
        concrete = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)
        records.append({"record": f"dashboard:panel{p.get('id')}:{t.get('refId', 'A').lower()}", "expr": concrete,
                        "labels": {"panel": title}})
check(records, "grafana-dashboard.json: no query at all")
yaml.safe_dump({"groups": [{"name": "grafana-dashboard", "rules": records}]}, open(f"{out}/dashboard-rules.yaml", "w"), width=1000)
open(f"{out}/summary.txt", "w").write(f"{len(alerts)} alerts with unit tests and runbooks, {len(records)} dashboard expressions")

if errors:
    print(f"monitoring: {len(errors)} problem(s) in deploy/monitoring:", file=sys.stderr)
    for e in errors:
        print(f"  - {e}", file=sys.stderr)
    sys.exit(1)
PY

# Every PromQL expression of the dashboard, as recording rules.
promtool check rules "$out/dashboard-rules.yaml" >/dev/null ||
  { promtool check rules "$out/dashboard-rules.yaml" >&2 || true; fail "a PromQL expression of $kit/grafana-dashboard.json does not parse (rules above name the panel)"; }
# The built-in kinds of the samples (the token Secret, the ClusterRoleBinding).
kubernetes-validate --strict --quiet "$out/builtin.yaml" || fail "the built-in objects of $kit (Secret, ClusterRoleBinding) do not validate"

echo "monitoring ok: $(cat "$out/summary.txt"), PrometheusRule in step, monitors in step with deploy/"
