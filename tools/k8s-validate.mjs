// k8s-validate.mjs - validates Kubernetes manifests against the Kubernetes API's OpenAPI schemas
// (kubernetes-models: Ajv validators generated from them; @kubernetes-models/prometheus-operator
// for ServiceMonitor and PodMonitor, @kubernetes-models/cert-manager for Issuer and Certificate), one YAML stream per file ("-" for stdin). With --values
// SCHEMA FILE..., first validates a Helm chart's values (FILEs merged in order) against its
// values.schema.json with Ajv, as helm does. Exit 0 when every document is valid.
// Usage: node tools/k8s-validate.mjs [--values values.schema.json values.yaml [more.yaml]... --] MANIFESTS...
import fs from 'node:fs';
import YAML from 'yaml';
import Ajv from 'ajv';

const args = process.argv.slice(2);
const problems = [];
let checked = 0;

function merge(dst, src) {
  for (const [k, v] of Object.entries(src || {})) {
    if (v && typeof v === 'object' && !Array.isArray(v) && dst[k] && typeof dst[k] === 'object' && !Array.isArray(dst[k]))
      merge(dst[k], v);
    else dst[k] = v;
  }
  return dst;
}

if (args[0] === '--values') {
  const end = args.indexOf('--');
  const [schemaFile, ...valueFiles] = args.slice(1, end < 0 ? args.length : end);
  args.splice(0, end < 0 ? args.length : end + 1);
  const values = valueFiles.reduce((acc, f) => merge(acc, YAML.parse(fs.readFileSync(f, 'utf8')) || {}), {});
  const ajv = new Ajv({ allErrors: true, strict: false });
  const validate = ajv.compile(JSON.parse(fs.readFileSync(schemaFile, 'utf8')));
  if (!validate(values))
    for (const e of validate.errors) problems.push(`values (${valueFiles.join(' + ')}): ${e.instancePath || '(top)'} ${e.message}`);
  else console.log(`ok   values ${valueFiles.join(' + ')} match ${schemaFile}`);
}

async function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  let mod;
  try {
    if (group === 'monitoring.coreos.com') mod = await import(`@kubernetes-models/prometheus-operator/${group}/${version}`);
    else if (group === 'cert-manager.io') mod = await import(`@kubernetes-models/cert-manager/${group}/${version}`);
    else mod = await import(`kubernetes-models/${group ? group + '/' : ''}${version}`);
  } catch (e) {
    return null;
  }
  return mod[kind] || null;
}

const NAMESPACED_NOT = new Set(['Namespace', 'PriorityClass', 'ClusterRole', 'ClusterRoleBinding', 'CustomResourceDefinition']);
for (const file of args) {
  const text = fs.readFileSync(file === '-' ? 0 : file, 'utf8');
  for (const doc of YAML.parseAllDocuments(text)) {
    if (doc.errors.length) {
      problems.push(`${file}: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (!obj) continue;
    const where = `${file}: ${obj.kind}/${obj.metadata && obj.metadata.name}`;
    if (!obj.apiVersion || !obj.kind || !obj.metadata || !obj.metadata.name) {
      problems.push(`${where}: lacks apiVersion, kind or metadata.name`);
      continue;
    }
    if (!NAMESPACED_NOT.has(obj.kind) && !obj.metadata.namespace)
      problems.push(`${where}: has no namespace`);
    const Model = await modelFor(obj.apiVersion, obj.kind);
    if (!Model) {
      problems.push(`${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    try {
      new Model(obj).validate();
      checked++;
      console.log(`ok   ${where}`);
    } catch (e) {
      problems.push(`${where}: ${e.message.split('\n').slice(0, 4).join('; ')}`);
    }
  }
}
if (problems.length) {
  for (const p of problems) console.log(`FAIL ${p}`);
  process.exit(1);
}
if (!checked) {
  console.log('FAIL no manifest was checked');
  process.exit(1);
}
console.log(`k8s-validate: ${checked} object(s) valid against the Kubernetes schemas`);
