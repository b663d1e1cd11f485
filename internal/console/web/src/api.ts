// The console's calls: its session (/console/api/session) and the REST API through the
// console's proxy (/console/api/v1/...), which adds the session's key server-side.

export type Who = { organization: string; role: string; keyId: string; keyName?: string; csrfToken: string; expiresAt: string };

let csrf = "";

export type Violation = { field: string; description: string };

export class APIError extends Error {
  constructor(public status: number, message: string, public reason = "", public violations: Violation[] = []) {
    super(message);
  }
}

// errText is an error as the console shows it: the API's message and its CWSANDBOX_*
// reason (ErrorInfo), when it has one.
export function errText(e: unknown): string {
  if (e instanceof APIError) return e.reason ? `${e.message} (${e.reason})` : e.message;
  return String(e);
}

// apiError reads a google.rpc.Status JSON body (message, details[].reason).
function apiError(status: number, statusText: string, body: string): APIError {
  let msg = statusText || `HTTP ${status}`, reason = "";
  const violations: Violation[] = [];
  try {
    const b = JSON.parse(body);
    msg = b.message || msg;
    const info = (b.details || []).find((d: any) => d.reason);
    reason = info ? info.reason : "";
    for (const d of b.details || []) {
      for (const v of d.fieldViolations || []) violations.push({ field: String(v.field || ""), description: String(v.description || "") });
    }
  } catch { /* not JSON */ }
  return new APIError(status, msg, reason, violations);
}

// responseError is the API error a failed response carries.
export async function responseError(res: Response): Promise<APIError> {
  return apiError(res.status, res.statusText, await res.text().catch(() => ""));
}

async function check(res: Response): Promise<Response> {
  if (res.ok) return res;
  throw await responseError(res);
}

export async function whoAmI(): Promise<Who | null> {
  const res = await fetch("api/session", { credentials: "same-origin" });
  if (res.status === 401) return null;
  const w: Who = await (await check(res)).json();
  csrf = w.csrfToken;
  return w;
}

export async function signIn(apiKey: string): Promise<Who> {
  const res = await fetch("api/session", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ apiKey }),
  });
  const w: Who = await (await check(res)).json();
  csrf = w.csrfToken;
  return w;
}

export async function signOut(): Promise<void> {
  await fetch("api/session", { method: "DELETE", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
  csrf = "";
}

export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch("api/v1/" + path, {
    method, credentials: "same-origin", headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status === 401 && (await whoAmI().catch(() => null)) === null) {
    location.reload(); // the session ended (expired, signed out elsewhere, key revoked): sign in again
  }
  return (await check(res)).json();
}

// upload sends a JSON body to the API with XMLHttpRequest, which (unlike fetch) reports
// the upload's progress.
export function upload<T = any>(path: string, body: unknown, onProgress: (sent: number, total: number) => void): Promise<T> {
  return new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open("POST", "api/v1/" + path);
    x.setRequestHeader("Accept", "application/json");
    x.setRequestHeader("Content-Type", "application/json");
    x.setRequestHeader("X-CSRF-Token", csrf);
    x.upload.onprogress = (e) => onProgress(e.loaded, e.total);
    x.onload = () => {
      if (x.status >= 200 && x.status < 300) {
        try { resolve(JSON.parse(x.responseText || "{}")); } catch (e) { reject(e); }
      } else reject(apiError(x.status, x.statusText, x.responseText));
    };
    x.onerror = () => reject(new Error("the upload failed (network error)"));
    x.send(JSON.stringify(body));
  });
}

// Base64 of bytes (the JSON form of protobuf bytes) and back.
export function toBase64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

export function fromBase64(s?: string): Uint8Array<ArrayBuffer> {
  const bin = atob((s || "").replace(/-/g, "+").replace(/_/g, "/"));
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export type Sandbox = {
  sandboxId: string;
  displayName?: string;
  spec?: { containers?: { name: string; image: string; command?: string; args?: string[] }[]; tags?: string[]; runtimeClass?: string; volumes?: { name: string; volumeId?: string }[] };
  status?: {
    state?: string; stateReason?: string; createTime?: string; startTime?: string; endTime?: string; runnerId?: string;
    exitCode?: number; containerStatuses?: { name: string; state?: string; exitCode?: number; restartCount?: number }[];
    services?: { name?: string; port?: number; url?: string }[];
    effectiveRuntimeClass?: string;
  };
};

export type Runner = {
  runnerId: string; runnerGroupId?: string; tags?: string[]; healthy?: boolean; isShared?: boolean;
  capabilities?: { maxCpuMillicores?: string; maxMemoryBytes?: string };
  resources?: { availableCpuMillicores?: string; availableMemoryBytes?: string; runningSandboxes?: number };
};

export const states = ["STATE_PENDING", "STATE_CREATING", "STATE_RUNNING", "STATE_PAUSED", "STATE_COMPLETED", "STATE_FAILED", "STATE_TERMINATING", "STATE_TERMINATED"];

export const stateName = (s?: string) => (s || "STATE_UNSPECIFIED").replace("STATE_", "").toLowerCase();

export async function listSandboxes(f: { state?: string; tag?: string; runner?: string; all?: boolean }): Promise<Sandbox[]> {
  const q = new URLSearchParams({ pageSize: "200" });
  if (f.state) q.set("state", f.state);
  if (f.tag) q.append("tags", f.tag);
  if (f.runner) q.append("runnerIds", f.runner);
  if (f.all || (f.state && ["STATE_TERMINATED", "STATE_COMPLETED", "STATE_FAILED"].includes(f.state))) q.set("showTerminated", "true");
  const r = await api<{ sandboxes?: Sandbox[] }>("GET", "sandboxes?" + q.toString());
  return r.sandboxes || [];
}
