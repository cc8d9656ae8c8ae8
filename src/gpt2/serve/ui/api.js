// What every view of the page shares: an element by id; the server's API called with the page's API
// key (the playground's Settings), its errors in the server's words and an error line to show them in;
// and the pictures' pieces: SVG elements, the colours, the head scores' names.

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

// An error beside what caused it (`where`: the element's id); an empty message hides it.
export function showError(message, where = "error") {
  $(where).textContent = message;
  $(where).hidden = !message;
}

export const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attributes = {}, text = null) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== null && text !== undefined) element.textContent = text;
  return element;
}

// The page's colours: white at 0, dark blue at 1; for -1..1, red for the negative side.
export const INK = [8, 48, 107];
export const colour = (p) => `rgb(${INK.map((c) => Math.round(255 - (255 - c) * p)).join(",")})`;
export const diverging = (x) => {
  const t = Math.max(-1, Math.min(1, x));
  return t >= 0 ? colour(t) : `rgb(255,${Math.round(255 - 200 * -t)},${Math.round(255 - 200 * -t)})`;
};

export const SCORES = { previous_token: "previous-token", duplicate_token: "duplicate-token", induction: "induction" };
export const LOOKS_AT = { previous_token: "the token just before", duplicate_token: "earlier copies of the same token",
                          induction: "the token after an earlier copy" };  // what each score is the mean attention to
