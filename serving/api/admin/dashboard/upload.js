// The upload form: a PEFT folder (or its two files) sent as POST /v1/adapters' multipart.

import { ApiFailure, upload } from "./api.js";

const CONFIG = "adapter_config.json", WEIGHTS = "adapter_model.safetensors";
const NEEDED = [CONFIG, WEIGHTS];
// A speculative-decoding companion rides along when the folder has one.
const DRAFT = [`draft_${CONFIG}`, `draft_${WEIGHTS}`];

/** The adapter's files in a picked folder by name, the shallowest of each name. */
function pickFromFolder(files) {
  const found = {};
  const depth = (f) => (f.webkitRelativePath || f.name).split("/").length;
  for (const file of files) {
    if (![...NEEDED, ...DRAFT].includes(file.name)) continue;
    if (!found[file.name] || depth(file) < depth(found[file.name])) found[file.name] = file;
  }
  return found;
}

/** Wire the form; onUploaded(version) runs after a successful upload. */
export function setupUpload(onUploaded) {
  const form = document.getElementById("upload-form");
  const name = document.getElementById("upload-name");
  const folder = document.getElementById("upload-folder");
  const config = document.getElementById("upload-config");
  const weights = document.getElementById("upload-weights");
  const progress = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");
  const found = document.getElementById("upload-folder-found");
  const say = (text, isError) => {
    status.textContent = text;
    status.classList.toggle("error", isError);
    status.classList.toggle("ok", !isError);
  };

  folder.addEventListener("change", () => {
    const picked = pickFromFolder(folder.files);
    const missing = NEEDED.filter((n) => !picked[n]);
    found.textContent = folder.files.length === 0 ? ""
      : missing.length ? `missing from the folder: ${missing.join(", ")}`
        : `found ${Object.keys(picked).join(", ")}`;
    // A folder named like the adapter is the usual layout: suggest its name.
    const top = folder.files[0]?.webkitRelativePath?.split("/")[0];
    if (!name.value && top) name.value = top;
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    // The two file inputs, when filled, win over what the folder holds.
    const files = { ...pickFromFolder(folder.files) };
    if (config.files[0]) files[CONFIG] = config.files[0];
    if (weights.files[0]) files[WEIGHTS] = weights.files[0];
    const missing = NEEDED.filter((n) => !files[n]);
    if (missing.length) {
      say(`choose a folder holding ${NEEDED.join(" and ")}, or both files (missing: ${missing.join(", ")})`, true);
      return;
    }
    const body = new FormData();
    body.append("name", name.value.trim());
    for (const [field, file] of Object.entries(files)) body.append(field, file, field);
    const submit = document.getElementById("upload-submit");
    submit.disabled = true;
    progress.value = 0;
    say("Uploading\u2026", false);
    try {
      const version = await upload("v1/adapters", body, (fraction) => { progress.value = fraction; });
      const warnings = version.warnings?.length ? ` Warnings: ${version.warnings.join("; ")}` : "";
      say(`Uploaded ${version.name} (version ${String(version.digest).slice(0, 12)}).${warnings}`, false);
      await onUploaded(version);
    } catch (err) {
      if (!(err instanceof ApiFailure)) throw err;
      progress.value = 0;
      say(err.message, true);  // the API's message, word for word
    } finally {
      submit.disabled = false;
    }
  });
}
