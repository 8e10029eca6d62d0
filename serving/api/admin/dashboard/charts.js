// Line and bar charts drawn as inline SVG: no chart library to vendor, nothing to fetch.
// Each chart is drawn whole into a <figure>; its latest figures go on the figure's
// data-latest attribute as JSON (null where there is no figure), for scripts and tests.

import { DASH, el, isNumber } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 360, H = 140, LEFT = 40, RIGHT = 6, TOP = 8, BOTTOM = 16;  // viewBox units
const MAX_BARS = 8;

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

/** The plot area of a figure, created after its caption on first use. */
function plotOf(figure) {
  let plot = figure.querySelector(".plot");
  if (!plot) {
    plot = el("div", { class: "plot" });
    figure.append(plot);
  }
  return plot;
}

/** A round upper bound for an axis that reaches `top` (1, 2 or 5 times a power of ten). */
function niceMax(top) {
  if (!(top > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(top));
  return [1, 2, 5, 10].map((m) => m * power).find((m) => m >= top);
}

/** Path commands through the points that have a figure; a null starts a new segment. */
function linePath(values, capacity, yMax) {
  const step = (W - LEFT - RIGHT) / Math.max(1, capacity - 1);
  const offset = capacity - values.length;  // the newest point sits at the right edge
  let d = "", pen = false;
  values.forEach((v, i) => {
    if (!isNumber(v)) {
      pen = false;
      return;
    }
    const x = LEFT + (offset + i) * step;
    const y = TOP + (H - TOP - BOTTOM) * (1 - Math.min(v, yMax) / yMax);
    // h0 after a move: a round cap draws a dot, so a lone point between gaps still shows
    d += pen ? `L${x.toFixed(1)} ${y.toFixed(1)} ` : `M${x.toFixed(1)} ${y.toFixed(1)} h0 `;
    pen = true;
  });
  return d.trim();
}

/**
 * Draw series over time into figure.
 * series: [{key, label}]; points: [{key: number|null}], oldest first, at most `capacity`;
 * format(v) writes a figure; yMax fixes the axis (e.g. 1 for ratios), else it fits the data.
 */
export function lineChart(figure, series, points, { capacity = 60, format = String, yMax } = {}) {
  const latest = {};
  for (const s of series) latest[s.key] = points.length ? (points.at(-1)[s.key] ?? null) : null;
  figure.dataset.latest = JSON.stringify(latest);

  const seen = points.flatMap((p) => series.map((s) => p[s.key])).filter(isNumber);
  const top = yMax ?? niceMax(Math.max(0, ...seen));
  const label = series.map((s) => `${s.label} ${isNumber(latest[s.key]) ? format(latest[s.key]) : DASH}`);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label.join(", ") });
  const bottom = H - BOTTOM;
  chart.append(
    svg("line", { x1: LEFT, x2: W - RIGHT, y1: bottom, y2: bottom, class: "axis" }),
    svg("line", { x1: LEFT, x2: W - RIGHT, y1: TOP, y2: TOP, class: "grid" }),
    svg("text", { x: LEFT - 4, y: TOP + 4, class: "tick", "text-anchor": "end" }, format(top)),
    svg("text", { x: LEFT - 4, y: bottom, class: "tick", "text-anchor": "end" }, format(0)),
    svg("text", { x: W - RIGHT, y: H - 3, class: "tick", "text-anchor": "end" }, "now"),
    svg("text", { x: LEFT, y: H - 3, class: "tick" }, `${capacity * 2} s ago`),
  );
  series.forEach((s, i) => {
    const d = linePath(points.map((p) => p[s.key]), capacity, top);
    if (d) chart.append(svg("path", { d, class: `line s${i}` }));
  });
  const legend = el("ul", { class: "legend" }, ...series.map((s, i) => el("li", {},
    el("span", { class: `swatch s${i}`, "aria-hidden": "true" }),
    `${s.label}: `, el("strong", {}, isNumber(latest[s.key]) ? format(latest[s.key]) : DASH))));
  plotOf(figure).replaceChildren(chart, legend);
}

/**
 * Draw horizontal bars into figure, largest first (at most MAX_BARS).
 * bars: [{label, value}] with value a number or null; `empty` is shown when none has a value.
 */
export function barChart(figure, bars, { format = String, yMax, empty = "no data yet", meta = {} } = {}) {
  const shown = bars.filter((b) => isNumber(b.value)).sort((a, b) => b.value - a.value)
    .slice(0, MAX_BARS);
  const values = Object.fromEntries(shown.map((b) => [b.label, b.value]));
  figure.dataset.latest = JSON.stringify({ ...meta, values });
  const plot = plotOf(figure);
  if (shown.length === 0) {
    plot.replaceChildren(el("p", { class: "empty" }, empty));
    return;
  }
  const row = 20, labelW = 120, valueW = 56;
  const height = shown.length * row + 4;
  const top = yMax ?? niceMax(Math.max(...shown.map((b) => b.value)));
  const chart = svg("svg", {
    viewBox: `0 0 ${W} ${height}`, role: "img",
    "aria-label": shown.map((b) => `${b.label} ${format(b.value)}`).join(", "),
  });
  shown.forEach((b, i) => {
    const y = 2 + i * row;
    const width = Math.max(1, (W - labelW - valueW) * Math.min(b.value, top) / top);
    const name = b.label.length > 20 ? `${b.label.slice(0, 19)}\u2026` : b.label;
    const text = svg("text", { x: labelW - 6, y: y + 13, class: "bar-label", "text-anchor": "end" }, name);
    text.append(svg("title", {}, b.label));
    chart.append(
      text,
      svg("rect", { x: labelW, y: y + 3, width: width.toFixed(1), height: row - 6, class: "bar s0" }),
      svg("text", { x: labelW + width + 4, y: y + 13, class: "tick" }, format(b.value)),
    );
  });
  plot.replaceChildren(chart);
}
