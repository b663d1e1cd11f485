// The console's calls: its session (/console/api/session) and the REST API through the
// console's proxy (/console/api/v1/...), which adds the session's key server-side.

export type Who = { organization: string; role: string; keyId: string; keyName?: string; csrfToken: string; expiresAt: string };

let csrf = "";

export class APIError extends Error {
  constructor(public status: number, message: string, public reason = "") {
    super(message);
  }
}

async function check(res: Response): Promise<Response> {
  if (res.ok) return res;
  let msg = res.statusText, reason = "";
  try {
    const b = await res.json();
    msg = b.message || msg;
    const info = (b.details || []).find((d: any) => d.reason);
    reason = info ? info.reason : "";
  } catch { /* not JSON */ }
  throw new APIError(res.status, msg, reason);
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

export type Sandbox = {
  sandboxId: string;
  displayName?: string;
  spec?: { containers?: { name: string; image: string; command?: string; args?: string[] }[]; tags?: string[]; runtimeClass?: string };
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
