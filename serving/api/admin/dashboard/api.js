// Calls to this server's API with the key typed into the page.
// The key lives in sessionStorage: it survives a reload but not the tab, and no other page
// or later visitor of this browser profile can read it.

const STORAGE = "loraserve.key";

/** The key in use: a string ("" for a keyless server), or null before one is given. */
export function storedKey() {
  return sessionStorage.getItem(STORAGE);
}

export function storeKey(key) {
  sessionStorage.setItem(STORAGE, key);
}

export function forgetKey() {
  sessionStorage.removeItem(STORAGE);
}

/** The Authorization header for the key in use; none for a keyless server. */
export function authHeaders() {
  const key = storedKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** An answer other than success, carrying the API's own message word for word. */
export class ApiFailure extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The API's message in an error body (OpenAI or Workers-AI shape), else a plain line. */
export function errorMessage(status, text) {
  try {
    const body = JSON.parse(text);
    if (body?.error?.message) return String(body.error.message);
    if (body?.errors?.[0]?.message) return String(body.errors[0].message);
  } catch {
    // not JSON: a proxy's page, say; fall through to the status line
  }
  return status ? `the server answered HTTP ${status}` : "the server could not be reached";
}

/** The JSON answer of `method path`; throws ApiFailure with the API's message otherwise. */
export async function call(method, path, body = undefined) {
  const headers = { ...authHeaders() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ApiFailure(0, "the server could not be reached");
  }
  const text = await response.text();
  if (!response.ok) throw new ApiFailure(response.status, errorMessage(response.status, text));
  return text ? JSON.parse(text) : null;
}

/**
 * POST a multipart form with XMLHttpRequest, whose upload progress fetch cannot report.
 * onProgress gets the fraction sent; resolves with the JSON answer, or throws ApiFailure.
 */
export function upload(path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable && event.total > 0) onProgress(event.loaded / event.total);
    };
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) {
        onProgress(1);
        resolve(xhr.responseText ? JSON.parse(xhr.responseText) : null);
      } else {
        reject(new ApiFailure(xhr.status, errorMessage(xhr.status, xhr.responseText)));
      }
    };
    xhr.onerror = () => reject(new ApiFailure(0, "the upload could not reach the server"));
    xhr.ontimeout = () => reject(new ApiFailure(0, "the upload timed out"));
    xhr.send(form);
  });
}
