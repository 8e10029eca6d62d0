// The page's entry point: the key form, and the polls that keep each section current.

import { AdaptersTable } from "./adapters.js";
import { ApiFailure, call, forgetKey, storeKey, storedKey } from "./api.js";
import { fillTable } from "./dom.js";
import { drawUsage, refreshBatches } from "./panels.js";
import { drawLive, resetLive } from "./live.js";
import { drawMemory } from "./memory.js";
import { setupUpload } from "./upload.js";

const STATS_MS = 2000, ADAPTERS_MS = 10000, BATCHES_MS = 5000;

const status = document.getElementById("status");
const keyInput = document.getElementById("api-key");
const usagePanel = document.getElementById("usage");
const batchesTable = document.getElementById("batches");
const memoryTable = document.getElementById("memory");

/** Show a line in the page's live region; errors are the API's message as it worded it. */
function report(message, isError) {
  status.textContent = message;
  status.classList.toggle("error", isError);
}

const adapters = new AdaptersTable(document.getElementById("adapters"), report);
let session = 0;  // bumped on every (re)connect, so an old key's polls stop

/** Run task now and every `ms` while this session lasts; a 401 ends the session. */
function poll(task, ms, mine) {
  const tick = async () => {
    if (mine !== session) return;
    if (!document.hidden) {
      try {
        await task();
      } catch (err) {
        if (!(err instanceof ApiFailure)) throw err;
        if (mine !== session) return;
        report(err.message, true);
        if (err.status === 401) {
          session += 1;  // a wrong key stays wrong: stop asking until another is given
          keyInput.focus();
          return;
        }
      }
    }
    if (mine === session) setTimeout(tick, ms);
  };
  tick();
}

function connect() {
  session += 1;
  const mine = session;
  resetLive();
  adapters.clear();
  report(storedKey() ? "Connected with the key given." : "Connected without a key.", false);
  poll(() => adapters.refresh(), ADAPTERS_MS, mine);
  poll(async () => {
    const stats = await call("GET", "v1/stats");
    if (mine !== session) return;
    for (const id of ["window-s", "memory-window-s"]) {
      document.getElementById(id).textContent = String(stats.window_s ?? 30);
    }
    drawLive(stats);
    drawMemory(memoryTable, stats);
    adapters.setStats(stats);
    drawUsage(usagePanel, stats.usage);
  }, STATS_MS, mine);
  poll(() => refreshBatches(batchesTable, report), BATCHES_MS, mine);
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  storeKey(keyInput.value.trim());
  connect();
});

document.getElementById("forget").addEventListener("click", () => {
  forgetKey();
  session += 1;
  keyInput.value = "";
  adapters.clear();
  fillTable(batchesTable, [], "Connect with a key to see its batches.");
  fillTable(memoryTable, [], "Connect with a key to see adapter memory.");
  usagePanel.replaceChildren();
  report("Key forgotten. Give a key, or connect without one on a keyless server.", false);
});

setupUpload(async () => {
  try {
    await adapters.refresh();
  } catch (err) {
    if (!(err instanceof ApiFailure)) throw err;
    report(err.message, true);
  }
});

adapters.clear();
if (storedKey() !== null) {
  keyInput.value = storedKey();
  connect();  // a reload in the same tab carries on with the key given before
} else if (document.documentElement.dataset.keyless === "true") {
  connect();  // the server has no keys: there is nothing to ask for
} else {
  report("Give an API key and press Connect (or connect with none on a keyless server).", false);
}
