// Validates rendered chart output with the OpenAPI validators of
// kubernetes-models: built-in kinds, and the CRD kinds that the Go checks
// cannot send to an API server offline (KEDA's ScaledObject and
// TriggerAuthentication, the Prometheus Operator's ServiceMonitor and
// PrometheusRule). These validators check types, required fields and
// patterns; unknown fields are the Go strict decode's job.
//
//   node validate.mjs DIR   (DIR holds the *.yaml files hack/deploytest wrote)
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node validate.mjs DIR");
  process.exit(2);
}

// apiVersion -> module prefix
function modulePath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "keda.sh") return `@kubernetes-models/keda/keda.sh/${version}/${kind}`;
  if (group === "monitoring.coreos.com") return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}/${kind}`;
  if (group === "") return `kubernetes-models/${version}/${kind}`;
  return `kubernetes-models/${group}/${version}/${kind}`;
}

const counts = {};
let failures = 0;
const files = readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort();
if (files.length === 0) {
  console.error(`no rendered files in ${dir}`);
  process.exit(1);
}
for (const f of files) {
  for (const doc of parseAllDocuments(readFileSync(join(dir, f), "utf8"))) {
    const obj = doc.toJS();
    if (!obj) continue;
    const where = `${f}: ${obj.kind} ${obj.metadata?.name}`;
    let mod;
    try {
      mod = await import(modulePath(obj.apiVersion, obj.kind));
    } catch (e) {
      console.error(`${where}: no model for ${obj.apiVersion} ${obj.kind}: ${e.message}`);
      failures++;
      continue;
    }
    const Cls = mod[obj.kind] ?? mod.default;
    try {
      new Cls(obj).validate();
      counts[obj.kind] = (counts[obj.kind] ?? 0) + 1;
    } catch (e) {
      console.error(`${where}: ${e.message}`);
      failures++;
    }
  }
}
const required = ["ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"];
for (const k of required) {
  if (!counts[k]) {
    console.error(`no ${k} was validated: the scenarios must render one`);
    failures++;
  }
}
const total = Object.values(counts).reduce((a, b) => a + b, 0);
console.log(`crdcheck: ${total} objects valid in ${files.length} files: ${JSON.stringify(counts)}`);
if (failures > 0) {
  console.error(`crdcheck: ${failures} invalid`);
  process.exit(1);
}
