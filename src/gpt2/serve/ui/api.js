// What every view of the page shares: an element by id, and the server's API called with the
// page's API key (the playground's Settings), its errors in the server's words.

export const $ = (id) => document.getElementById(id);

export class ServerError extends Error {}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The server's error body (OpenAI's {"error": {"message"}}), or its status line.
export async function failure(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return new ServerError(`${response.status}: ${body.error.message}`);
  } catch (_) { /* not JSON: the status says it */ }
  return new ServerError(`${response.status} ${response.statusText}`);
}

export async function send(path, init) {
  try {
    return await fetch(path, { ...init, headers: headers() });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ServerError(`cannot reach the server: ${e.message}`);
  }
}

export async function call(path, body) {
  const response = await send(path, body === undefined ? {} : { method: "POST", body: JSON.stringify(body) });
  if (!response.ok) throw await failure(response);
  return response.json();
}
