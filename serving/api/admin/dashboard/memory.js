// The adapter memory table: each replica's device slab and host tier, from /v1/stats.

import { DASH, bytes, el, fillTable, isNumber, num } from "./dom.js";

/** "used of total" with a meter, or the bytes used alone where there is no total. */
function held(label, used, total) {
  const shown = isNumber(total) ? `${bytes(used)} of ${bytes(total)}` : `${bytes(used)} (no byte budget)`;
  if (!isNumber(total) || total <= 0) return el("td", { class: "num" }, shown);
  return el("td", { class: "num" },
    el("meter", { min: 0, max: total, value: Math.min(used ?? 0, total), high: total * 0.9,
      "aria-label": `${label}: ${shown}` }),
    ` ${shown}`);
}

const rate = (x) => (isNumber(x) ? `${num(x, 2)}/s` : DASH);

/** One row: a replica's figures, or their sum over every replica (`name` "All"). */
function row(name, title, slab, host) {
  const pages = `${num(slab.pages_used, 0)} of ${num(slab.pages, 0)}`
    + (isNumber(slab.page_rank) ? ` (${num(slab.page_rank, 0)} rows each)` : "");
  return el("tr", { "data-replica": name, "data-key": name },
    el("th", { scope: "row", title }, name),
    held(`${name} slab`, slab.used_bytes, slab.bytes),
    el("td", { class: "num" }, bytes(slab.free_bytes)),
    el("td", { class: "num" }, pages),
    held(`${name} host tier`, host.used_bytes, host.budget_bytes),
    el("td", { class: "num" }, num(host.entries, 0)),
    el("td", { class: "num" }, rate(slab.loads_per_s)),
    el("td", { class: "num" }, rate(slab.evictions_per_s)),
    el("td", { class: "num" }, rate(host.evictions_per_s)));
}

/** Redraw the table from a /v1/stats answer: replicas r1, r2 ... in its order, then their
 * sum where there are several; replicas that serve no adapters are left out. */
export function drawMemory(table, stats) {
  const replicas = (stats.replicas ?? []).map((r, i) => ({ ...r, name: `r${i + 1}` }))
    .filter((r) => r.slab && r.host_tier);
  const rows = replicas.map((r) => row(r.name, r.replica, r.slab, r.host_tier));
  const s = stats.summary ?? {};
  if (replicas.length > 1 && s.slab && s.host_tier) rows.push(row("All", "every replica", s.slab, s.host_tier));
  fillTable(table, rows, "No replica serves adapters.");
}
