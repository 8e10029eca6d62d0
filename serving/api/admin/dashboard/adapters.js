// The adapters table: GET /v1/adapters merged with /v1/stats' figures, with delete.

import { ApiFailure, call } from "./api.js";
import { DASH, ago, bytes, el, fillTable, num } from "./dom.js";

/** Ask yes or no in the confirm dialog; Escape and Cancel both answer no. */
export function confirmDialog(text) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    // A form with method=dialog sets returnValue to the pressed button's value; Escape
    // closes the dialog with the returnValue reset below, which counts as no.
    dialog.returnValue = "no";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-no").focus();
  });
}

/** "r1: slab, r2: host" with replicas numbered in stats' order, or "registry" when none. */
function residency(placed, replicas) {
  const names = (replicas ?? []).map((r) => r.replica);
  const parts = Object.entries(placed ?? {}).map(([replica, where]) => {
    const i = names.indexOf(replica);
    return `${i >= 0 ? `r${i + 1}` : replica}: ${where}`;
  });
  return parts.length ? parts.join(", ") : "registry";
}

/** Whether the key (stats' `key`: its tenant and scope) may delete the adapter: an admin
 * key any, a user key its own tenant's only. Unknown until stats come: no. */
export function manageable(adapter, key) {
  return Boolean(key) && (key.scope === "admin" || adapter.owner === key.tenant);
}

/** One adapter's row; figures from stats where it has them, Delete where the key may. */
function row(adapter, figures, stats, onDelete) {
  const replicaNames = (stats?.replicas ?? []).map((r, i) => `r${i + 1} = ${r.replica}`);
  const cell = (text, attrs = {}) => el("td", attrs, text);
  const action = el("td");
  if (manageable(adapter, stats?.key)) {
    const button = el("button", {
      type: "button", class: "danger small",
      "aria-label": `Delete ${adapter.name}${adapter.owner ? ` of ${adapter.owner}` : ""}`,
    }, "Delete");
    button.addEventListener("click", () => onDelete(adapter));
    action.append(button);
  }
  const key = `${adapter.owner}/${adapter.name}`;
  return el("tr", { "data-adapter": adapter.name, "data-owner": adapter.owner, "data-key": key },
    el("th", { scope: "row" }, adapter.name),
    cell((adapter.digest ?? "").slice(0, 12) || DASH, { class: "mono", title: adapter.version ?? "" }),
    cell(num(adapter.rank, 0), { class: "num" }),
    cell((adapter.variants ?? []).join(", ") || "LoRA", { class: "modules" }),
    cell((adapter.target_modules ?? []).join(", "), { class: "modules" }),
    cell(bytes(adapter.num_bytes), { class: "num" }),
    cell(adapter.owner ?? DASH),
    cell(adapter.public ? "yes" : "no"),
    cell(stats ? residency(figures?.residency, stats.replicas) : DASH,
      { title: replicaNames.join(", ") }),
    cell(stats ? ago(figures?.last_used, stats.time) : DASH),
    cell(num(figures?.requests_1h ?? (stats ? 0 : null), 0), { class: "num" }),
    cell(num(figures?.tokens_1h ?? (stats ? 0 : null), 0), { class: "num" }),
    action);
}

/** The table's state: the last listing and the last stats, either redrawn when it changes. */
export class AdaptersTable {
  constructor(table, report) {
    this.table = table;
    this.report = report;  // (message, isError) to the page's status line
    this.listing = null;
    this.stats = null;
  }

  async refresh() {
    const answer = await call("GET", "v1/adapters");
    this.listing = answer.data ?? [];
    this.draw();
  }

  setStats(stats) {
    this.stats = stats;
    if (this.listing) this.draw();
  }

  clear() {
    this.listing = null;
    this.stats = null;
    fillTable(this.table, [], "Connect with a key to see its adapters.");
  }

  draw() {
    // Not under an open dialog: the button that opened it must be there to take focus back.
    if (document.getElementById("confirm-dialog").open) return;
    const figures = new Map((this.stats?.adapters ?? []).map((a) => [a.adapter, a]));
    const rows = this.listing.map((a) => row(a, figures.get(`${a.owner}/${a.name}`), this.stats,
      (adapter) => this.remove(adapter)));
    fillTable(this.table, rows, "No adapters yet: upload one below.");
  }

  async remove(adapter) {
    const yes = await confirmDialog(`Delete adapter "${adapter.name}" of ${adapter.owner}? `
      + "Requests naming it will fail; its stored versions stay.");
    this.draw();  // what polls brought in while the dialog was open
    if (!yes) return;
    const query = adapter.owner ? `?tenant=${encodeURIComponent(adapter.owner)}` : "";
    try {
      await call("DELETE", `v1/adapters/${encodeURIComponent(adapter.name)}${query}`);
      this.report(`Deleted ${adapter.name}.`, false);
      await this.refresh();
    } catch (err) {
      if (!(err instanceof ApiFailure)) throw err;
      this.report(err.message, true);
    }
  }
}
