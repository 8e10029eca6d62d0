// The live charts: one /v1/stats answer at a time, the last CAPACITY kept in the page.

import { barChart, lineChart } from "./charts.js";
import { num, percent } from "./dom.js";

export const CAPACITY = 60;  // two minutes at one poll every 2 s
const history = [];

const seconds = (x) => (x < 1 ? `${num(x * 1000, 0)} ms` : `${num(x, 2)} s`);

/** The adapter's name as the charts show it ("base" for requests without one). */
function label(a) {
  return a.adapter ?? `${a.owner}/${a.name}`;
}

/** Forget what was drawn (a new key may see other adapters). */
export function resetLive() {
  history.length = 0;
}

/** Add one stats answer and redraw every chart. */
export function drawLive(stats) {
  const s = stats.summary ?? {};
  const slab = s.slab ?? {}, host = s.host_tier ?? {};
  history.push({
    tokens_per_s: s.tokens_per_s ?? null,
    ttft_p50_s: s.ttft_p50_s ?? null,
    ttft_p99_s: s.ttft_p99_s ?? null,
    running: s.running ?? null,
    waiting: s.waiting ?? null,
    kv_cache_usage: s.kv_cache_usage ?? null,
    prefix_cache_hit_rate: s.prefix_cache_hit_rate ?? null,
    loads_per_s: slab.loads_per_s ?? null,
    evictions_per_s: slab.evictions_per_s ?? null,
    host_evictions_per_s: host.evictions_per_s ?? null,
  });
  if (history.length > CAPACITY) history.splice(0, history.length - CAPACITY);
  const byId = (id) => document.getElementById(id);
  const options = { capacity: CAPACITY };

  lineChart(byId("chart-tokens"), [{ key: "tokens_per_s", label: "tokens/s" }], history,
    { ...options, format: (x) => num(x, 1) });
  lineChart(byId("chart-ttft"), [
    { key: "ttft_p50_s", label: "p50" }, { key: "ttft_p99_s", label: "p99" },
  ], history, { ...options, format: seconds });
  lineChart(byId("chart-load"), [
    { key: "running", label: "running" }, { key: "waiting", label: "waiting" },
  ], history, { ...options, format: (x) => num(x, 0) });
  lineChart(byId("chart-cache"), [
    { key: "kv_cache_usage", label: "KV cache use" },
    { key: "prefix_cache_hit_rate", label: "prefix-cache hits" },
  ], history, { ...options, format: percent, yMax: 1 });
  // The server's rates over its window: a load or eviction stays in them for 30 s.
  lineChart(byId("chart-churn"), [
    { key: "loads_per_s", label: "loads" },
    { key: "evictions_per_s", label: "slab evictions" },
    { key: "host_evictions_per_s", label: "host evictions" },
  ], history, { ...options, format: (x) => `${num(x, 2)}/s` });

  const adapters = stats.adapters ?? [];
  barChart(byId("chart-spec"),
    adapters.map((a) => ({ label: label(a), value: a.spec?.acceptance_rate ?? null })),
    { format: percent, yMax: 1, empty: "no speculative decoding measured" });
  // Live rates while there is traffic; the last hour's tokens when the window is quiet.
  const live = adapters.some((a) => a.tokens_per_s > 0);
  const by = live ? "tokens_per_s" : "tokens_1h";
  barChart(byId("chart-top"), adapters.map((a) => ({ label: label(a), value: a[by] ?? null }))
    .filter((b) => b.value > 0), {
    format: (x) => (live ? `${num(x, 1)}/s` : num(x, 0)), meta: { by },
    empty: "no traffic in the last hour",
  });
}
