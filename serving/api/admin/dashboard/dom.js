// Building elements and formatting figures. Text goes in through textContent only, so an
// adapter name or an error message from the server can never become markup.

/** A new element: attributes set one by one, children appended (strings as text). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const DASH = "\u2014";  // what a figure with no requests behind it shows

/** Whether x is a finite number (null, undefined and NaN are not). */
export function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}

/** x with at most `digits` decimals, or a dash when there is no figure. */
export function num(x, digits = 2) {
  if (!isNumber(x)) return DASH;
  return x.toLocaleString("en", { maximumFractionDigits: digits });
}

/** A ratio in [0, 1] as a percentage, or a dash. */
export function percent(x) {
  return isNumber(x) ? `${(x * 100).toFixed(1)}%` : DASH;
}

/** A count of bytes in B, KiB, MiB or GiB. */
export function bytes(n) {
  if (!isNumber(n)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/** How long ago the minute starting at `then` was (usage is kept by the minute), both in
 * epoch seconds of the server's clock. */
export function ago(then, now) {
  if (!isNumber(then)) return "never";
  const s = Math.max(0, Math.round(now - then));
  if (s < 60) return "this minute";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** Epoch seconds as the viewer's local date and time. */
export function when(seconds) {
  return isNumber(seconds) ? new Date(seconds * 1000).toLocaleString() : DASH;
}

/**
 * Replace the rows of a table's body with `rows` (or one row saying `empty`), unless they
 * are the same. Polls redraw tables every few seconds: a keyboard user's focus on a row's
 * button moves to the same button of the new row (rows carry a unique data-key).
 */
export function fillTable(table, rows, empty) {
  const body = table.tBodies[0];
  const columns = table.tHead.rows[0].cells.length;
  if (rows.length === 0) rows = [el("tr", {}, el("td", { colspan: columns, class: "empty" }, empty))];
  if (rows.map((r) => r.outerHTML).join("") === body.innerHTML) return;
  const active = document.activeElement;
  const row = body.contains(active) ? active.closest("tr") : null;
  const index = row ? [...row.querySelectorAll("button")].indexOf(active) : -1;
  body.replaceChildren(...rows);
  if (row?.dataset.key && index >= 0) {
    const again = body.querySelector(`tr[data-key="${CSS.escape(row.dataset.key)}"]`);
    again?.querySelectorAll("button")[index]?.focus();
  }
}
