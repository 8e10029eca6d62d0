// The batches table (with cancel) and the usage panel against the tenant's limits.

import { ApiFailure, call } from "./api.js";
import { el, fillTable, num, when } from "./dom.js";

// OpenAI batch states that can still change, hence can be cancelled.
const OPEN = new Set(["validating", "in_progress", "finalizing"]);

/** Redraw the batches table from GET /v1/batches; report(message, isError) on a cancel. */
export async function refreshBatches(table, report) {
  const answer = await call("GET", "v1/batches?limit=50");
  const rows = (answer.data ?? []).map((batch) => {
    const counts = batch.request_counts ?? {};
    const total = counts.total ?? 0, done = (counts.completed ?? 0) + (counts.failed ?? 0);
    const cells = [
      el("th", { scope: "row", class: "mono" }, batch.id),
      el("td", {}, batch.status),
      el("td", { class: "progress-cell" },
        el("progress", { max: Math.max(total, 1), value: done, "aria-label": `${batch.id} progress` }),
        ` ${done}/${total}${counts.failed ? ` (${counts.failed} failed)` : ""}`),
      el("td", {}, when(batch.created_at)),
    ];
    const action = el("td");
    if (OPEN.has(batch.status)) {
      const button = el("button", { type: "button", class: "small", "aria-label": `Cancel ${batch.id}` },
        "Cancel");
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          await call("POST", `v1/batches/${encodeURIComponent(batch.id)}/cancel`);
          report(`Cancelling ${batch.id}.`, false);
          await refreshBatches(table, report);
        } catch (err) {
          if (!(err instanceof ApiFailure)) throw err;
          report(err.message, true);
          button.disabled = false;
        }
      });
      action.append(button);
    }
    return el("tr", { "data-batch": batch.id, "data-key": batch.id }, ...cells, action);
  });
  fillTable(table, rows, "No batches.");
}

/** One line of the usage panel: a figure, and a meter when there is a limit to hold it to. */
function usageLine(label, used, limit, unit = "") {
  const shown = `${num(used, 1)}${unit}`;
  const parts = [el("dt", {}, label)];
  if (limit === null || limit === undefined) {
    parts.push(el("dd", {}, `${shown} (no limit)`));
  } else {
    parts.push(el("dd", {},
      el("meter", { min: 0, max: limit, value: Math.min(used ?? 0, limit), high: limit * 0.8,
        "aria-label": `${label}: ${shown} of ${num(limit, 1)}${unit}` }),
      ` ${shown} of ${num(limit, 1)}${unit}`));
  }
  return parts;
}

/** The label of a last-minute figure, naming its window: the rate limiter's sliding 60 s
 * (what the limit holds), or the usage store's whole minutes since `since`. */
function recentLabel(what, minute, name) {
  if (minute.source?.[name] === "limiter") return `${what}, last 60 s`;
  if (minute.since == null) return `${what}, last minute`;
  const since = new Date(minute.since * 1000)
    .toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return `${what} since ${since}`;
}

/** Redraw the usage panel from /v1/stats' `usage` (null for an admin key naming no tenant). */
export function drawUsage(panel, usage) {
  if (!usage) {
    panel.replaceChildren(el("p", { class: "note" },
      "This key names no tenant (an admin key): usage and limits are kept per tenant."));
    return;
  }
  const limits = usage.limits ?? {};
  const minute = usage.last_minute ?? {}, hour = usage.last_hour ?? {};
  panel.replaceChildren(
    el("p", {}, "Tenant ", el("strong", {}, usage.tenant ?? ""), "."),
    el("dl", { class: "usage" },
      ...usageLine(recentLabel("Requests", minute, "requests"), minute.requests,
        limits.requests_per_minute),
      ...usageLine(recentLabel("Tokens", minute, "tokens"), minute.tokens,
        limits.tokens_per_minute),
      ...usageLine("Adapters held", usage.adapters, limits.max_adapters),
      ...usageLine("Adapter storage", usage.adapter_mb, limits.max_adapter_mb, " MB"),
      ...usageLine("Batch requests pending", usage.batch_pending, limits.batch_queued_requests),
      el("dt", {}, "Concurrent requests allowed"),
      el("dd", {}, limits.concurrent_requests == null ? "no limit" : num(limits.concurrent_requests, 0)),
      el("dt", {}, "Last hour"),
      el("dd", {}, `${num(hour.requests, 0)} requests, ${num(hour.tokens, 0)} tokens`)));
}
