// The management web UI: plain JavaScript over the management HTTP API (docs/management.md).
// Pages are hash routes (#/queues/%2F/orders); each has a live part, fetched again every
// REFRESH_MS (and at once after a form or button changed something), and an actions part
// (forms) built once. Everything that comes from the API is put in the page as text (el()
// makes text nodes), never as markup. charts.js draws the charts, admin.js has the users,
// permissions and policies pages; both are loaded first and use the helpers here.
"use strict";

const REFRESH_MS = 5000;
const AUTH_KEY = "starlight-auth";
const USER_KEY = "starlight-user";
const $ = (id) => document.getElementById(id);

let auth = sessionStorage.getItem(AUTH_KEY);
let generation = 0; // bumped on every page change: late answers for an old page are dropped
let timer = null;

// ---- DOM and formatting helpers ---------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child !== undefined && child !== null) node.append(child); // strings become text
  }
  return node;
}

const enc = encodeURIComponent;
const hashOf = (...parts) => "#/" + parts.map(enc).join("/");
const link = (text, ...parts) => el("a", { href: hashOf(...parts) }, text);
const rate = (details) => (details && typeof details.rate === "number" ? `${details.rate.toFixed(1)}/s` : "");
const when = (ms) => (ms ? new Date(ms).toLocaleString() : "");
const json = (value) => (value && Object.keys(value).length ? JSON.stringify(value) : "");

function features(item) {
  const flags = [];
  if (item.durable) flags.push("D");
  if (item.auto_delete) flags.push("AD");
  if (item.exclusive) flags.push("Excl");
  if (item.internal) flags.push("I");
  if (item.arguments && Object.keys(item.arguments).length) flags.push("Args");
  return flags.join(" ");
}

// columns: [key, title, value(row)]; cells carry data-col=key.
function table(columns, rows) {
  const head = el("tr", {}, columns.map(([, title]) => el("th", {}, title)));
  const body = rows.length
    ? rows.map((row) =>
        el("tr", {}, columns.map(([key, , value]) => el("td", { "data-col": key }, value(row)))))
    : [el("tr", {}, el("td", { colspan: columns.length, class: "empty" }, "None."))];
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

// pairs: [title, value, key]; values carry data-col=key.
function facts(pairs) {
  return el("dl", {}, pairs.map(([title, value, key]) =>
    [el("dt", {}, title), el("dd", { "data-col": key }, value)]));
}

const section = (title, ...content) => el("section", {}, el("h3", {}, title), ...content);

function showStatus(text, isError = true) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
  $("status").hidden = !text;
}

// ---- the API ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason);
    this.status = status;
    this.error = error;
  }
}

function basicAuth(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  return "Basic " + btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
}

// credentials "omit": the browser neither adds its own nor shows its login prompt on 401.
async function api(method, path, { body, headers = {} } = {}) {
  const init = { method, credentials: "omit", headers: { authorization: auth, ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["content-type"] = "application/json";
  }
  const response = await fetch("api" + path, init);
  const text = await response.text();
  let value = null;
  try {
    value = text ? JSON.parse(text) : null;
  } catch {
    value = { reason: text };
  }
  if (!response.ok) {
    const reason = (value && value.reason) || `${response.status} ${response.statusText}`;
    const error = new ApiError(response.status, value && value.error, reason);
    if (error.error === "not_authorized") logOut("Login failed: log in again.");
    throw error;
  }
  return value;
}

const exchangePath = (vhost, name) => `/exchanges/${enc(vhost)}/${enc(name || "amq.default")}`;
const queuePath = (vhost, name) => `/queues/${enc(vhost)}/${enc(name)}`;

// ---- shared pieces of pages and forms ------------------------------------------------------

let currentLive = null; // the shown page's live(): refreshNow() fetches it again at once

function refreshNow() {
  if (!currentLive) return;
  generation += 1; // an answer already on its way is for the page as it was
  clearTimeout(timer);
  refresh(currentLive, generation);
}

// A button outside a form: runs `action`, then refreshes the page; errors go to the status.
function button(text, action) {
  const node = el("button", { type: "button" }, text);
  node.addEventListener("click", async () => {
    try {
      await action();
      refreshNow();
    } catch (error) {
      showStatus(error.message);
    }
  });
  return node;
}

// A select of the vhosts the user can see, filled once the API answers.
function vhostSelect(name) {
  const select = el("select", { name, required: true });
  api("GET", "/vhosts?columns=name").then((vhosts) => {
    select.replaceChildren(...vhosts.map((v) => el("option", { value: v.name }, v.name)));
  }, (error) => showStatus(error.message));
  return select;
}

const jsonField = (name, placeholder = '{"x-max-length": 1000}') =>
  el("textarea", { name, rows: 2, cols: 40, placeholder });

// The JSON object typed in `field` ({} when empty); throws saying which field is not one.
function jsonValue(field, label) {
  const text = field.value.trim();
  if (!text) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error(`${label}: not JSON`);
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error(`${label}: not a JSON object`);
  return value;
}

const yesNo = (name, value) => el("select", { name },
  el("option", { value: "true", selected: value }, "Yes"), el("option", { value: "false", selected: !value }, "No"));

function formatBytes(bytes) {
  if (typeof bytes !== "number") return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit ? `${value.toFixed(1)} ${units[unit]}` : `${bytes} B`;
}

// ---- pages: each route gives a title, live() -> Promise<nodes>, and optional actions ------

async function overviewLive() {
  const [overview, nodes] = await Promise.all([
    api("GET", "/overview?" + samplesQuery()),
    api("GET", "/nodes"),
  ]);
  $("product").textContent = `${overview.product_version} (RabbitMQ API ${overview.management_version})`;
  const totals = overview.object_totals || {};
  const queued = overview.queue_totals || {};
  const flow = overview.message_stats || {};
  return [
    section("Totals", table(
      ["connections", "channels", "exchanges", "queues", "consumers"].map((k) => [k, k[0].toUpperCase() + k.slice(1), (t) => t[k]]),
      [totals])),
    section("Queued messages", table([
      ["ready", "Ready", () => queued.messages_ready],
      ["unacked", "Unacked", () => queued.messages_unacknowledged],
      ["total", "Total", () => queued.messages],
      ["ready_rate", "Ready change", () => rate(queued.messages_ready_details)],
      ["unacked_rate", "Unacked change", () => rate(queued.messages_unacknowledged_details)],
      ["total_rate", "Total change", () => rate(queued.messages_details)],
      ["publish_rate", "Published", () => rate(flow.publish_details)],
      ["deliver_rate", "Delivered", () => rate(flow.deliver_get_details)],
      ["ack_rate", "Acked", () => rate(flow.ack_details)],
    ], [{}]), chartRange(refreshNow), queueCharts(queued, flow), el("p", { class: "hint" },
      "Changes are how fast the counts change; published, delivered and acked rates are " +
      "Pulsar's, over its last statistics interval. Charts show what this proxy read, every " +
      "5 s while a page shows them.")),
    section("Proxies", table([
      ["name", "Proxy", (n) => n.name],
      ["host", "Host", (n) => n.starlight_host],
      ["version", "Version", (n) => n.starlight_version],
      ["uptime", "Up since", (n) => when(Date.now() - n.uptime)],
      ["listeners", "Listeners", (n) => (n.starlight_listeners || []).join(" ")],
    ], nodes)),
    section("Listeners of this proxy", table([
      ["protocol", "Protocol", (l) => l.protocol],
      ["address", "Address", (l) => l.ip_address],
      ["port", "Port", (l) => l.port],
    ], overview.listeners || [])),
  ];
}

const connectionColumns = [
  ["name", "Name", (c) => link(c.name, "connections", c.name)],
  ["proxy", "Proxy", (c) => c.starlight_proxy],
  ["vhost", "Virtual host", (c) => c.vhost],
  ["user", "User", (c) => c.user],
  ["client", "Client", (c) => (c.client_properties || {}).connection_name || (c.client_properties || {}).product || ""],
  ["state", "State", (c) => c.state],
  ["tls", "TLS", (c) => (c.ssl ? "yes" : "no")],
  ["channels", "Channels", (c) => c.channels],
  ["connected", "Connected at", (c) => when(c.connected_at)],
];

async function connectionsLive() {
  return [table(connectionColumns, await api("GET", "/connections"))];
}

async function connectionLive(name) {
  const path = `/connections/${enc(name)}`;
  const [connection, channels] = await Promise.all([api("GET", path), api("GET", path + "/channels")]);
  const client = connection.client_properties || {};
  return [
    facts([
      ...connectionColumns.slice(1).map(([key, title, value]) => [title, value(connection), key]),
      ["Peer", `${connection.peer_host}:${connection.peer_port}`],
      ["Authentication", connection.auth_mechanism],
      ["Heartbeat (s)", connection.timeout],
      ["Client product", [client.product, client.version].filter(Boolean).join(" ")],
    ]),
    section("Channels", table([
      ["number", "Channel", (c) => c.number],
      ["prefetch", "Prefetch", (c) => c.prefetch_count],
      ["consumers", "Consumers", (c) => c.consumer_count],
      ["unacked", "Unacked", (c) => c.messages_unacknowledged],
      ["mode", "Mode", (c) => [c.confirm && "confirm", c.transactional && "transactional"].filter(Boolean).join(" ")],
    ], channels)),
  ];
}

function closeConnectionForm(name) {
  const output = el("output");
  const reason = el("input", { name: "reason", value: "Closed via management plugin", size: 40 });
  return form("Close this connection", [el("label", {}, "Reason ", reason)], "Force close", output,
    async () => {
      if (!confirm("Close this connection?")) return;
      await api("DELETE", `/connections/${enc(name)}`, { headers: { "x-reason": reason.value } });
      output.textContent = "Connection closing.";
      location.hash = "#/connections";
    });
}

async function exchangesLive() {
  return [table([
    ["vhost", "Virtual host", (e) => e.vhost],
    ["name", "Name", (e) => link(e.name || "(AMQP default)", "exchanges", e.vhost, e.name)],
    ["type", "Type", (e) => e.type],
    ["features", "Features", features],
  ], await api("GET", "/exchanges"))];
}

function exchangeForm() {
  const output = el("output");
  const vhost = vhostSelect("exchange_vhost");
  const name = el("input", { name: "exchange_name", required: true, size: 30 });
  const type = el("select", { name: "exchange_type" },
    ["direct", "fanout", "topic", "headers", "x-delayed-message"].map((t) => el("option", { value: t }, t)));
  const durable = yesNo("exchange_durable", true);
  const autoDelete = yesNo("exchange_auto_delete", false);
  const internal = yesNo("exchange_internal", false);
  const args = jsonField("exchange_arguments", '{"alternate-exchange": "unrouted"}');
  return form("Add a new exchange", [
    el("label", {}, "Virtual host ", vhost), el("label", {}, "Name ", name),
    el("label", {}, "Type ", type), el("label", {}, "Durable ", durable),
    el("label", {}, "Auto delete ", autoDelete), el("label", {}, "Internal ", internal),
    el("label", {}, "Arguments (JSON) ", args),
  ], "Add exchange", output, async () => {
    await api("PUT", exchangePath(vhost.value, name.value), {
      body: {
        type: type.value, durable: durable.value === "true", auto_delete: autoDelete.value === "true",
        internal: internal.value === "true", arguments: jsonValue(args, "Arguments"),
      },
    });
    output.textContent = `Exchange ${name.value} declared.`;
    refreshNow();
  });
}

// A binding's path, for DELETE; `b` as the API lists it.
const bindingPath = (b) => `/bindings/${enc(b.vhost)}/e/${enc(b.source || "amq.default")}/` +
  `${b.destination_type === "queue" ? "q" : "e"}/${enc(b.destination)}/${enc(b.properties_key)}`;

const unbindButton = (b) => (b.source ? button("Unbind", async () => {
  if (!confirm(`Unbind ${b.source} -> ${b.destination} (${b.routing_key})?`)) return;
  await api("DELETE", bindingPath(b));
}) : "");

async function exchangeLive(vhost, name) {
  const [exchange, bindings] = await Promise.all([
    api("GET", exchangePath(vhost, name)),
    name ? api("GET", exchangePath(vhost, name) + "/bindings/source") : [],
  ]);
  return [
    facts([["Virtual host", vhost], ["Name", name || "(AMQP default)"], ["Type", exchange.type],
      ["Features", features(exchange)], ["Arguments", json(exchange.arguments)]]),
    section("Bindings from this exchange", table([
      ["destination", "To", (b) => (b.destination_type === "queue"
        ? link(b.destination, "queues", vhost, b.destination)
        : link(b.destination, "exchanges", vhost, b.destination))],
      ["kind", "Kind", (b) => b.destination_type],
      ["routing_key", "Routing key", (b) => b.routing_key],
      ["arguments", "Arguments", (b) => json(b.arguments)],
      ["unbind", "", unbindButton],
    ], bindings)),
  ];
}

// Bind `fixed` (an exchange as source, or a queue as destination) to what the form names.
function bindForm(vhost, fixed) {
  const output = el("output");
  const fromExchange = fixed.kind === "queue";
  const kind = el("select", { name: "bind_kind", disabled: fromExchange },
    el("option", { value: "q" }, "To queue"), el("option", { value: "e" }, "To exchange"));
  const other = el("input", { name: "bind_other", required: true, size: 30 });
  const routingKey = el("input", { name: "bind_routing_key", size: 30 });
  const args = jsonField("bind_arguments", '{"x-match": "all"}');
  const fields = fromExchange
    ? [el("label", {}, "From exchange ", other)]
    : [el("label", {}, "Destination ", kind), el("label", {}, "Name ", other)];
  return form(fromExchange ? "Add binding to this queue" : "Add binding from this exchange", [
    ...fields, el("label", {}, "Routing key ", routingKey), el("label", {}, "Arguments (JSON) ", args),
  ], "Bind", output, async () => {
    const path = fromExchange
      ? `/bindings/${enc(vhost)}/e/${enc(other.value)}/q/${enc(fixed.name)}`
      : `/bindings/${enc(vhost)}/e/${enc(fixed.name)}/${kind.value}/${enc(other.value)}`;
    await api("POST", path, { body: { routing_key: routingKey.value, arguments: jsonValue(args, "Arguments") } });
    output.textContent = "Bound.";
    refreshNow();
  });
}

function deleteExchangeForm(vhost, name) {
  const deleted = el("output");
  return form("Delete", [], "Delete exchange", deleted, async () => {
    if (!confirm("Delete this exchange?")) return;
    await api("DELETE", exchangePath(vhost, name));
    location.hash = "#/exchanges";
  });
}

function publishForm(vhost, name) {
  const output = el("output");
  const routingKey = el("input", { name: "routing_key", size: 40 });
  const mode = el("select", { name: "delivery_mode" },
    el("option", { value: "1" }, "1 - Non-persistent"), el("option", { value: "2" }, "2 - Persistent"));
  const payload = el("textarea", { name: "payload", rows: 4, cols: 60 });
  return form("Publish message", [
    el("label", {}, "Routing key ", routingKey), el("label", {}, "Delivery mode ", mode),
    el("label", {}, "Payload ", payload),
  ], "Publish message", output, async () => {
    const answer = await api("POST", exchangePath(vhost, name) + "/publish", {
      body: {
        routing_key: routingKey.value, payload: payload.value, payload_encoding: "string",
        properties: { delivery_mode: Number(mode.value) },
      },
    });
    output.textContent = answer.routed ? "Message published." : "Message published, but not routed.";
  });
}

function exchangeActions(vhost, name) {
  const actions = [publishForm(vhost, name)];
  if (name && !name.startsWith("amq.")) {
    actions.push(bindForm(vhost, { kind: "exchange", name }), deleteExchangeForm(vhost, name));
  }
  return actions;
}

const queueColumns = [
  ["vhost", "Virtual host", (q) => q.vhost],
  ["name", "Name", (q) => link(q.name, "queues", q.vhost, q.name)],
  ["type", "Type", (q) => q.type],
  ["features", "Features", features],
  ["state", "State", (q) => q.state],
  ["ready", "Ready", (q) => q.messages_ready],
  ["unacked", "Unacked", (q) => q.messages_unacknowledged],
  ["messages", "Total", (q) => q.messages],
  ["consumers", "Consumers", (q) => q.consumers],
  ["rate", "Change", (q) => rate(q.messages_details)],
  ["publish_rate", "Incoming", (q) => rate(q.message_stats && q.message_stats.publish_details)],
  ["deliver_rate", "Delivered", (q) => rate(q.message_stats && q.message_stats.deliver_get_details)],
];

async function queuesLive() {
  return [table(queueColumns, await api("GET", "/queues"))];
}

function queueForm() {
  const output = el("output");
  const vhost = vhostSelect("queue_vhost");
  const name = el("input", { name: "queue_name", required: true, size: 30 });
  const durable = yesNo("queue_durable", true);
  const autoDelete = yesNo("queue_auto_delete", false);
  const args = jsonField("queue_arguments");
  return form("Add a new queue", [
    el("label", {}, "Virtual host ", vhost), el("label", {}, "Name ", name),
    el("label", {}, "Durable ", durable), el("label", {}, "Auto delete ", autoDelete),
    el("label", {}, "Arguments (JSON) ", args),
  ], "Add queue", output, async () => {
    await api("PUT", queuePath(vhost.value, name.value), {
      body: { durable: durable.value === "true", auto_delete: autoDelete.value === "true", arguments: jsonValue(args, "Arguments") },
    });
    output.textContent = `Queue ${name.value} declared.`;
    refreshNow();
  });
}

// What the queue is in Pulsar (GET /api/queues/{vhost}/{name}/pulsar): its topics and
// subscriptions, the retired ones still draining included.
function pulsarSection(view) {
  return section("In Pulsar",
    el("p", { class: "hint" }, `Namespace ${view.namespace}. Each binding set is read through one ` +
      "subscription; an unbind retires its subscription, which drains what was routed before it."),
    el("h4", {}, "Topics"),
    el("div", { class: "pulsar-topics" }, table([
      ["topic", "Topic", (t) => t.topic],
      ["owner", "Owner broker", (t) => t.error || t.owner_broker || (t.exists ? "" : "not created yet")],
      ["storage", "Storage size", (t) => formatBytes(t.storage_size)],
      ["producers", "Producers", (t) => t.producers],
      ["subscriptions", "Subscriptions", (t) => t.subscriptions],
      ["rate_in", "Rate in", (t) => (typeof t.msg_rate_in === "number" ? `${t.msg_rate_in.toFixed(1)}/s` : "")],
    ], view.topics)),
    el("h4", {}, "Subscriptions"),
    el("div", { class: "pulsar-subscriptions" }, table([
      ["subscription", "Subscription", (s) => s.subscription],
      ["topic", "Topic", (s) => s.topic.replace(`persistent://${view.namespace}/`, "")],
      ["state", "State", (s) => s.state + (s.retired_at ? ` since ${when(s.retired_at)}` : "")],
      ["exchange", "Exchange", (s) => (s.exchange === "" ? "(AMQP default)" : s.exchange)],
      ["routing_keys", "Routing keys", (s) => s.routing_keys.join(", ")],
      ["backlog", "Backlog", (s) => (s.exists ? s.backlog : "gone")],
      ["ready", "Ready", (s) => s.ready],
      ["unacked", "Unacked", (s) => s.unacked],
      ["delayed", "Delayed", (s) => s.delayed],
      ["backlog_size", "Backlog size", (s) => formatBytes(s.backlog_size)],
      ["consumers", "Consumers", (s) => (s.consumers ? s.consumers.length : "")],
      ["rate_out", "Rate out", (s) => (typeof s.msg_rate_out === "number" ? `${s.msg_rate_out.toFixed(1)}/s` : "")],
    ], view.subscriptions)));
}

async function queueLive(vhost, name) {
  const [queue, bindings, view] = await Promise.all([
    api("GET", queuePath(vhost, name) + "?" + samplesQuery()),
    api("GET", queuePath(vhost, name) + "/bindings"),
    api("GET", queuePath(vhost, name) + "/pulsar"),
  ]);
  return [
    facts([
      ...queueColumns.slice(2).map(([key, title, value]) => [title, value(queue), key]),
      ["Arguments", json(queue.arguments)],
      ["Policy", queue.policy || "", "policy"],
    ]),
    el("div", { class: "chart-head" }, chartRange(refreshNow)),
    queueCharts(queue, queue.message_stats),
    section("Bindings", el("div", { class: "bindings" }, table([
      ["source", "From", (b) => (b.source ? link(b.source, "exchanges", vhost, b.source) : "(AMQP default)")],
      ["routing_key", "Routing key", (b) => b.routing_key],
      ["arguments", "Arguments", (b) => json(b.arguments)],
      ["unbind", "", unbindButton],
    ], bindings))),
    pulsarSection(view),
  ];
}

function queueActions(vhost, name) {
  const got = el("div", { id: "messages" });
  const count = el("input", { name: "count", type: "number", min: 1, value: 1, size: 4 });
  const ackmode = el("select", { name: "ackmode" },
    el("option", { value: "reject_requeue_true" }, "Nack message requeue true"),
    el("option", { value: "ack_requeue_false" }, "Automatic ack"),
    el("option", { value: "reject_requeue_false" }, "Reject requeue false"));
  const encoding = el("select", { name: "encoding" },
    el("option", { value: "auto" }, "Automatic string/base64"), el("option", { value: "base64" }, "base64"));
  const getForm = form("Get messages", [
    el("label", {}, "Ack mode ", ackmode), el("label", {}, "Encoding ", encoding),
    el("label", {}, "Messages ", count),
  ], "Get message(s)", got, async () => {
    got.replaceChildren("Getting messages…");
    const messages = await api("POST", queuePath(vhost, name) + "/get", {
      body: { count: Number(count.value), ackmode: ackmode.value, encoding: encoding.value, truncate: 50000 },
    });
    got.replaceChildren(...(messages.length ? messages.map((m, i) => el("div", { class: "message" },
      el("h4", {}, `Message ${i + 1}`),
      facts([
        ["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
        ["Redelivered", String(m.redelivered)], ["Remaining", m.message_count],
        ["Properties", json(m.properties)], ["Payload", `${m.payload_bytes} bytes, ${m.payload_encoding}`],
      ]),
      el("pre", { class: "payload" }, m.payload))) : ["Queue is empty."]));
  });
  const purged = el("output");
  const purge = form("Purge", [], "Purge messages", purged, async () => {
    if (!confirm("Purge all ready messages of this queue?")) return;
    await api("DELETE", queuePath(vhost, name) + "/contents");
    purged.textContent = "Queue purged.";
    refreshNow();
  });
  const deleted = el("output");
  const remove = form("Delete", [], "Delete queue", deleted, async () => {
    if (!confirm("Delete this queue?")) return;
    await api("DELETE", queuePath(vhost, name));
    location.hash = "#/queues";
  });
  return [getForm, bindForm(vhost, { kind: "queue", name }), purge, remove];
}

async function vhostsLive() {
  return [table([
    ["name", "Name", (v) => v.name],
    ["description", "Description", (v) => v.description],
    ["namespace", "Pulsar namespace", (v) => v.starlight_namespace],
    ["tags", "Tags", (v) => (v.tags || []).join(", ")],
  ], await api("GET", "/vhosts"))];
}

// A form whose submit runs `action`; errors go to `output`.
function form(title, fields, button, output, action, hint = "") {
  const node = el("form", { class: "action" }, el("h3", {}, title), fields,
    el("button", { type: "submit" }, button), hint ? el("p", { class: "hint" }, hint) : null, output);
  node.addEventListener("submit", async (event) => {
    event.preventDefault();
    output.classList.remove("error");
    try {
      await action();
    } catch (error) {
      output.classList.add("error");
      output.textContent = error.message;
    }
  });
  return node;
}

const routes = {
  overview: () => ({ title: "Overview", live: overviewLive }),
  connections: (name) => (name === undefined
    ? { title: "Connections", live: connectionsLive }
    : { title: `Connection ${name}`, live: () => connectionLive(name), actions: [closeConnectionForm(name)] }),
  exchanges: (vhost, name) => (name === undefined
    ? { title: "Exchanges", live: exchangesLive, actions: [exchangeForm()] }
    : { title: `Exchange ${name || "(AMQP default)"}`, live: () => exchangeLive(vhost, name), actions: exchangeActions(vhost, name) }),
  queues: (vhost, name) => (name === undefined
    ? { title: "Queues", live: queuesLive, actions: [queueForm()] }
    : { title: `Queue ${name}`, live: () => queueLive(vhost, name), actions: queueActions(vhost, name) }),
  vhosts: () => ({ title: "Virtual hosts", live: vhostsLive }),
  users: () => ({ title: "Users", live: usersLive, actions: [userForm()] }),
  permissions: () => ({ title: "Permissions", live: permissionsLive, actions: [permissionForm()] }),
  policies: () => ({ title: "Policies", live: policiesLive, actions: [policyForm()] }),
};

// ---- navigation, refresh, login -----------------------------------------------------------

function showPage() {
  let tab, params;
  try {
    [tab, ...params] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  } catch {
    tab = null; // a malformed %-escape
  }
  if (!Object.hasOwn(routes, tab)) {
    location.hash = "#/overview";
    return;
  }
  const page = routes[tab](...params);
  generation += 1;
  clearTimeout(timer);
  showStatus("");
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
  $("page").dataset.page = params.length ? tab.replace(/s$/, "") : tab;
  $("title").textContent = page.title;
  $("live").replaceChildren();
  $("updated").textContent = "";
  $("actions").replaceChildren(...(page.actions || []));
  currentLive = page.live;
  refresh(page.live, generation);
}

async function refresh(live, mine) {
  try {
    const nodes = await live();
    if (mine !== generation) return;
    $("live").replaceChildren(...nodes);
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; every ${REFRESH_MS / 1000} s.`;
    showStatus("");
  } catch (error) {
    if (mine !== generation) return;
    if (error.status === 404) $("live").replaceChildren(el("p", { class: "empty" }, "Not found (gone?)."));
    showStatus(error.message);
  }
  if (mine === generation && auth) timer = setTimeout(() => refresh(live, mine), REFRESH_MS);
}

function showLoggedIn(loggedIn) {
  $("login").hidden = loggedIn;
  $("tabs").hidden = $("page").hidden = $("session").hidden = !loggedIn;
  $("who").textContent = loggedIn ? `User: ${sessionStorage.getItem(USER_KEY) || ""}` : "";
}

function logOut(message = "") {
  auth = null;
  currentLive = null;
  generation += 1;
  clearTimeout(timer);
  sessionStorage.removeItem(AUTH_KEY);
  sessionStorage.removeItem(USER_KEY);
  showLoggedIn(false);
  showStatus(message);
}

async function logIn(event) {
  event.preventDefault();
  const data = new FormData($("login"));
  auth = basicAuth(data.get("username"), data.get("password"));
  try {
    const me = await api("GET", "/whoami");
    sessionStorage.setItem(AUTH_KEY, auth);
    sessionStorage.setItem(USER_KEY, me.name);
    showLoggedIn(true);
    showPage();
  } catch (error) {
    if (error.error !== "not_authorized") logOut(error.message);
  }
}

window.addEventListener("hashchange", () => auth && showPage());
$("login").addEventListener("submit", logIn);
$("logout").addEventListener("click", () => logOut());
showLoggedIn(Boolean(auth));
if (auth) showPage();
