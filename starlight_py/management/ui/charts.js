// Line charts of a queue's (or all queues') counts and message rates over the last minutes,
// drawn as inline SVG from the API's `samples` (docs/management.md#charts): no library, and
// colours come from style.css (the page's Content-Security-Policy allows no inline style).
// Loaded before app.js, whose helpers (el) it uses when called.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_RANGES = [[60, "Last minute"], [600, "Last ten minutes"]];
const RANGE_KEY = "starlight-chart-range";

function chartAge() {
  const stored = Number(sessionStorage.getItem(RANGE_KEY));
  return CHART_RANGES.some(([age]) => age === stored) ? stored : CHART_RANGES[0][0];
}

// The query asking for samples over the chosen range, as RabbitMQ's UI asks.
function samplesQuery() {
  const age = chartAge();
  return `lengths_age=${age}&lengths_incr=5&msg_rates_age=${age}&msg_rates_incr=5`;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children.flat(Infinity)) {
    if (child !== undefined && child !== null) node.append(child);
  }
  return node;
}

// [[ms, value], ...] oldest first, from a `*_details.samples` list (newest first) whose items
// carry `sample` (counts) or `rate` (message rates).
function points(details) {
  const samples = (details && details.samples) || [];
  return samples.map((s) => [s.timestamp, typeof s.sample === "number" ? s.sample : s.rate]).reverse();
}

// The smallest 1, 2 or 5 times a power of ten at least `value`.
function niceMax(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((m) => m >= value);
}

const formatCount = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
const formatRate = (v) => `${v.toFixed(1)}/s`;

// series: [{key, label, points}]; a line each over the last `age` seconds. The figure and
// its lines carry data-chart / data-series, the legend the latest values.
function lineChart(name, title, series, format) {
  const age = chartAge();
  const width = 520, height = 150, left = 52, right = 10, top = 8, bottom = 20;
  const now = Date.now();
  const from = now - age * 1000;
  const values = series.flatMap((s) => s.points.filter(([t]) => t >= from).map(([, v]) => v));
  const max = niceMax(Math.max(1, ...values));
  const x = (t) => left + ((t - from) / (now - from)) * (width - left - right);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  const grid = [0, 0.5, 1].map((f) => [
    svg("line", { x1: left, x2: width - right, y1: y(max * f), y2: y(max * f), class: "grid" }),
    svg("text", { x: left - 6, y: y(max * f) + 4, "text-anchor": "end", class: "axis" }, format(max * f)),
  ]);
  const ago = (seconds) => (seconds < 120 ? `-${seconds} s` : `-${seconds / 60} min`);
  const times = [[from, ago(age)], [from + (now - from) / 2, ago(age / 2)], [now, "now"]]
    .map(([t, label], i) => svg("text", {
      x: x(t), y: height - 4, class: "axis", "text-anchor": ["start", "middle", "end"][i],
    }, label));
  const lines = series.map((s, i) => {
    const shown = s.points.filter(([t]) => t >= from);
    const coordinates = shown.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    const last = shown[shown.length - 1];
    return svg("g", { class: `series s${i}`, "data-series": s.key, "data-points": shown.length },
      svg("polyline", { points: coordinates.join(" ") }),
      last ? svg("circle", { cx: x(last[0]), cy: y(last[1]), r: 2.5 }) : null);
  });
  const picture = svg("svg", {
    viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title,
  }, grid, times, lines);
  const legend = el("ul", { class: "legend" }, series.map((s, i) => {
    const last = s.points[s.points.length - 1];
    return el("li", { "data-series": s.key }, el("span", { class: `swatch s${i}` }), `${s.label} `,
      el("strong", {}, last ? format(last[1]) : "–"));
  }));
  return el("figure", { class: "chart", "data-chart": name }, el("figcaption", {}, title), picture, legend);
}

// The two charts of a queue, or of the overview's totals: `lengths` holds the
// messages_*_details, `stats` the message_stats.
function queueCharts(lengths, stats) {
  const rates = stats || {};
  return el("div", { class: "charts" },
    lineChart("lengths", "Queued messages", [
      { key: "ready", label: "Ready", points: points(lengths.messages_ready_details) },
      { key: "unacked", label: "Unacked", points: points(lengths.messages_unacknowledged_details) },
      { key: "total", label: "Total", points: points(lengths.messages_details) },
    ], formatCount),
    lineChart("rates", "Message rates", [
      { key: "publish", label: "Publish", points: points(rates.publish_details) },
      { key: "deliver", label: "Deliver", points: points(rates.deliver_get_details) },
      { key: "ack", label: "Ack", points: points(rates.ack_details) },
    ], formatRate));
}

// A select of the charts' range; changing it redraws the page at once.
function chartRange(onChange) {
  const select = el("select", { name: "chart_range" },
    CHART_RANGES.map(([age, label]) => el("option", { value: age, selected: age === chartAge() }, label)));
  select.addEventListener("change", () => {
    sessionStorage.setItem(RANGE_KEY, select.value);
    onChange();
  });
  return el("label", { class: "range" }, "Charts ", select);
}
