// mqbox dashboard: plain JavaScript over the endpoint's JSON API (/api/*), SVG charts, no
// libraries and no network beyond this broker (it works offline). Read-only. Every value from
// the API reaches the page as text (el() sets textContent), never as HTML.
"use strict";

const REFRESH_MS = 2000;
let timer = null;
let generation = 0; // a page switch makes older fetches' results stale

function el(tag, attributes, ...children) {
  const namespace = ["svg", "polyline", "line", "text", "g"].includes(tag)
    ? "http://www.w3.org/2000/svg" : null;
  const node = namespace ? document.createElementNS(namespace, tag) : document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (key === "onclick" || key === "onsubmit") node[key] = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { cache: "no-store" });
  const document = await response.json();
  if (!response.ok) throw new Error(document.error || response.statusText);
  return document;
}

function number(value, digits) {
  if (value === null || value === undefined) return "";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 });
}

function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = Number(value);
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
  return `${size.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

function duration(ms) {
  const seconds = Math.floor(ms / 1000);
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  return `${hours}h ${minutes}m ${seconds % 60}s`;
}

function time(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

function card(label, value, id) {
  return el("div", { class: "card", id: id || "" },
    el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

function table(headers, rows, id) {
  const head = el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : "" }, h.label)));
  const body = rows.map((row) => el("tr", {}, row.map((cell, index) =>
    el("td", { class: headers[index].num ? "num" : "" }, cell))));
  return el("table", { id: id || "" }, el("thead", {}, head), el("tbody", {}, body));
}

function link(href, text) {
  return el("a", { href }, text);
}

// A line chart of put (and get) TPS over time: points [{t, put_tps, get_tps}].
function chart(id, points, withGet) {
  const width = 640;
  const height = 180;
  const left = 48;
  const bottom = 20;
  const values = points.flatMap((p) => (withGet ? [p.put_tps, p.get_tps] : [p.put_tps]));
  const top = Math.max(1, ...values);
  const first = points.length ? points[0].t : 0;
  const last = points.length ? points[points.length - 1].t : 1;
  const span = Math.max(1, last - first);
  const x = (t) => left + ((t - first) / span) * (width - left - 8);
  const y = (v) => height - bottom - (v / top) * (height - bottom - 10);
  const line = (key) => points.map((p) => `${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
  const lastPoint = points.length ? points[points.length - 1] : { put_tps: 0, get_tps: 0 };
  return el("svg", {
    class: "chart", id, width, height, viewBox: `0 0 ${width} ${height}`,
    "data-point-count": points.length, "data-last-t": last,
    "data-last-put-tps": lastPoint.put_tps.toFixed(1),
  },
  el("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }),
  el("line", { class: "axis", x1: left, y1: 0, x2: left, y2: height - bottom }),
  el("text", { x: 4, y: 12 }, number(top, 0)),
  el("text", { x: 4, y: height - bottom }, "0"),
  el("text", { x: left, y: height - 4 }, points.length ? `last ${Math.round(span / 1000)} s` : "no samples yet"),
  el("polyline", { class: "put", points: line("put_tps") }),
  withGet ? el("polyline", { class: "get", points: line("get_tps") }) : null);
}

const pages = {
  async cluster() {
    const [overview, series] = await Promise.all([api("/api/overview"), api("/api/series")]);
    const store = overview.store;
    return [
      el("h1", {}, `Broker ${overview.broker} (${overview.cluster})`),
      el("div", { class: "cards" },
        card("Role", overview.role, "card-role"),
        card("Version", `mqbox ${overview.version} · RocketMQ ${overview.rocketmq_version}`, "card-version"),
        card("Address", overview.address),
        card("Uptime", duration(overview.uptime_ms)),
        card("Put TPS (10 s)", number(overview.put_tps, 1), "card-put-tps"),
        card("Get TPS (10 s)", number(overview.get_tps, 1), "card-get-tps"),
        card("Messages stored", number(overview.put_messages_total), "card-put-total"),
        card("Disk used", `${(store.disk_used_ratio * 100).toFixed(1)} %`, "card-disk"),
        card("Commit log on disk", bytes(store.commit_log_disk_bytes)),
        card("Topics / groups", `${overview.topic_count} / ${overview.group_count}`)),
      el("h2", {}, "Put (blue) and get (orange) TPS"),
      chart("broker-chart", series.points, true),
      el("h2", {}, "Store positions"),
      table([{ label: "position" }, { label: "bytes", num: true }], [
        ["commit log write", number(store.write_log_offset_bytes)],
        ["commit log flushed", number(store.flushed_log_offset_bytes)],
        ["commit log minimum", number(store.min_log_offset_bytes)],
        ["dispatched", number(store.dispatched_log_offset_bytes)],
        ["disk free", bytes(store.disk_free_bytes)],
      ], "store-table"),
      el("h2", {}, "Runtime statistics (GET_BROKER_RUNTIME_INFO keys)"),
      table([{ label: "key" }, { label: "value" }],
        Object.entries(overview.runtime).map(([key, value]) => [key, value]), "runtime-table"),
    ];
  },

  async topics() {
    const topics = await api("/api/topics");
    return [
      el("h1", {}, `Topics (${topics.length})`),
      table([
        { label: "topic" }, { label: "read / write queues" }, { label: "perm" },
        { label: "max offsets (sum)", num: true }, { label: "put TPS (1 min)", num: true },
        { label: "messages put", num: true },
      ], topics.map((t) => [
        link(`#topic/${encodeURIComponent(t.topic)}`, t.topic),
        `${t.read_queue_nums} / ${t.write_queue_nums}`, t.perm,
        number(t.max_offset_total), number(t.put_tps, 1), number(t.put_messages_total),
      ]), "topics-table"),
    ];
  },

  async topic(name) {
    const topic = await api(`/api/topic?name=${encodeURIComponent(name)}`);
    return [
      el("h1", {}, `Topic ${topic.topic}`),
      el("p", { class: "muted" }, `${topic.read_queue_nums} read / ${topic.write_queue_nums} write queues, perm ${topic.perm}`),
      el("h2", {}, "Put TPS over the last minutes"),
      chart("topic-chart", topic.series, false),
      el("h2", {}, "Queues"),
      table([
        { label: "queue" }, { label: "min offset", num: true }, { label: "max offset", num: true },
        { label: "last stored" },
      ], topic.queues.map((q) => [q.queue_id, number(q.min_offset), number(q.max_offset), time(q.last_update_ms)]),
      "queues-table"),
    ];
  },

  async groups() {
    const groups = await api("/api/groups");
    return [
      el("h1", {}, `Consumer groups (${groups.length})`),
      table([
        { label: "group" }, { label: "lag (saved offsets)", num: true }, { label: "get TPS (1 min)", num: true },
        { label: "topics" },
      ], groups.map((g) => [
        link(`#group/${encodeURIComponent(g.group)}`, g.group), number(g.lag_total),
        number(g.get_tps, 1), Object.keys(g.lag_by_topic).join(", "),
      ]), "groups-table"),
    ];
  },

  async group(name) {
    const group = await api(`/api/group?name=${encodeURIComponent(name)}`);
    const tps = Object.entries(group.get_tps_by_topic).map(([topic, value]) => `${topic}: ${number(value, 1)}`);
    return [
      el("h1", {}, `Consumer group ${group.group}`),
      el("div", { class: "cards" },
        card("Members online", group.members.length, "card-members"),
        card("Lag", number(group.lag_total), "card-lag"),
        card("Get TPS (1 min)", tps.join(" · ") || "0")),
      el("h2", {}, "Members"),
      el("ul", { id: "members" }, group.members.map((member) => el("li", {}, member))),
      el("h2", {}, "Lag per queue"),
      table([
        { label: "topic" }, { label: "queue" }, { label: "broker offset", num: true },
        { label: "consumer offset", num: true }, { label: "lag", num: true },
      ], group.queues.map((q) => [q.topic, q.queue_id, number(q.broker_offset), number(q.consumer_offset), number(q.lag)]),
      "lag-table"),
    ];
  },

  async message() {
    const result = el("div", { id: "message-result" });
    const idInput = el("input", { id: "lookup-id", name: "id", placeholder: "offsetMsgId or msgId (UNIQ_KEY)" });
    const keyInput = el("input", { id: "lookup-key", name: "key", placeholder: "a KEYS value" });
    const topicInput = el("input", { id: "lookup-topic", name: "topic", placeholder: "needed for a key or UNIQ_KEY" });
    const form = el("form", {
      id: "lookup-form",
      onsubmit: async (event) => {
        event.preventDefault();
        const query = new URLSearchParams();
        for (const input of [idInput, keyInput, topicInput]) {
          if (input.value.trim()) query.set(input.name, input.value.trim());
        }
        result.replaceChildren(el("p", { class: "muted" }, "looking up..."));
        try {
          const found = await api(`/api/message?${query}`);
          result.replaceChildren(...found.messages.map(messageView));
        } catch (error) {
          result.replaceChildren(el("p", { class: "error" }, error.message));
        }
      },
    },
    el("label", {}, "Message id", idInput),
    el("label", {}, "Key", keyInput),
    el("label", {}, "Topic", topicInput),
    el("button", { type: "submit", id: "lookup-button" }, "Look up"));
    return { static: true, nodes: [el("h1", {}, "Message lookup"), form, result] };
  },

  async processes() {
    const found = await api("/api/processes");
    return [
      el("h1", {}, "Processes of the appliance"),
      table([
        { label: "role" }, { label: "kind" }, { label: "pid", num: true }, { label: "state" },
        { label: "CPU %", num: true }, { label: "RSS", num: true }, { label: "threads", num: true },
      ], found.processes.map((p) => [
        p.role, p.kind, p.pid, p.up ? "up" : "down", p.up ? number(p.cpu_percent, 1) : "",
        p.up ? bytes(p.rss_bytes) : "", p.up ? p.thread_count : "",
      ]), "processes-table"),
      el("h2", {}, "Rings"),
      table([
        { label: "producer" }, { label: "consumer" }, { label: "used", num: true }, { label: "capacity", num: true },
      ], found.rings.map((r) => [r.producer, r.consumer, bytes(r.used_bytes), bytes(r.capacity_bytes)]),
      "rings-table"),
    ];
  },
};

function messageView(message) {
  return el("div", { class: "message" },
    el("h2", {}, `${message.topic} · queue ${message.queue_id} · offset ${message.queue_offset}`),
    table([{ label: "field" }, { label: "value" }], [
      ["msgId (UNIQ_KEY)", message.msg_id],
      ["offsetMsgId", message.offset_msg_id],
      ["tags", message.tags],
      ["keys", message.keys],
      ["born", time(message.born_timestamp_ms)],
      ["stored", time(message.store_timestamp_ms)],
      ["reconsume times", message.reconsume_times],
      ["body", `${number(message.body_size_bytes)} bytes, shown as ${message.body_format}${message.body_truncated ? " (first 4 KiB)" : ""}`],
      ...Object.entries(message.properties).map(([key, value]) => [`property ${key}`, value]),
    ]),
    el("pre", { class: "body", "data-format": message.body_format }, message.body_preview));
}

function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "cluster";
  const [name, ...rest] = hash.split("/");
  return { name: pages[name] ? name : "cluster", argument: rest.join("/") };
}

async function render() {
  const { name, argument } = route();
  const mine = generation;
  const status = document.getElementById("status");
  for (const anchor of document.querySelectorAll("nav a")) {
    const page = anchor.dataset.page;
    anchor.classList.toggle("active", page === name || `${page}` === `${name}s`);
  }
  try {
    const built = await pages[name](argument);
    if (mine !== generation) return;
    const nodes = Array.isArray(built) ? built : built.nodes;
    document.getElementById("page").replaceChildren(...nodes);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.classList.remove("error");
    if (!Array.isArray(built) && built.static) return; // forms are not refreshed
  } catch (error) {
    if (mine !== generation) return;
    status.textContent = `error: ${error.message}`;
    status.classList.add("error");
  }
  clearTimeout(timer);
  timer = setTimeout(render, REFRESH_MS);
}

async function identity() {
  try {
    const overview = await api("/api/overview");
    document.getElementById("identity").textContent =
      `${overview.cluster} / ${overview.broker} @ ${overview.address}`;
  } catch (error) {
    document.getElementById("identity").textContent = "";
  }
}

window.addEventListener("hashchange", () => {
  generation += 1;
  clearTimeout(timer);
  render();
});
identity();
render();
