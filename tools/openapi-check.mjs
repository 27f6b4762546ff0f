// openapi-check.mjs - validates responses recorded from a running kiln REST server against
// api/openapi.yaml with Ajv (JSON Schema 2020-12, as OpenAPI 3.1 uses), strictly: an object
// schema that does not say what else it allows allows nothing else, so a field the server
// returns and the spec omits fails. Also checks that the spec's operations and the server's
// route table are the same set and that every route has at least one successful response.
// Usage: node tools/openapi-check.mjs api/openapi.yaml responses.json
// responses.json: {"routes": [{method, path, open}], "records": [{method, path, route, status,
// content_type, body, server_refusal?}]} as tests/api/test_contract.c writes it (server_refusal:
// refused by the HTTP server before routing, checked against x-kiln-server-refusals). Exit 0
// when all agree.
import fs from 'node:fs';
import YAML from 'yaml';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const [specFile, recFile] = process.argv.slice(2);
if (!specFile || !recFile) {
  console.error('usage: node tools/openapi-check.mjs api/openapi.yaml responses.json');
  process.exit(2);
}
const spec = YAML.parse(fs.readFileSync(specFile, 'utf8'));
const { routes, records } = JSON.parse(fs.readFileSync(recFile, 'utf8'));
const problems = [];
const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

if (!/^3\.1\./.test(spec.openapi || '')) problems.push(`openapi is ${spec.openapi}: this check reads OpenAPI 3.1`);

// ---- schemas: refs point into one Ajv schema holding components.schemas as $defs ----------
const SPEC_ID = 'https://kiln.invalid/openapi';
function rewriteRefs(node) {
  if (Array.isArray(node)) return node.map(rewriteRefs);
  if (node && typeof node === 'object') {
    const out = {};
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string' && v.startsWith('#/components/schemas/'))
        out[k] = `${SPEC_ID}#/$defs/${v.slice('#/components/schemas/'.length)}`;
      else out[k] = rewriteRefs(v);
    }
    return out;
  }
  return node;
}
// An object schema with properties but no word on other keys gets additionalProperties: false;
// one that composes others (allOf) gets unevaluatedProperties: false and its parts are left as
// they are, so the properties of every part count.
function strict(node, composed = false) {
  if (Array.isArray(node)) return node.forEach((n) => strict(n, composed));
  if (!node || typeof node !== 'object') return;
  const open = 'additionalProperties' in node || 'unevaluatedProperties' in node;
  if (node.allOf && !open) node.unevaluatedProperties = false;
  else if (node.properties && !open && !composed) node.additionalProperties = false;
  for (const [k, v] of Object.entries(node)) {
    if (k === 'allOf') v.forEach((n) => strict(n, true));
    else if (k === 'properties' || k === '$defs' || k === 'patternProperties')
      Object.values(v).forEach((n) => strict(n));
    else if (['items', 'additionalProperties', 'not', 'prefixItems', 'contains'].includes(k)) strict(v);
    else if (k === 'anyOf' || k === 'oneOf') v.forEach((n) => strict(n));
  }
}

const ajv = new Ajv2020({ allErrors: true, strict: true, strictTypes: false, strictRequired: false });
addFormats(ajv);
for (const f of ['int32', 'int64']) ajv.addFormat(f, { type: 'number', validate: Number.isInteger });
for (const f of ['float', 'double']) ajv.addFormat(f, { type: 'number', validate: () => true });
ajv.addVocabulary(['example', 'discriminator', 'xml', 'externalDocs', 'x-kiln-events']);
const defs = rewriteRefs((spec.components && spec.components.schemas) || {});
strict({ $defs: defs });
try {
  ajv.addSchema({ $id: SPEC_ID, $defs: defs });
} catch (e) {
  problems.push(`components.schemas: ${e.message}`);
}
const compiled = new Map();
function validator(schema, where) {
  const key = JSON.stringify(schema);
  if (!compiled.has(key)) {
    const s = rewriteRefs(schema);
    strict(s);
    try {
      compiled.set(key, ajv.compile(s));
    } catch (e) {
      problems.push(`${where}: the schema does not compile: ${e.message}`);
      compiled.set(key, null);
    }
  }
  return compiled.get(key);
}
function deref(obj) {
  let o = obj;
  for (let i = 0; o && o.$ref && i < 10; i++) {
    const parts = o.$ref.replace(/^#\//, '').split('/');
    o = parts.reduce((a, p) => (a ? a[p.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), spec);
  }
  return o;
}

// ---- routes: the server's table and the spec's operations are the same set ------------------
const serverOps = new Set(routes.map((r) => `${r.method} ${r.path}`));
const specOps = new Set();
for (const [path, item] of Object.entries(spec.paths || {}))
  for (const m of METHODS) if (item[m]) specOps.add(`${m.toUpperCase()} ${path}`);
for (const op of serverOps)
  if (!specOps.has(op)) problems.push(`${op}: the server has this route; api/openapi.yaml does not describe it`);
for (const op of specOps)
  if (!serverOps.has(op)) problems.push(`${op}: api/openapi.yaml describes it; the server has no such route`);
for (const r of routes) {
  const item = spec.paths && spec.paths[r.path];
  const op = item && item[r.method.toLowerCase()];
  if (!op) continue;
  const open = Array.isArray(op.security) && (op.security.length === 0 || op.security.some((s) => Object.keys(s).length === 0));
  if (r.open && !open) problems.push(`${r.method} ${r.path}: needs no token, but the spec requires one (add security: [])`);
  if (!r.open && open && r.path !== '/metrics')
    problems.push(`${r.method} ${r.path}: needs a token, but the spec says it is open`);
}

// ---- every response ----------------------------------------------------------------------
function parseSse(text) {
  const events = [];
  for (const block of text.split(/\n\n/)) {
    const ev = { event: 'message', data: [] };
    for (const line of block.split('\n')) {
      if (line.startsWith('event:')) ev.event = line.slice(6).trim();
      else if (line.startsWith('data:')) ev.data.push(line.slice(5).replace(/^ /, ''));
    }
    if (ev.data.length) events.push({ event: ev.event, data: ev.data.join('\n') });
  }
  return events;
}

function checkBody(where, media, rec) {
  const ct = (rec.content_type || '').split(';')[0].trim().toLowerCase();
  if (!rec.body) {
    if (media && Object.keys(media).length && rec.method !== 'HEAD')
      problems.push(`${where}: the spec promises a body; the response has none`);
    return;
  }
  if (!media || !media[ct]) {
    problems.push(`${where}: the response is ${ct || 'untyped'}; the spec documents ${media ? Object.keys(media).join(', ') : 'no body'}`);
    return;
  }
  const m = media[ct];
  if (ct === 'application/json') {
    let body;
    try {
      body = JSON.parse(rec.body);
    } catch (e) {
      problems.push(`${where}: the body is not JSON: ${e.message}`);
      return;
    }
    const v = m.schema ? validator(m.schema, where) : null;
    if (v && !v(body))
      for (const e of v.errors.slice(0, 8))
        problems.push(`${where}: ${(e.instancePath || '(body)').replace(/\/\d+(?=\/|$)/g, '/*')} ${e.message}${e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : ''}${e.params && e.params.unevaluatedProperty ? ` (${e.params.unevaluatedProperty})` : ''}`);
  } else if (ct === 'text/event-stream') {
    const kinds = m['x-kiln-events'] || {};
    for (const ev of parseSse(rec.body)) {
      if (!kinds[ev.event]) {
        problems.push(`${where}: event "${ev.event}" is not among the documented x-kiln-events`);
        continue;
      }
      let data;
      try {
        data = JSON.parse(ev.data);
      } catch (e) {
        problems.push(`${where}: event "${ev.event}" data is not JSON`);
        continue;
      }
      const v = validator(kinds[ev.event], `${where} event ${ev.event}`);
      if (v && !v(data))
        for (const e of v.errors.slice(0, 4))
          problems.push(`${where} event ${ev.event}: ${(e.instancePath || '(data)').replace(/\/\d+(?=\/|$)/g, '/*')} ${e.message}${e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : ''}`);
    }
  }
}

const seen = new Map(); // "METHOD route" -> Set of statuses
for (const rec of records) {
  const where = `${rec.method} ${rec.route || rec.path} -> ${rec.status}`;
  let response;
  if (rec.server_refusal) {
    // refused by the HTTP server before any route (a URL or headers over its buffer)
    response = deref((spec['x-kiln-server-refusals'] || {})[String(rec.status)]);
    if (!response) {
      problems.push(`${where}: a request the server refuses answered ${rec.status}, which x-kiln-server-refusals does not document`);
      continue;
    }
    checkBody(where, response.content, rec);
    continue;
  }
  if (!rec.route) {
    response = deref((spec.components.responses || {}).NotFound);
    if (rec.status !== 404) problems.push(`${where}: a path no route has answered something else than 404`);
  } else {
    const item = spec.paths && spec.paths[rec.route];
    if (!item) continue; // reported above
    const op = item[rec.method.toLowerCase()];
    if (!op) {
      if (rec.status !== 405) problems.push(`${where}: a method the path lacks answered something else than 405`);
      response = spec['x-kiln-method-not-allowed'];
      if (!response) problems.push(`${where}: x-kiln-method-not-allowed (the generic 405) is missing`);
    } else {
      const key = `${rec.method} ${rec.route}`;
      if (!seen.has(key)) seen.set(key, new Set());
      seen.get(key).add(rec.status);
      response = deref(op.responses && op.responses[String(rec.status)]);
      if (!response) {
        problems.push(`${rec.method} ${rec.route}: status ${rec.status} is not documented (seen for ${rec.path}: ${rec.body.slice(0, 160)})`);
        continue;
      }
    }
  }
  if (response) checkBody(where, response.content, rec);
}
for (const r of routes) {
  const statuses = seen.get(`${r.method} ${r.path}`) || new Set();
  if (![...statuses].some((s) => s >= 200 && s < 300))
    problems.push(`${r.method} ${r.path}: no successful response was recorded: add a case to tests/api/test_contract.c`);
}

// Statuses documented but never seen are worth knowing, not a failure (some need a crash).
const unseen = [];
for (const [path, item] of Object.entries(spec.paths || {}))
  for (const m of METHODS) {
    if (!item[m]) continue;
    const got = seen.get(`${m.toUpperCase()} ${path}`) || new Set();
    for (const st of Object.keys(item[m].responses || {})) if (!got.has(Number(st))) unseen.push(`${m.toUpperCase()} ${path} ${st}`);
  }

const uniq = [...new Set(problems)];
console.log(`openapi-check: ${records.length} responses of ${routes.length} routes checked against ${specFile}`);
if (unseen.length) console.log(`documented but not recorded (not a failure): ${unseen.join('; ')}`);
if (uniq.length) {
  console.log(`${uniq.length} problem(s):`);
  for (const p of uniq) console.log(`  - ${p}`);
  process.exit(1);
}
console.log('openapi-check: every response matches the spec');
